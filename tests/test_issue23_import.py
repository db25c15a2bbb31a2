"""Issue 23, items 5 and 10: imported Megatron-LM arguments obey Megatron's layer split rules
(megatron/training/arguments.py validate_args, transformer_config.py __post_init__,
transformer_block.py get_num_layers_to_build at d98e8a64); export warnings say per-block
choices in words and counts; the Slurm script has a per-job rendezvous id and asks for CPUs."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

import autopar
from autopar.cli import main
from autopar.errors import AutoparError, InvalidClusterSpec, InvalidParallelConfig
from autopar.frameworks.layersplit import MegatronLayerSplit, layout_chunks
from autopar.io.importers import from_megatron_args
from autopar.models import ModelConfig
from autopar.runtime import to_slurm_script
from autopar.runtime.export.megatron import pipeline_layout
from autopar.runtime.verdict import per_block_text

PP = "--pipeline-model-parallel-size"


# -- item 5: the four cases are refused, with Megatron's rule and a fix that imports --

@pytest.mark.parametrize("args, rule, fix", [
    (f"--num-layers 46 {PP} 4", "arguments.py validate_args",
     "--decoder-first-pipeline-num-layers 11 --decoder-last-pipeline-num-layers 11"),
    (f"--num-layers 60 {PP} 8", "arguments.py validate_args", "pp=6 or pp=10"),
    (f"--num-layers 60 {PP} 8 --virtual-pipeline-model-parallel-size 4",
     "get_num_layers_to_build", "pp=5 or pp=15 and 4 virtual stages"),
    (f"--num-layers 60 {PP} 8 --num-virtual-stages-per-pipeline-rank 4",
     "get_num_layers_to_build",
     "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 8"),
    (f"--num-layers 80 {PP} 16 --virtual-pipeline-model-parallel-size 2",
     "num_layers_per_pipeline_rank % vp_size == 0", "pp=10 or pp=20 and 2 virtual stages"),
    (f"--num-layers 80 {PP} 16 --virtual-pipeline-model-parallel-size 2",
     "each rank's 5 layers", "--num-virtual-stages-per-pipeline-rank 5 or none"),
    (f"--num-layers 60 {PP} 8 --num-layers-per-virtual-pipeline-stage 2",
     "arguments.py validate_args", "pp=6 or pp=10"),
])
def test_megatron_refuses_these_layer_splits_and_so_does_the_import(args, rule, fix):
    with pytest.raises(InvalidParallelConfig) as exc:
        from_megatron_args(args)
    msg = str(exc.value)
    assert rule in msg and fix in msg and "Megatron-LM cannot split" in msg, msg


def _fixes(msg: str) -> list[str]:
    """The Megatron flags a refusal's fix proposes, one string per option."""
    return re.findall(r"(--decoder-first-pipeline-num-layers \d+ "
                      r"--decoder-last-pipeline-num-layers \d+)", msg)


@pytest.mark.parametrize("layers, pp, v", [(46, 4, 1), (60, 8, 1), (60, 8, 4), (126, 8, 1),
                                           (94, 8, 2), (30, 4, 1), (62, 8, 2)])
