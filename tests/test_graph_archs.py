"""Extraction of models whose layers differ (issue 14, item 4): DeepSeek-V3 (MLA, dense then MoE
with a shared expert), Qwen3-MoE, gpt-oss (sinks, sliding/full), Llama 4 (interleaved dense/MoE,
chunked attention), Gemma 3 (sliding/global, large vocabulary), Qwen3-Next (Gated DeltaNet beside
attention).

Each block's forward FLOPs are checked against a formula written here from the architecture
(2 m n k per GEMM; attention 2 b h P (d_qk + d_v) with P the query-key pairs the project counts:
s^2 for causal attention, counted non-causal, and for a span the same rule, twice what a causal
kernel executes less the diagonal; MoE experts at top-k rows). Sizes are tiny; seq 32, batch 1.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

import autopar  # noqa: E402
from autopar.graph import extract, hf  # noqa: E402

S = 32
TINY = ["hf-tiny-deepseek-v3", "hf-tiny-qwen3-moe", "hf-tiny-gpt-oss", "hf-tiny-llama4",
        "hf-tiny-gemma3", "hf-tiny-qwen3-next"]


@pytest.fixture(scope="module")
def graphs():
    """Each tiny preset built and extracted once for the module: {name: (model, graph)}."""
    cache: dict[str, tuple] = {}

    def get(name):
        if name not in cache:
            model = hf.build(name)
            cache[name] = model, extract(model, S, 1)
        return cache[name]
    return get


def lin(m: int, k: int, n: int) -> int:
    """FLOPs of an [m, k] x [k, n] GEMM (multiply-add = 2)."""
    return 2 * m * k * n


def pairs(s: int, window: int = 0, chunked: bool = False) -> int:
    """Query-key pairs counted for causal attention with a span (2 x executed - s)."""
    if window and window < s:
        if chunked:
            executed = sum(n * (n + 1) // 2 for n in [window] * (s // window) + [s % window])
        else:
            executed = sum(min(i + 1, window) for i in range(s))
        return 2 * executed - s
    return s * s


def attention(c, heads, d_qk, d_v, window=0, chunked=False) -> int:
    return 2 * heads * pairs(S, window, chunked) * (d_qk + d_v)


def gqa(c) -> int:
    """q, k, v, o projections of grouped-query attention."""
    h, d = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    return lin(S, h, q) + 2 * lin(S, h, kv) + lin(S, q, h)


def glu(h, f, rows=None) -> int:
    """Gate, up and down GEMMs of a gated MLP over ``rows`` token rows (default: S)."""
    return 3 * lin(S if rows is None else rows, h, f)


def moe(c, experts, k, f, shared_f=0, gate=False) -> int:
    h = c.hidden_size
    out = lin(S, h, experts) + glu(h, f, rows=S * k)
    if shared_f:
        out += glu(h, shared_f)
    if gate:  # Qwen's sigmoid gate on the shared expert, a [h, 1] linear
        out += lin(S, h, 1)
    return out


def deepseek(c, i) -> int:
    h, heads = c.hidden_size, c.num_attention_heads
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    mla = (lin(S, h, c.q_lora_rank) + lin(S, c.q_lora_rank, heads * qk)
           + lin(S, h, c.kv_lora_rank + c.qk_rope_head_dim)
           + lin(S, c.kv_lora_rank, heads * (c.qk_nope_head_dim + c.v_head_dim))
           + lin(S, heads * c.v_head_dim, h) + attention(c, heads, qk, c.v_head_dim))
    if i < c.first_k_dense_replace:
        return mla + glu(h, c.intermediate_size)
    return mla + moe(c, c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size,
                     c.n_shared_experts * c.moe_intermediate_size)


def qwen3_moe(c, i) -> int:
    d = c.head_dim
    return gqa(c) + attention(c, c.num_attention_heads, d, d) + moe(
        c, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size)


def gpt_oss(c, i) -> int:
    d = c.head_dim
    window = c.sliding_window if c.layer_types[i] == "sliding_attention" else 0
    return gqa(c) + attention(c, c.num_attention_heads, d, d, window) + moe(
        c, c.num_local_experts, c.num_experts_per_tok, c.intermediate_size)


def llama4(c, i) -> int:
    d = c.head_dim
    chunk = c.attention_chunk_size if c.layer_types[i] == "chunked_attention" else 0
    out = gqa(c) + attention(c, c.num_attention_heads, d, d, chunk, chunked=True)
    if i in c.moe_layers:
        return out + moe(c, c.num_local_experts, c.num_experts_per_tok, c.intermediate_size,
                         c.intermediate_size)
    return out + glu(c.hidden_size, c.intermediate_size_mlp)


def gemma3(c, i) -> int:
    d = c.head_dim
    window = c.sliding_window if c.layer_types[i] == "sliding_attention" else 0
    return gqa(c) + attention(c, c.num_attention_heads, d, d, window) + glu(
        c.hidden_size, c.intermediate_size)


#: Gated DeltaNet chunk length of transformers' torch implementation (and of fla's kernel)
GDN_CHUNK = 64


def gated_deltanet(c) -> int:
    """Gated DeltaNet (Yang et al. 2024, arXiv 2412.06464) in its chunked form, as the torch
    implementation executes it: per chunk of C tokens and value head, K K^T and Q K^T (C x C x dk),
    the UT transform applied to V and to K (C x C x dv, C x C x dk), the state read by K and Q and
    its update (C x dk x dv each, three), the intra-chunk attention times V (C x C x dv); plus the
    in/out projections and the depthwise causal conv (kernel K over s + K - 1 positions)."""
    h, kh, vh = c.hidden_size, c.linear_num_key_heads, c.linear_num_value_heads
    dk, dv, k = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim
    key_dim, value_dim = kh * dk, vh * dv
    t = math.ceil(S / GDN_CHUNK) * GDN_CHUNK  # padded to whole chunks
    core = 2 * vh * t * (GDN_CHUNK * (3 * dk + 2 * dv) + 3 * dk * dv)
    conv = 2 * (S + k - 1) * (2 * key_dim + value_dim) * k
    return (lin(S, h, 2 * key_dim + 2 * value_dim) + lin(S, h, 2 * vh) + conv + core
            + lin(S, value_dim, h))


def qwen3_next(c, i) -> int:
    d = c.head_dim
    ffn = moe(c, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
              c.shared_expert_intermediate_size, gate=True)
    if c.layer_types[i] == "linear_attention":
        return gated_deltanet(c) + ffn
    # gated attention: q_proj also produces the output gate (2 x heads x head_dim)
    return gqa(c) + lin(S, c.hidden_size, c.num_attention_heads * d) + attention(
        c, c.num_attention_heads, d, d) + ffn


FORMULA = {"hf-tiny-deepseek-v3": deepseek, "hf-tiny-qwen3-moe": qwen3_moe,
           "hf-tiny-gpt-oss": gpt_oss, "hf-tiny-llama4": llama4, "hf-tiny-gemma3": gemma3,
           "hf-tiny-qwen3-next": qwen3_next}

#: Distinct block kinds each tiny preset has, as lists of block indices sharing a signature.
KINDS = {
    "hf-tiny-deepseek-v3": [[0], [1, 2]],      # dense, MoE
    "hf-tiny-qwen3-moe": [[0, 1]],
    "hf-tiny-gpt-oss": [[0], [1]],             # sliding, full
    "hf-tiny-llama4": [[0, 2], [1], [3]],      # chunked dense, chunked MoE, global MoE (NoPE)
    "hf-tiny-gemma3": [[0, 1], [2]],           # sliding, global
    "hf-tiny-qwen3-next": [[0, 1, 2], [3]],    # Gated DeltaNet, attention
}


@pytest.mark.parametrize("name", TINY)
def test_parameters_sum_over_layers(graphs, name):
    """Every parameter lands in exactly one layer (tied ones in the first that uses them)."""
    model, g = graphs(name)
    total = sum(p.numel() for p in model.parameters())
    assert g.num_parameters == total
    assert sum(layer.num_parameters - layer.shared_parameters for layer in g.layers) == total


@pytest.mark.parametrize("name", TINY)
def test_block_flops_match_formula(graphs, name):
    model, g = graphs(name)
    c = model.config
    for i, block in enumerate(g.blocks):
        want = FORMULA[name](c, i)
        assert block.fwd_flops == pytest.approx(want, rel=0.01), (name, i)


@pytest.mark.parametrize("name", TINY)
def test_layer_kinds_are_distinct_signatures(graphs, name):
    _, g = graphs(name)
    groups: dict[str, list[int]] = {}
    for i, block in enumerate(g.blocks):
        groups.setdefault(block.signature, []).append(i)
    assert sorted(groups.values()) == sorted(KINDS[name])


@pytest.mark.parametrize("name", ["hf-tiny-deepseek-v3", "hf-tiny-qwen3-moe", "hf-tiny-gpt-oss",
                                  "hf-tiny-llama4", "hf-tiny-qwen3-next"])
def test_moe_blocks_count_top_k_experts(graphs, name):
    """Router found with its top-k; the expert GEMMs count tokens x k rows (Llama 4's HF code runs
    every token through every expert with zero scores: counted as the top-k kernel runs it)."""
    model, g = graphs(name)
    c = model.config
    experts = getattr(c, "n_routed_experts", None) or getattr(c, "num_local_experts", None) \
        or c.num_experts
    f = getattr(c, "moe_intermediate_size", None) or c.intermediate_size
    k = c.num_experts_per_tok
    moe_blocks = [b for b in g.blocks if b.num_experts]
    assert moe_blocks and g.num_experts == experts
    for b in moe_blocks:
        assert (b.num_experts, b.experts_per_token) == (experts, k)
        ops = [o for o in b.ops if o.moe_role == "expert"]
        assert [o.tp_role for o in ops] == ["column", "row"]
        assert sum(o.fwd_flops for o in ops) == glu(c.hidden_size, f, rows=S * k)
        assert sum(o.num_parameters for o in ops) == 3 * experts * c.hidden_size * f


def _tiny(name, **overrides):
    """The tiny preset's model with config values replaced, on meta in bf16."""
    import transformers as tf
    preset = hf.HF_PRESETS[name]
    config = getattr(tf, preset.config_class)(
        **dict(preset.config, **overrides), attn_implementation=preset.attn_implementation,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.device("meta"):
        return getattr(tf, preset.model_class)(config).to(torch.bfloat16)


def test_dense_routed_experts_save_top_k_rows():
    """HF Llama 4 multiplies every token by every expert (zero scores for the others); saved
    tensors are counted at the top-k size a grouped-GEMM kernel keeps, so doubling the experts
    (top-1) adds only the router's [tokens, experts] scores (two bf16 tensors), nothing to the
    sharded part (was 4x and 8x the expert activations)."""
    a, b = (extract(_tiny("hf-tiny-llama4", num_local_experts=e), S, 1).blocks[1]
            for e in (4, 8))
    assert b.activations.tp == a.activations.tp
    assert b.activations.seq - a.activations.seq == 2 * S * 4 * 2


def test_mla_latent_projections_replicated_and_saved():
    """MLA: the down-projections to the latents stay whole under TP (a norm follows them), the
    up-projections are column-parallel; the latent is in the saved activations (replicated part):
    widening kv_lora_rank by 8 saves 4 s x 8 bytes more (the projection output, kept for the norm's
    backward, and the normed latent, kept for kv_b_proj's), and nothing in the TP-sharded part."""
    a, b = (extract(_tiny("hf-tiny-deepseek-v3", kv_lora_rank=r), S, 1).blocks[0]
            for r in (16, 24))
    roles = [o.tp_role for o in a.ops if o.kind == "matmul"][:5]
    assert roles == ["", "column", "", "column", "row"]  # q_a, q_b, kv_a, kv_b, o_proj
    assert b.activations.seq - a.activations.seq == 4 * S * 8
    assert b.activations.tp == a.activations.tp


def test_window_convention():
    """A sliding window counts 2 x (s w - w(w-1)/2) - s pairs: Gemma 3's window 16 at s = 32 is
    752 of 1024; the full layer of the same model counts s^2. Mistral's window 64 >= s: full."""
    assert pairs(32, 16) == 752 and pairs(32, 32) == 32 * 32 == pairs(32, 64)
    assert pairs(32, 16, chunked=True) == 2 * 16 * 16


@pytest.mark.parametrize("name", ["hf-tiny-gpt-oss", "hf-tiny-gemma3", "hf-tiny-llama4"])
def test_attention_span_on_the_op(graphs, name):
    model, g = graphs(name)
    c = model.config
    for i, block in enumerate(g.blocks):
        op = next(o for o in block.ops if o.kind == "attention")
        kind = c.layer_types[i]
        window = {"sliding_attention": getattr(c, "sliding_window", 0),
                  "chunked_attention": getattr(c, "attention_chunk_size", 0)}.get(kind, 0)
        assert (op.window, op.chunked, op.causal) == (window, kind == "chunked_attention", True)


def test_gpt_oss_eager_attention_is_one_flash_op(graphs):
    """gpt-oss has no SDPA path (its sinks): the eager softmax(q k^T) v becomes one attention op
    on the KV heads with flash attention's saved tensors; the sinks are the block's parameters."""
    model, g = graphs("hf-tiny-gpt-oss")
    c = model.config
    for block in g.blocks:
        assert [o.kind for o in block.ops].count("attention") == 1
        assert (block.attention_heads, block.kv_heads) == (c.num_attention_heads,
                                                           c.num_key_value_heads)
        # nothing of size s x s is kept: q, k, v, out, lse (core) are all there is of attention
        assert block.activations.core == 4 * c.num_attention_heads * S  # fp32 LSE
    assert sum(o.kind == "matmul" and not o.tp_role and not o.moe_role
               for b in g.blocks for o in b.ops) == 0


def test_gated_deltanet_saves_what_the_fused_kernel_saves(graphs):
    """The torch chunked delta rule pads to 64-token chunks and keeps its intermediates; fla's
    kernel keeps q, k (normalised, with 1/norms), v, g, beta and A per token: the Gated DeltaNet
    block's saved bytes are linear in the tokens (the torch intermediates are sized by the padded
    chunks: s = 32 and 64 both make one 64-token chunk) and no more than twice the attention
    block's (20x before)."""
    model, g = graphs("hf-tiny-qwen3-next")
    a, b = g.blocks[0].activations, extract(model, 2 * S, 1).blocks[0].activations
    assert b.tp == pytest.approx(2 * a.tp, rel=0.01) and b.seq == pytest.approx(2 * a.seq, rel=0.01)
    assert a.total < 2 * g.blocks[3].activations.total  # the attention block's, same MoE


@pytest.mark.parametrize("name", TINY)
def test_optimize_runs(name):
    plan = autopar.optimize(hf.build(name), "1x8xA100-80GB",
                            autopar.TrainingConfig(global_batch_size=16, seq_len=64))
    assert plan.summary()


@pytest.mark.parametrize("wrapped", [False, True])
def test_kernel_call_found_behind_a_wrapper_frame(wrapped):
    """transformers >= 5.25 calls ``torch_chunk_gated_delta_rule`` through the ``kernels``
    package's function wrapper, whose frame is the innermost one of every node inside the call;
    the call is still found (by the innermost line calling it), with its inputs and output."""
    from autopar.graph import aten as A

    def f(x, y):
        return torch.relu(x * y) + 1.0

    gm = torch.fx.symbolic_trace(f)
    call = ('  File "modeling.py", line 801, in forward\n'
            '    out, state = torch_chunk_gated_delta_rule(\n')
    wrapper = ('  File "kernels/_internals/layer/layer.py", line 856, in forward\n'
               '    return func(*args, **kwargs)\n')
    outer = '  File "modeling.py", line 996, in forward\n    h = self.linear_attn(\n'
    nodes = {n.name: n for n in gm.graph.nodes}
    for n in gm.graph.nodes:
        n.meta["val"] = torch.empty(2, 3, device="meta")
        inside = n.name in ("mul", "relu")
        n.meta["stack_trace"] = outer + (call + (wrapper if wrapped else "") if inside else "")
    found = A.kernel_calls(gm.graph, "chunk_gated_delta_rule")
    assert list(found) == [nodes["relu"]]
    c = found[nodes["relu"]]
    assert c.nodes == {nodes["mul"], nodes["relu"]} and c.inputs == (nodes["x"], nodes["y"])
