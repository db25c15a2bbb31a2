"""Framework profiles: each capability sourced, the search emits only what the framework runs,
plan files written before ``TrainingConfig.framework`` still load, the CLI takes --framework."""

from __future__ import annotations

import json

import pytest

import autopar
from autopar.cli import main
from autopar.config import FRAMEWORKS
from autopar.errors import InvalidTrainingConfig
from autopar.frameworks import PROFILES, FrameworkProfile, get_profile

TINY = autopar.TrainingConfig(global_batch_size=16, seq_len=32)
CLUSTER = autopar.Cluster.custom(1, 8, "A100-80GB")


def test_every_framework_has_a_profile_and_every_capability_a_source():
    assert tuple(PROFILES) == FRAMEWORKS
    assert FRAMEWORKS[:4] == ("torch", "torchtitan", "megatron", "deepspeed")
    for p in PROFILES.values():
        assert set(FrameworkProfile.capability_names()) <= set(p.sources), p.name
        assert all(p.sources[n] for n in FrameworkProfile.capability_names())
    with pytest.raises(InvalidTrainingConfig, match="need sources"):
        FrameworkProfile(**{**{f: getattr(PROFILES["torch"], f) for f in
                               ("name", "version", *FrameworkProfile.capability_names())},
                            "sources": {}})


def test_unknown_framework_is_our_error():
    with pytest.raises(InvalidTrainingConfig, match="framework 'jax'"):
        autopar.TrainingConfig(16, 32, framework="jax")
    with pytest.raises(InvalidTrainingConfig, match="Fix"):
        get_profile("jax")


def test_framework_rules_from_their_sources():
    mega, ds, titan = PROFILES["megatron"], PROFILES["deepspeed"], PROFILES["torchtitan"]
    assert mega.zero_options(tp=8, pp=4, cp=1, ep=1) == (0, 1)      # no FSDP2 with PP
    assert mega.zero_options(tp=8, pp=1, cp=1, ep=1) == (0, 1, 3)
    assert ds.zero_options(tp=1, pp=2, cp=1, ep=1) == (0, 1)        # pipe/engine.py assert
    assert titan.zero_options(tp=2, pp=1, cp=1, ep=1) == (2, 3)     # no DDP beside TP
    c = autopar.ParallelConfig(tp=2, pp=4, dp=2, zero_stage=3, sequence_parallel=True)
    assert "ZeRO-3" in mega.unsupported(c)
    assert mega.unsupported(c.replace(zero_stage=1)) is None
    # --pipeline-model-parallel-layout writes any cut, interleaved chunks included
    assert mega.unsupported(c.replace(
        zero_stage=1, virtual_stages=2, schedule="interleaved-1f1b",
        stage_blocks=(3, 2, 2, 2, 2, 2, 2, 1))) is None
    assert mega.unsupported(c.replace(zero_stage=1, stage_blocks=(4, 3, 5, 4))) is None
    assert "balanced" in ds.unsupported(c.replace(zero_stage=1, sequence_parallel=False,
                                                  stage_blocks=(4, 3, 5, 4)))
    assert "sequence_parallel" in ds.unsupported(c.replace(zero_stage=1))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_search_returns_only_plans_the_framework_runs(framework):
    train = autopar.TrainingConfig(16, 32, framework=framework)
    profile = PROFILES[framework]
    plan = autopar.optimize("tiny-llama", CLUSTER, train, top_k=20)
    for e in (plan.estimate, *plan.alternatives, *plan.pareto):
        assert profile.unsupported(e.config) is None, (framework, e.config)
    assert plan.train.framework == framework