def test_the_proposed_uneven_split_is_one_megatron_takes(layers, pp, v):
    """The first/last split a refusal proposes imports, holds all layers, and its busiest rank
    holds no more than ceil(layers / pp) rounded up to v layers (what an even split would)."""
    vflag = f" --num-virtual-stages-per-pipeline-rank {v}" if v > 1 else ""
    with pytest.raises(InvalidParallelConfig) as exc:
        from_megatron_args(f"--num-layers {layers} {PP} {pp}{vflag}")
    fixes = _fixes(str(exc.value))
    assert fixes, str(exc.value)
    got = from_megatron_args(f"--num-layers {layers} {PP} {pp}{vflag} {fixes[0]}")
    blocks = got.parallel["stage_blocks"]
    assert len(blocks) == pp * v and sum(blocks) == layers
    per_rank = [sum(blocks[r::pp]) for r in range(pp)]
    assert all(n % v == 0 for n in per_rank)
    assert max(per_rank) <= -(-(-(-layers // pp)) // v) * v


@pytest.mark.parametrize("args, virtual_stages", [
    (f"--num-layers 48 {PP} 4", None),
    (f"--num-layers 80 {PP} 16", None),
    (f"--num-layers 80 {PP} 8 --virtual-pipeline-model-parallel-size 2", 2),
    (f"--num-layers 80 {PP} 8 --num-virtual-stages-per-pipeline-rank 5", 5),
    (f"--num-layers 60 {PP} 5 --num-virtual-stages-per-pipeline-rank 4", 4),
    (f"--num-layers 80 {PP} 2 --num-layers-per-virtual-pipeline-stage 10", 4),
    (f"--num-layers 46 {PP} 1", None),
])
def test_legal_splits_still_import(args, virtual_stages):
    got = from_megatron_args(args)
    assert got.parallel.get("virtual_stages") == virtual_stages
    assert "stage_blocks" not in got.parallel        # even: autopar's own balanced cut


def test_uneven_flags_give_the_stages_megatron_builds():
    """get_num_layers_to_build: first/last ranks hold their layers, middle ranks share the rest;
    each rank's layers split equally over its chunks (chunk c on rank c % pp); the account-for
    flags count the embedding (loss) as a layer of the first (last) chunk."""
    first_last = from_megatron_args(
        f"--num-layers 46 {PP} 4 --decoder-first-pipeline-num-layers 10 "
        "--decoder-last-pipeline-num-layers 12")
    assert first_last.parallel["stage_blocks"] == (10, 12, 12, 12)
    interleaved = from_megatron_args(
        f"--num-layers 60 {PP} 8 --num-virtual-stages-per-pipeline-rank 4 "
        "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 8")
    assert interleaved.parallel["virtual_stages"] == 4
    assert interleaved.parallel["stage_blocks"] == (1,) + (2,) * 7 + ((1,) + (2,) * 7) * 3
    both = from_megatron_args(f"--num-layers 46 {PP} 4 --account-for-embedding-in-pipeline-split"
                              " --account-for-loss-in-pipeline-split")
    assert both.parallel["stage_blocks"] == (11, 12, 12, 11)
    with pytest.raises(InvalidParallelConfig, match="transformer_config.py"):
        from_megatron_args(f"--num-layers 46 {PP} 4 --decoder-first-pipeline-num-layers 11")
    with pytest.raises(InvalidParallelConfig, match="does not combine"):
        from_megatron_args(f"--num-layers 48 {PP} 4 --decoder-first-pipeline-num-layers 12 "
                           "--num-layers-per-virtual-pipeline-stage 3")


@pytest.mark.parametrize("blocks, pp", [((11, 12, 12, 11), 4), ((3, 4, 4, 3, 4, 4, 4, 4), 4),
                                        ((0, 5, 6, 5), 4)])
def test_the_exported_layout_reads_back_as_its_cuts(blocks, pp):
    """autopar's Megatron export writes uneven cuts as --pipeline-model-parallel-layout; the
    import reads them back exactly (and the layout replaces the even-split rule)."""
    args = (f"--num-layers {sum(blocks)} {PP} {pp} --pipeline-model-parallel-layout "
            f"{pipeline_layout(blocks)}")
    got = from_megatron_args(args)
    assert got.parallel["stage_blocks"] == blocks
    assert got.parallel["virtual_stages"] == len(blocks) // pp
    assert layout_chunks("Et*2|(t|)*2,tL") == ["Ett", "t", "t", "tL"]
    with pytest.raises(InvalidParallelConfig, match="decoder layers"):
        from_megatron_args(f"--num-layers {sum(blocks) + 1} {PP} {pp} "
                           f"--pipeline-model-parallel-layout {pipeline_layout(blocks)}")


def test_without_num_layers_the_models_blocks_are_split():
    """No --num-layers: Imported.complete applies the rule to the model's block count, after
    the CLI's overrides (--pp 2 makes 46 blocks legal)."""
    imp = from_megatron_args(f"{PP} 16 --virtual-pipeline-model-parallel-size 2")
    with pytest.raises(InvalidParallelConfig, match="80 decoder layers"):
        imp.complete(128, 80)
    par, _ = imp.complete(128, 80, overrides={"pp": 8})
    assert (par["pp"], par["virtual_stages"]) == (8, 2) and "stage_blocks" not in par
    lazy = from_megatron_args(f"{PP} 4 --num-layers-per-virtual-pipeline-stage 5")
    assert lazy.complete(32, 80)[0]["virtual_stages"] == 4
    with pytest.raises(InvalidParallelConfig):
        lazy.complete(32, 46)


MODEL46 = dict(name="gpt-46l", family="gpt", num_layers=46, hidden_size=256, num_heads=4,
               vocab_size=1024, seq_len=256)


def test_cli_refuses_46_layers_on_pp4_and_takes_the_override(capsys, tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(MODEL46))
    argv = ["estimate", "--model", str(path), "--cluster", "1x8xH100-80GB", "--global-batch",
            "32", "--megatron-args", f"{PP} 4 --micro-batch-size 1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "46 decoder layers" in err and "arguments.py" in err and "Traceback" not in err
    assert main([*argv, "--pp", "2"]) == 0, capsys.readouterr().err


def test_split_record_checks_pp_for_interleaving():
    """arguments.py: interleaving needs pp > 1, and pp > 2 without P2P overlap."""
    with pytest.raises(InvalidParallelConfig, match="pp >= 2"):
        MegatronLayerSplit(virtual_stages=2).chunks(8, 1)
    with pytest.raises(InvalidParallelConfig, match="pp >= 3"):
        MegatronLayerSplit(virtual_stages=2, overlap_p2p=False).chunks(8, 2)
    assert MegatronLayerSplit(virtual_stages=2).chunks(8, 2) == (2, 2, 2, 2)


# -- item 10: export warnings in words and counts -------------------------------------------

MODEL80 = dict(name="tiny80", family="llama", num_layers=80, hidden_size=64, num_heads=4,
               vocab_size=128, seq_len=64)


def test_per_block_text():
    assert per_block_text(("full",) * 60 + ("none",) * 20) == (
        "full on 60 of 80 blocks (0-59), none on 20 (60-79)")
    assert per_block_text(("full",) * 8) == "full on all 8 blocks"
    alternating = per_block_text(("full", "none") * 6)
    assert alternating.startswith("full on 6 of 12 blocks (0, 2, 4, 6, and 2 more runs)")


@pytest.fixture(scope="module")
def mixed_plan():
    """80 blocks, ZeRO-3, full recompute on 60, 60 blocks kept gathered."""
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=64)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1,
                                 recompute=("full",) * 60 + ("none",) * 20,
                                 reshard_after_forward=(True,) * 20 + (False,) * 60)
    e = autopar.estimate(MODEL80, "1x8xA100-80GB", train, cfg)
    return autopar.Plan(config=e.config, estimate=e, model="tiny80", cluster="1x8xA100-80GB",
                        train=train,
                        model_config=dataclasses.asdict(ModelConfig.from_dict(MODEL80)))


@pytest.mark.parametrize("export", ["to_megatron_args", "to_torchtitan_toml",
                                    "to_deepspeed_config"])
def test_export_warnings_have_no_tuple_of_per_block_values(mixed_plan, export):
    ex = getattr(mixed_plan, export)()
    text = "\n".join(ex.warnings)
    # the tuples were printed whole: 80 booleans or mode names
    assert "(True, True" not in text and "('full', 'full'" not in text, text
    assert "full on 60 of 80 blocks (0-59), none on 20 (60-79)" in text
    assert max(len(w) for w in ex.warnings) < 700
    re_estimate = next(w for w in ex.warnings if w.startswith("re-estimated"))
    assert ("kept gathered to backward on 60 (20-79)" in re_estimate
            and "every block resharded after forward" in re_estimate), re_estimate


# -- item 10: the Slurm script --------------------------------------------------------------

@pytest.fixture(scope="module")
def two_node_plan():
    train = autopar.TrainingConfig(global_batch_size=16, seq_len=64)
    cfg = autopar.ParallelConfig(tp=1, pp=1, dp=16, micro_batch_size=1)
    e = autopar.estimate("tiny-llama", "2x8xA100-80GB", train, cfg)
    return autopar.Plan(config=e.config, estimate=e, model="tiny-llama",
                        cluster="2x8xA100-80GB", train=train)


@pytest.mark.parametrize("cluster", ["two nodes", "one node"])
def test_slurm_script_rendezvous_id_is_the_jobs_and_it_asks_for_cpus(two_node_plan, cluster):
    plan = two_node_plan
    if cluster == "one node":
        e = dataclasses.replace(plan.estimate, config=plan.config.replace(dp=8))
        plan = dataclasses.replace(plan, config=plan.config.replace(dp=8), estimate=e)
    text = to_slurm_script(plan).value
    assert "--rdzv-id=$SLURM_JOB_ID" in text and "--rdzv-id=autopar" not in text
    per_node = 8
    assert f"#SBATCH --cpus-per-task={8 * per_node}" in text
    assert "srun --cpus-per-task=$SLURM_CPUS_PER_TASK torchrun" in text
    assert "--standalone" not in text
    assert "#SBATCH --cpus-per-task=112" in to_slurm_script(plan, cpus_per_gpu=14).value
    with pytest.raises(InvalidClusterSpec):
        to_slurm_script(plan, cpus_per_gpu=0)
    assert issubclass(InvalidClusterSpec, AutoparError)


def test_exports_of_a_hugging_face_preset_plan_are_re_estimated():
    # a new user's pass: every export of an hf-* preset's plan said "not re-estimated ... the plan
    # has no model_config"; the preset is rebuilt on meta from its name, as loading the plan does
    pytest.importorskip("transformers")
    plan = autopar.optimize("hf-tiny-mixtral", "1x8xH100",
                            autopar.TrainingConfig(global_batch_size=16, seq_len=32))
    assert plan.model_config is None
    for export in (plan.to_megatron_args(), plan.to_torchtitan_toml(),
                   plan.to_deepspeed_config()):
        assert not any(w.startswith("not re-estimated") for w in export.warnings), export.warnings
        assert any(w.startswith("re-estimated under") for w in export.warnings), export.warnings
        assert export.fits is not None
        # the torchtitan flavor hint listed TransformerModelArgs(dim=None, n_layers=None, ...)
        assert not any("=None" in w for w in export.warnings), export.warnings


def test_fixes_fill_the_cluster_and_num_layers_must_be_the_models(capsys):
    # a new user's pass: 60 layers on pp=8 with tp=8 on 128 GPUs was told "pp=6 or pp=10",
    # neither of which divides the 16 GPUs per tensor-parallel group; and --num-layers 60 on a
    # 96-layer model was checked as 60 layers at import and as 96 when completed
    base = ["estimate", "--model", "gpt-76.1b", "--cluster", "16x8xA100-80GB",
            "--global-batch", "1536", "--megatron-args"]
    assert main([*base, "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8"]) == 2
    err = capsys.readouterr().err
    assert "Fix: --pp 4;" in err and "pp 6" not in err and "pp 10" not in err, err
    imp = from_megatron_args("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 "
                               "--num-layers 60 --decoder-first-pipeline-num-layers 2 "
                               "--decoder-last-pipeline-num-layers 2")
    with pytest.raises(InvalidParallelConfig, match="--num-layers 60 does not match the "
                                                    "model's 96 decoder layers"):
        imp.complete(128, 96)
    assert imp.complete(128, 60)[0]["pp"] == 16


def test_a_torchtitan_toml_with_a_non_integer_degree_says_how_to_fix_it():
    from autopar.io.importers import from_torchtitan_toml

    with pytest.raises(InvalidParallelConfig, match=r"tensor_parallel_degree must be an integer; "
                                                    r"got 'x'\. Fix: write it as a whole number"):
        from_torchtitan_toml('[parallelism]\ntensor_parallel_degree = "x"\n')


def test_block_recompute_imports_as_megatron_runs_it():
    """--recompute-method block --recompute-num-layers N: full recompute of the first N layers
    of every pipeline chunk and none of the rest (transformer_block.py _checkpointed_forward),
    which the megatron profile accepts (recompute_first_n), not full on every block."""
    from autopar.frameworks import get_profile
    from autopar.frameworks.rules import first_n_full
    imp = from_megatron_args(f"--num-layers 8 {PP} 2 --recompute-granularity full "
                             "--recompute-method block --recompute-num-layers 3")
    par, _ = imp.complete(world_size=2, num_blocks=8)
    assert par["recompute"] == ("full",) * 3 + ("none",) + ("full",) * 3 + ("none",)
    assert not any("modelled as full" in n for n in imp.notes)
    assert first_n_full(par["recompute"], (4, 4)) == 3
    # uneven chunks: N applies within each; a chunk shorter than N is recomputed whole
    assert first_n_full(("full", "full", "full", "full", "none"), (2, 3)) == 2
    assert first_n_full(("full", "full", "full", "none", "none"), (2, 3)) is None
    assert first_n_full(("full", "none", "full", "full"), (2, 2)) is None
    assert first_n_full(("none", "full", "full", "none"), (2, 2)) is None
    c = autopar.ParallelConfig(tp=1, pp=2, dp=1, recompute=par["recompute"],
                               stage_blocks=(4, 4))
    assert get_profile("megatron").unsupported(c) is None
    assert "one recompute policy" in get_profile("torchtitan").unsupported(c)
    # a CLI --recompute overrides the file's
    par, _ = imp.complete(world_size=2, num_blocks=8, overrides={"recompute": "selective"})
    assert par["recompute"] == "selective"
    # uniform groups of several layers stay priced as full on every block, said
    imp = from_megatron_args("--recompute-granularity full --recompute-method uniform "
                             "--recompute-num-layers 2")
    assert imp.parallel["recompute"] == "full"
    assert any("modelled as full" in n for n in imp.notes)


def test_an_exported_block_recompute_reads_back_at_the_exports_estimate(capsys, tmp_path):
    """The Megatron export's per-block recompute mix (first N per stage) estimates the same
    when its arguments are fed back to estimate --megatron-args."""
    out = tmp_path / "meg.txt"
    main(["plan", "--model", "llama3-70b", "--cluster", "4x8xH100", "--global-batch", "512",
          "--seq-len", "8192", "--export", "megatron", str(out)])
    text = out.read_text()
    written = re.search(r"re-estimated under megatron.*?: ([0-9.]+) s per step", text)
    if "--recompute-method block" not in text or written is None:
        pytest.skip("this search's plan has no per-block recompute mix to export")
    args = " ".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    capsys.readouterr()
    main(["estimate", "--model", "llama3-70b", "--cluster", "4x8xH100", "--framework",
          "megatron", "--megatron-args", args, "--json"])
    est = json.loads(capsys.readouterr().out)
    assert est["step_time_s"] == pytest.approx(float(written.group(1)), rel=1e-3)


def test_megatron_model_shape_flags_must_describe_the_model(capsys):
    """--hidden-size, --num-attention-heads, --ffn-hidden-size, --num-query-groups (with
    --group-query-attention) and --vocab-size are checked against the model estimated, as
    --num-layers is: another model's arguments are refused, naming the fields."""
    imp = from_megatron_args("--hidden-size 8192 --num-attention-heads 64 --group-query-attention "
                             "--num-query-groups 8 --ffn-hidden-size 28672 --vocab-size 128256")
    assert imp.shape_mismatch(autopar.models.get_config("llama3-70b")) is None
    why = imp.shape_mismatch(autopar.models.get_config("llama3-8b"))
    assert "hidden_size 8192 (the model: 4096)" in why and "Fix:" in why
    assert not any("--hidden-size" in n for n in imp.notes)   # read, not "ignored"
    # without --group-query-attention Megatron-LM does not read --num-query-groups
    assert "num_kv_heads" not in from_megatron_args("--num-query-groups 2").model_shape
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100", "--megatron-args",
                 "--tensor-model-parallel-size 8 --hidden-size 8192"]) == 2
    assert "describe another model: hidden_size 8192" in capsys.readouterr().err
    # the new-user pass of 2026-12-07: --num-layers is named in the same message, not in a
    # second error after the first mismatch is fixed
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "1x8xH100", "--megatron-args",
                 "--num-layers 80 --hidden-size 8192 --tensor-model-parallel-size 8"]) == 2
    assert ("describe another model: num_layers 80 (the model: 32), hidden_size 8192 (the "
            "model: 4096)") in capsys.readouterr().err


def test_a_misspelt_flag_is_named_with_the_flag_meant():
    """The new-user pass of 2026-12-07 (second): ``--pipline-model-parallel-size 4`` was only
    noted as ignored, and the estimate ran at pp 1. A flag close to one the import reads is
    named with that flag; Megatron-LM flags the import does not read stay notes only."""
    imp = from_megatron_args("--tensor-model-parallel-size 8 --pipline-model-parallel-size 4 "
                             "--lr 1e-4 --pipeline-model-parallel-split-rank 2")
    note = next(n for n in imp.notes if n.startswith("ignored"))
    assert "--pipline-model-parallel-size (did you mean --pipeline-model-parallel-size?)" in note
    assert "--lr --pipeline-model-parallel-split-rank" in note   # no guess for these
    assert imp.parallel == {"tp": 8}
