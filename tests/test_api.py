"""The main job end to end: optimize/estimate on presets, dicts and user modules; Plan JSON."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autopar
from autopar.io.planfile import PLAN_VERSION
from autopar.models import get_config, list_presets


def _cluster_for(params: float) -> str:
    """Smallest multiple of 8 A100-80GB GPUs whose memory holds 16 bytes per parameter twice."""
    gpus = max(8, math.ceil(2 * 16 * params / 80e9 / 8) * 8)
    return f"{gpus}xA100-80GB"


@pytest.mark.parametrize("name", [n for n in list_presets()
                                  if not (get_config(n).is_moe or get_config(n).needs_transformers)])
def test_optimize_every_preset(name):
    cfg = get_config(name)
    h, L, V, f = cfg.hidden_size, cfg.num_layers, cfg.vocab_size, cfg.ffn_hidden_size
    approx = L * (4 * h * h + 3 * h * f) + 2 * V * h
    spec = _cluster_for(approx)
    cluster = autopar.Cluster.from_spec(spec)
    train = autopar.TrainingConfig(global_batch_size=cluster.world_size * 2, seq_len=cfg.seq_len)
    plan = autopar.optimize(name, cluster, train, time_limit_s=20)
    c = plan.config
    assert c.tp * c.pp * c.dp * c.cp == cluster.world_size
    assert plan.estimate.fits
    assert plan.estimate.memory_per_gpu_bytes <= cluster.device.visible_memory_bytes
    assert plan.estimate.step_time_s > 0
    assert 0 < plan.estimate.mfu < 1


def test_llama2_70b_readme_example():
    train = autopar.TrainingConfig(global_batch_size=1024, seq_len=4096)
    plan = autopar.optimize("llama2-70b", "4x8xA100-80GB", train)
    c = plan.config
    assert c.tp * c.pp * c.dp * c.cp == 32
    assert plan.estimate.fits
    text = plan.summary()
    assert "llama2-70b" in text and "MFU" in text and "memory per GPU" in text
    # the plan is faster than a hand-tuned Megatron-style layout under the same model
    hand = autopar.estimate("llama2-70b", "4x8xA100-80GB", train,
                            autopar.ParallelConfig(tp=8, pp=4, recompute="full"))
    assert plan.estimate.step_time_s <= hand.step_time_s


class _Attn(nn.Module):
    def __init__(self, h, a):
        super().__init__()
        self.a = a
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=-1)
        q = q.view(b, t, self.a, h // self.a).transpose(1, 2)
        k = k.view(b, t, self.a, h // self.a).transpose(1, 2)
        v = v.view(b, t, self.a, h // self.a).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(b, t, h))


class _Block(nn.Module):
    def __init__(self, h, a):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.attn = _Attn(h, a)
        self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class UserGPT(nn.Module):
    """A model nobody in autopar wrote: fused QKV, different names."""

    def __init__(self, layers=6, h=512, a=8, vocab=8000):
        super().__init__()
        self.tok = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(_Block(h, a) for _ in range(layers))
        self.ln = nn.LayerNorm(h)
        self.out = nn.Linear(h, vocab, bias=False)

    def forward(self, ids):
        x = self.tok(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.out(self.ln(x))


def test_optimize_user_module_on_meta():
    with torch.device("meta"):
        model = UserGPT()
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=1024)
    plan = autopar.optimize(model, "1x8xA100-80GB", train)
    c = plan.config
    assert c.tp * c.pp * c.dp * c.cp == 8
    assert plan.estimate.fits
    assert plan.model == "UserGPT"
    # the user's model is untouched
    assert all(p.device.type == "meta" for p in model.parameters())


def test_model_dict_like_published_plans():
    rec = {"name": "GPT-1.7B", "family": "gpt", "num_layers": 24, "hidden_size": 2304,
           "num_heads": 24, "num_kv_heads": 24, "ffn_hidden_size": 9216, "vocab_size": 51200,
           "seq_len": 2048, "tied_embeddings": True, "mlp": "gelu", "norm": "layernorm"}
    train = autopar.TrainingConfig(global_batch_size=512, seq_len=2048)
    est = autopar.estimate(rec, "4x8xA100-80GB", train,
                           autopar.ParallelConfig(tp=1, pp=1, recompute="full"))
    assert est.config.dp == 32
    assert est.fits and est.step_time_s > 0


def test_fixed_choices_are_kept():
    train = autopar.TrainingConfig(global_batch_size=256, seq_len=4096)
    plan = autopar.optimize("llama2-13b", "2x8xA100-80GB", train,
                            fixed={"tp": 8, "recompute": "selective"})
    assert plan.config.tp == 8 and plan.config.recompute == "selective"


def test_plan_json_round_trip(tmp_path):
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=2048)
    plan = autopar.optimize("llama2-7b", "1x8xA100-80GB", train)
    path = tmp_path / "plan.json"
    text = plan.to_json(path)
    loaded = autopar.Plan.from_json(path)
    assert loaded.to_json() == text
    assert loaded.config == plan.config
    assert loaded.estimate.step_time_s == plan.estimate.step_time_s
    data = json.loads(text)
    assert data["format"] == "autopar-plan" and data["version"] == PLAN_VERSION


def test_plan_json_is_deterministic():
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=2048)
    a = autopar.optimize("llama2-7b", "2x8xA100-80GB", train).to_json()
    b = autopar.optimize("llama2-7b", "2x8xA100-80GB", train).to_json()
    assert a == b


def test_infeasible_explains_itself():
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=4096)
    with pytest.raises(autopar.InfeasibleError, match=r"at least \d+ GPUs"):
        autopar.optimize("llama2-70b", "1x8xA100-40GB", train)


def test_bad_inputs_raise_our_errors():
    with pytest.raises(autopar.InvalidClusterSpec):
        autopar.optimize("llama2-7b", "4x8xB9000")
    with pytest.raises(autopar.InvalidModelConfig):
        autopar.optimize("llama9-7b", "1x8xA100")
    with pytest.raises(autopar.InvalidTrainingConfig):
        autopar.TrainingConfig(global_batch_size=0, seq_len=128)
    with pytest.raises(autopar.InvalidParallelConfig):
        autopar.estimate("llama2-7b", "1x8xA100", autopar.TrainingConfig(64, 2048),
                         autopar.ParallelConfig(tp=3))
    with pytest.raises(autopar.InvalidParallelConfig):
        autopar.optimize("llama2-7b", "1x8xA100", autopar.TrainingConfig(64, 2048),
                         fixed={"tensor": 2})
    with pytest.raises(autopar.InvalidPlanFile):
        autopar.Plan.from_json('{"format": "autopar-plan", "version": 99}')


def test_cli_plan_and_estimate(capsys):
    from autopar.cli import main

    assert main(["plan", "--model", "llama2-7b", "--cluster", "1x8xA100-80GB",
                 "--global-batch", "64", "--seq-len", "2048"]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "parallelism" in out
    assert main(["estimate", "--model", "llama2-7b", "--cluster", "1x8xA100-80GB",
                 "--global-batch", "64", "--seq-len", "2048", "--tp", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["tp"] == 2 and data["config"]["dp"] == 4
    assert main(["plan", "--model", "llama2-7b", "--cluster", "9x9xZ100"]) == 2


@pytest.mark.parametrize("model, seq, expect", [
    ("llama2-7b", 8192, "rotary positions run past them"),
    ("gpt3-175b", 4096, "costed with 4096 rows"),
])
def test_sequence_beyond_the_models_positions_is_warned(model, seq, expect):
    # a preset trained at 4096 (2048) positions, asked for more: said, not silently costed
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=seq)
    e = autopar.estimate(model, "4x8xA100-80GB", train,
                         autopar.ParallelConfig(tp=8, pp=4, recompute="full"))
    assert any(expect in w and f"seq_len {seq}" in w for w in e.warnings), e.warnings
    inside = autopar.estimate(model, "4x8xA100-80GB",
                              dataclasses.replace(train, seq_len=2048),
                              autopar.ParallelConfig(tp=8, pp=4, recompute="full"))
    assert not any("positions" in w for w in inside.warnings)


def test_default_batch_follows_the_sequence_asked_for():
    # the default global batch was worked out at the model's length, not --seq-len's:
    # llama2-7b at 100000 tokens planned 1024 sequences (102M tokens a step)
    from autopar.api import DEFAULT_TOKENS_PER_STEP, default_training
    cluster = autopar.Cluster.from_spec("1x8xA100-80GB")
    for seq in (1024, 100_000):
        tr = default_training(get_config("llama2-7b"), cluster, seq_len=seq)
        assert tr.seq_len == seq
        assert DEFAULT_TOKENS_PER_STEP <= tr.global_batch_size * seq \
            < DEFAULT_TOKENS_PER_STEP + 8 * seq
    # a Hugging Face preset: its positions (capped), not 2048
    pytest.importorskip("transformers")
    assert default_training(None, cluster, model="hf-tiny-llama").seq_len == 128
    assert default_training(None, cluster, model="hf-deepseek-v3").seq_len == 8192


def test_a_training_dict_may_leave_out_the_batch_or_the_length():
    # the new-user pass: the CLI defaults --seq-len to the model's, a dict raised "needs seq_len"
    cluster = autopar.Cluster.from_spec("1x8xA100-80GB")
    cfg = {"tp": 1, "pp": 1, "dp": 8}
    e = autopar.estimate("tiny-llama", cluster, {"global_batch_size": 16}, cfg)
    default = autopar.api.default_training(autopar.models.get_config("tiny-llama"), cluster)
    assert e.step_time_s > 0
    e2 = autopar.estimate("tiny-llama", cluster, {"global_batch_size": 16,
                                                   "seq_len": default.seq_len}, cfg)
    assert e == e2
    e3 = autopar.estimate("tiny-llama", cluster, {"seq_len": 32}, cfg)
    assert e3.step_time_s > 0


def test_sequence_parallel_at_tp_1_is_refused_not_dropped():
    # the new-user pass of 2026-12-07: ParallelConfig(tp=1, sequence_parallel=True) was
    # estimated with SP off and nothing said (the CLI notes that --sp at --tp 1 is ignored)
    cluster, train = "1x8xA100-80GB", {"global_batch_size": 16, "seq_len": 32}
    for config in (autopar.ParallelConfig(tp=1, sequence_parallel=True),
                   {"tp": 1, "sequence_parallel": True}, {"sequence_parallel": True}):
        with pytest.raises(autopar.errors.InvalidParallelConfig,
                           match=r"sequence_parallel=True at tp=1, but sequence parallelism "
                                 r".*needs tp > 1.*Fix: sequence_parallel=False"):
            autopar.estimate("tiny-llama", cluster, train, config)
    with pytest.raises(autopar.errors.InvalidParallelConfig, match=r"^fixed asks for "):
        autopar.optimize("tiny-llama", cluster, train,
                         fixed={"tp": 1, "sequence_parallel": True})
    # the config itself still reads as SP off (equal, same hash), and what the rule allows runs
    assert autopar.ParallelConfig(tp=1, sequence_parallel=True) == autopar.ParallelConfig(tp=1)
    assert autopar.estimate("tiny-llama", cluster, train,
                            autopar.ParallelConfig(tp=2, sequence_parallel=True)
                            ).config.sequence_parallel
    plan = autopar.optimize("tiny-llama", cluster, train, fixed={"sequence_parallel": True})
    assert plan.config.sequence_parallel == (plan.config.tp > 1)
    # a searched plan's config (tp=1 here) is estimated again without the refusal
    assert autopar.estimate("tiny-llama", cluster, train, plan.config) == plan.estimate


def test_two_different_micro_batch_sizes_are_refused_not_one_dropped():
    # the new-user pass of 2026-12-07: TrainingConfig(micro_batch_size=2) with
    # ParallelConfig(micro_batch_size=4) (or fixed={"micro_batch_size": 4}) used 4, silently
    cluster = "1x8xA100-80GB"
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=32, micro_batch_size=2)
    with pytest.raises(autopar.errors.InvalidParallelConfig,
                       match=r"two micro-batch sizes: TrainingConfig.micro_batch_size=2 and the "
                             r"config's micro_batch_size=4.*Fix: set it in one place"):
        autopar.estimate("tiny-llama", cluster, train, {"micro_batch_size": 4})
    with pytest.raises(autopar.errors.InvalidParallelConfig, match=r"and fixed= micro_batch"):
        autopar.optimize("tiny-llama", cluster, train, fixed={"micro_batch_size": 4})
    # one place, or the same value twice, is fine
    assert autopar.estimate("tiny-llama", cluster, train, {}).config.micro_batch_size == 2
    assert autopar.estimate("tiny-llama", cluster, train,
                            {"micro_batch_size": 2}).config.micro_batch_size == 2