def test_megatron_search_never_returns_zero3_with_pipelining():
    """Forced onto pipelines (pp=2) with ZeRO-3 the fastest for torch, megatron gets ZeRO-1."""
    fixed = {"pp": 2}
    torch_plan = autopar.optimize("tiny-llama", CLUSTER, TINY, fixed=fixed, top_k=30)
    mega = autopar.optimize("tiny-llama", CLUSTER,
                            autopar.TrainingConfig(16, 32, framework="megatron"),
                            fixed=fixed, top_k=30)
    assert any(e.config.zero_stage == 3 for e in (torch_plan.estimate,
                                                   *torch_plan.alternatives))
    for e in (mega.estimate, *mega.alternatives):
        assert e.config.pp == 2 and e.config.zero_stage in (0, 1)
        assert e.config.schedule != "gpipe"
        assert len({*e.config.stage_blocks[1:-1]}) <= 1
    ds = autopar.optimize("tiny-llama", CLUSTER,
                          autopar.TrainingConfig(16, 32, framework="deepspeed"), top_k=30)
    for e in (ds.estimate, *ds.alternatives):
        assert e.config.cp == 1 and (e.config.virtual_stages or 1) == 1
        assert e.config.recompute in ("none", "full")


def test_plan_files_without_framework_still_load(tmp_path):
    # tp pinned within the KV heads: Megatron-Core runs tp above them (each rank gathers its
    # query group), which the torch default this file falls back to does not
    plan = autopar.optimize("tiny-llama", CLUSTER,
                            autopar.TrainingConfig(16, 32, framework="megatron"),
                            fixed={"tp": 2})
    d = json.loads(plan.to_json())
    assert d["train"]["framework"] == "megatron"
    assert autopar.Plan.from_dict(d).train.framework == "megatron"
    del d["train"]["framework"]
    assert autopar.Plan.from_dict(d).train.framework == "torch"


def test_cli_framework_and_export(tmp_path, capsys):
    out = tmp_path / "ds.json"
    rc = main(["plan", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB", "--global-batch",
               "16", "--seq-len", "32", "--framework", "deepspeed", "--json",
               "--export", "deepspeed", str(out)])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["train"]["framework"] == "deepspeed"
    assert data["export"]["file"] == str(out) and data["export"]["fits"] is True
    assert json.loads(out.read_text())["train_batch_size"] == 16
    assert any(w.startswith("re-estimated under deepspeed") for w in data["export"]["warnings"])
    rc = main(["estimate", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB",
               "--global-batch", "16", "--seq-len", "32", "--framework", "megatron", "--pp", "2",
               "--dp", "4", "--zero", "3", "--json"])
    assert rc == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any("megatron does not run ZeRO-3" in w for w in warnings)
    with pytest.raises(SystemExit):   # argparse: invalid choice
        main(["plan", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB", "--framework",
              "jax"])


