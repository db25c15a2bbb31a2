"""Graph extraction of Hugging Face transformers models (torch.export path), small and full size."""

from __future__ import annotations

import pytest
from torch import nn

pytest.importorskip("transformers")

import autopar  # noqa: E402
import autopar.models as M  # noqa: E402
from autopar.graph import hf  # noqa: E402
from autopar.graph import extract  # noqa: E402

SIX = ["llama3-8b", "mistral-7b", "qwen2-7b", "gpt2", "gpt-neox-20b", "mixtral-8x7b"]
TINY = {"llama3-8b": "hf-tiny-llama", "mistral-7b": "hf-tiny-mistral", "qwen2-7b": "hf-tiny-qwen2",
        "gpt2": "hf-tiny-gpt2", "gpt-neox-20b": "hf-tiny-gpt-neox",
        "mixtral-8x7b": "hf-tiny-mixtral"}
PRESETS = [f"hf-{n}" for n in SIX] + ["hf-llama3-405b"] + list(TINY.values())


def active_gemm_params(model: nn.Module, num_blocks: int) -> int:
    """Parameters a token's GEMMs read: all, less input embedding tables (lookups, unless tied to
    the head) and, for MoE, the experts a token is not routed to (Mixtral: 3 h ffn each)."""
    cfg = model.config
    n = sum(p.numel() for p in model.parameters())
    emb = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    n -= sum(m.weight.numel() for m in emb)
    if model.get_output_embeddings().weight is model.get_input_embeddings().weight:
        n += model.get_input_embeddings().weight.numel()
    experts = getattr(cfg, "num_local_experts", 0)
    if experts:
        n -= num_blocks * (experts - cfg.num_experts_per_tok) * 3 * cfg.hidden_size \
            * cfg.intermediate_size
    return n


@pytest.fixture(scope="module", params=PRESETS)
def extracted(request):
    model = hf.build(request.param)
    seq = 32 if "tiny" in request.param else 256
    return request.param, model, extract(model, seq, 1)


def test_params_and_standard_flops(extracted):
    """6N + 12 L h s per token (Narayanan et al. 2021), N the active GEMM parameters, attention
    non-causal, backward = 2 x forward; the graph's own backward counts flash attention's 2.5x."""
    name, model, g = extracted
    assert g.method == "export"
    assert g.num_parameters == sum(p.numel() for p in model.parameters())
    s, L, h = g.seq_len, g.num_blocks, g.hidden_size
    standard = (6 * active_gemm_params(model, L) + 12 * L * h * s) * s
    assert abs(3 * g.forward_flops / standard - 1) < 0.02
    flash = standard + 2 * L * h * s * s  # FlashAttention-2 backward recomputes QK^T
    assert abs((g.forward_flops + g.backward_flops) / flash - 1) < 0.02
    per_layer = [b.fwd_flops + b.bwd_flops for b in g.blocks]
    assert len(set(per_layer)) == 1 and len({b.signature for b in g.blocks}) == 1
    assert L == model.config.num_hidden_layers
    assert abs(sum(per_layer) / (flash - 6 * g.layers[-1].num_parameters * s) - 1) < 0.02


def test_shardable_structure(extracted):
    name, model, g = extracted
    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", getattr(cfg, "n_head", 0))
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    assert (g.attention_heads, g.kv_heads) == (heads, kv)
    block = g.blocks[0]
    roles = [o.tp_role for o in block.ops if o.tp_role]
    assert roles.count("row") == 2 and roles[-1] == "row"  # attention out, MLP down
    assert "vocab" not in roles
    assert any(o.tp_role == "vocab" for o in g.layers[0].ops)
    assert any(o.tp_role == "vocab" for o in g.layers[-1].ops)
    assert g.layers[-1].ops[-1].kind == "loss"
    assert [o.kind for o in block.ops].count("attention") == 1
    assert [o.kind for o in block.ops].count("norm") == 2
    if getattr(cfg, "num_local_experts", 0):
        assert (block.num_experts, block.experts_per_token) == (
            cfg.num_local_experts, cfg.num_experts_per_tok)
        assert [o.moe_role for o in block.ops if o.moe_role] == ["router", "expert", "expert"]


def test_activations_match_builtin_llama():
    """Same Llama config: HF through torch.export and the built-in through torch.fx agree."""
    seq = 32  # the built-in tiny-llama's RoPE table length
    ours = extract(M.build("tiny-llama"), seq, 1)
    theirs = extract(hf.build("hf-tiny-llama"), seq, 1)
    a, b = ours.blocks[0], theirs.blocks[0]
    assert b.fwd_flops == a.fwd_flops and b.bwd_flops == a.bwd_flops
    assert b.activations.tp == a.activations.tp and b.activations.core == a.activations.core
    # HF passes the RoPE cos/sin tables into every block (the built-in keeps them as buffers)
    rope = 2 * seq * (64 // 4) * 2
    assert b.activations.seq == a.activations.seq + rope
    assert b.tp_row_outputs == a.tp_row_outputs and b.tp_column_inputs == a.tp_column_inputs


def test_gpt2_korthikanti():
    """HF GPT-2 (LayerNorm, GELU, dropout 0.1): 10sbh + norm stats replicated, 24sbh sharded."""
    s = 32
    g = extract(hf.build("hf-tiny-gpt2"), s, 1)
    act, h = g.blocks[0].activations, g.hidden_size
    assert act.seq == 10 * s * h + 2 * 8 * s and act.tp == 24 * s * h


@pytest.mark.parametrize("name", list(TINY.values()))
def test_optimize_runs(name):
    plan = autopar.optimize(hf.build(name), "1x8xA100-80GB",
                            autopar.TrainingConfig(global_batch_size=64, seq_len=2048))
    assert plan.summary()


def test_unknown_preset():
    with pytest.raises(autopar.errors.InvalidModelConfig):
        hf.build("hf-nope")


def test_model_is_restored():
    model = hf.build("hf-tiny-llama")
    before = list(model.model.layers)
    extract(model, 16, 1)
    assert list(model.model.layers) == before and all(p.is_meta for p in model.parameters())