def test_cli_rejects_unknown_export_target(tmp_path, capsys):
    rc = main(["plan", "--model", "tiny-llama", "--cluster", "1x8xA100-80GB", "--global-batch",
               "16", "--seq-len", "32", "--export", "jax", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "autopar exports to megatron, megatron-bridge, torchtitan, torchtitan-0.2, " \
        "torchtitan-0.3, deepspeed, accelerate-fsdp, accelerate-deepspeed, colossalai" in err


def test_torchtitan_and_megatron_build_only_their_rank_orders():
    """torchtitan (v0.2.2 and 0.3.0 distributed/parallel_dims.py build_mesh: [pp, dp_replicate,
    dp_shard, cp, tp] outermost first) builds tp-cp-dp-pp only; Megatron-LM that and
    tp-cp-pp-dp (--use-tp-pp-dp-mapping); torch (plan.apply) any order. Only dimensions of
    degree > 1 decide."""
    from autopar.runtime.export.common import RANK_ORDERS
    for name in ("torchtitan", "torchtitan-0.3"):
        assert PROFILES[name].placements == (("tp", "cp", "dp", "pp"),)
    assert PROFILES["megatron"].placements == (("tp", "cp", "dp", "pp"), ("tp", "cp", "pp", "dp"))
    assert PROFILES["nemo"].placements == PROFILES["megatron"].placements
    assert PROFILES["torch"].placements == ()
    assert PROFILES["deepspeed"].placements == (("tp", "cp", "dp", "pp"),)   # its topology
    # the exporters' rank orders are the profiles'
    for fw in ("torchtitan", "megatron", "deepspeed"):
        assert tuple(o for o, _ in RANK_ORDERS[fw]) == PROFILES[fw].placements
    c = autopar.ParallelConfig(tp=2, pp=4, dp=2, zero_stage=2, sequence_parallel=True,
                               placement=("tp", "cp", "pp", "dp"))
    why = PROFILES["torchtitan"].unsupported(c)
    assert why.startswith("torchtitan builds its device mesh only in the rank order tp-cp-dp-pp")
    assert "parallel_dims.py" in why and "not placement tp-cp-pp-dp (its tp-pp-dp" in why
    assert "fix: placement=('tp', 'cp', 'dp', 'pp') (--placement tp,cp,dp,pp)" in why
    assert "torchtitan-0.3 builds" in PROFILES["torchtitan-0.3"].unsupported(c)
    assert PROFILES["megatron"].unsupported(c.replace(zero_stage=1)) is None
    assert PROFILES["torch"].unsupported(c) is None
    # degree-1 dimensions do not decide: with pp = 1, tp-cp-pp-dp is tp-dp, torchtitan's order
    assert PROFILES["torchtitan"].unsupported(c.replace(pp=1, dp=8)) is None
    # CP beside TP only in Megatron: tp-dp-cp-pp with cp > 1 is refused
    cp = autopar.ParallelConfig(tp=2, cp=2, pp=2, dp=2, zero_stage=1, sequence_parallel=True,
                                placement=("tp", "dp", "cp", "pp"))
    assert "megatron builds its device mesh only in the rank order tp-cp-dp-pp or " \
           "tp-cp-pp-dp" in PROFILES["megatron"].unsupported(cp)


def test_search_tries_only_the_placements_the_framework_builds():
    from autopar.search import space
    base = dict(tp=2, cp=2, pp=2, dp=2)
    assert len(space.placements(base, {})) == 6          # torch: tp innermost, any other order
    assert space.placements(base, {}, PROFILES["torchtitan"]) == [("tp", "cp", "dp", "pp")]
    assert space.placements(base, {}, PROFILES["megatron"]) == [("tp", "cp", "dp", "pp"),
                                                                ("tp", "cp", "pp", "dp")]
    # cp = 1: tp-dp-pp and tp-pp-dp for torch and Megatron, tp-dp-pp for torchtitan
    assert len(space.placements({**base, "cp": 1}, {}, PROFILES["megatron"])) == 2
    assert space.placements({**base, "cp": 1}, {}, PROFILES["torchtitan-0.3"]) == [
        ("tp", "cp", "dp", "pp")]


def test_torchtitan_search_keeps_pipeline_stages_outermost():
    """llama3-8b, tp=2 pp=4 dp=2 pinned on 2x8 H100: torch's fastest puts the pipeline inside a
    node and dp across the two (tp-cp-pp-dp, 2.086 s); torchtitan, which builds only
    tp-cp-dp-pp, gets that order (2.106 s; before this rule its search returned tp-cp-pp-dp,
    which its exporter then rewrote); a pinned tp-cp-pp-dp is refused at once. (2.065 and
    2.104 s before the Hopper GEMMs' second wave beside the DP collectives.)"""
    pytest.importorskip("transformers")
    fixed = {"tp": 2, "pp": 4, "dp": 2}
    cluster = autopar.Cluster.from_spec("2x8xH100")
    plans = {fw: autopar.optimize("llama3-8b", cluster, autopar.TrainingConfig(
        64, 4096, framework=fw), fixed=fixed, top_k=5, objective="fastest")
        for fw in ("torch", "torchtitan")}
    assert plans["torch"].config.placement == ("tp", "cp", "pp", "dp")
    assert plans["torch"].estimate.step_time_s == pytest.approx(2.086, abs=2e-3)
    titan = plans["torchtitan"]
    assert titan.estimate.step_time_s == pytest.approx(2.106, abs=2e-3)
    for e in (titan.estimate, *titan.alternatives, *titan.pareto):
        assert e.config.placement == ("tp", "cp", "dp", "pp"), e.config
    with pytest.raises(autopar.errors.InvalidParallelConfig,
                       match=r"cannot run under torchtitan: torchtitan builds its device mesh "
                             r"only in the rank order tp-cp-dp-pp"):
        autopar.optimize("llama3-8b", cluster, autopar.TrainingConfig(
            64, 4096, framework="torchtitan"),
            fixed={**fixed, "placement": ("tp", "cp", "pp", "dp")})
