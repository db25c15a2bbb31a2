"""Graph extraction on the built-in models (torch.fx path) and the untraceable-model error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autopar.models as M
from autopar.errors import UntraceableModelError
from autopar.graph import extract

# bytes of a fused norm's fp32 statistics per row (mean and rstd), see kernels.FusedNormMeta
NORM_STATS_BYTES = 8


def standard_training_flops(model: nn.Module, graph, tokens: int) -> float:
    """Narayanan et al. 2021 (arXiv 2104.04473), eq. 3 in per-token form: 6N + 12 L h s per
    token, N the parameters of GEMMs (input embedding tables have no FLOPs unless tied to the
    head), attention counted non-causal, backward = 2 x forward."""
    emb = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    n_gemm = graph.num_parameters - sum(m.weight.numel() for m in emb)
    head = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    if any(head.weight is m.weight for m in emb):
        n_gemm += head.weight.numel()
    return (6 * n_gemm + 12 * graph.num_blocks * graph.hidden_size * graph.seq_len) * tokens


@pytest.mark.parametrize("name", [n for n in M.list_presets()
                                  if not (M.get_config(n).is_moe or M.get_config(n).needs_transformers)])
def test_builtin_params_and_flops(name):
    model = M.build(name)
    seq = 32 if name.startswith("tiny") else 512
    g = extract(model, seq, 1)
    assert g.method == "fx"
    assert g.num_parameters == sum(p.numel() for p in model.parameters())
    ratio = 3 * g.forward_flops / standard_training_flops(model, g, seq)
    assert abs(ratio - 1) < 0.02, ratio
    # backward: GEMMs 2x, flash attention 2.5x (torch's sdpa_backward_flop_count)
    attn = sum(layer.attention_fwd_flops for layer in g.layers)
    assert g.backward_flops == pytest.approx(2 * (g.forward_flops - attn) + 2.5 * attn, rel=1e-6)
    h, s = g.hidden_size, seq
    weights = sum(p.numel() for p in model.layers[0].parameters() if p.dim() >= 2)
    for block in g.blocks:  # per layer and token: 2 N_layer + 4 s h forward
        assert block.fwd_flops == pytest.approx((2 * weights + 4 * s * h) * s, rel=0.01)
    assert len({b.signature for b in g.blocks}) == 1


def test_korthikanti_gpt_activations():
    """Korthikanti et al. 2022 (arXiv 2205.05198) section 4.1: per layer sbh(34 + 5as/h) bytes,
    split 10sbh replicated (seq), 24sbh TP-sharded, 5as^2b attention core (no flash)."""
    s, b = 64, 2
    cfg = M.get_config("tiny-gpt")
    model = M.build(M.ModelConfig.from_dict(  # Korthikanti's 24sbh assumes a 4h-wide MLP
        {**cfg.to_dict(), "ffn_hidden_size": 4 * cfg.hidden_size, "seq_len": s}))
    h, a = cfg.hidden_size, cfg.num_heads
    g = extract(model, s, b, flash_attention=False)
    act = g.blocks[0].activations
    assert act.seq == 10 * s * b * h + 2 * NORM_STATS_BYTES * s * b
    assert act.tp == 24 * s * b * h
    assert act.core == 5 * a * s * s * b
    flash = extract(model, s, b).blocks[0].activations
    assert flash.core == 4 * a * s * b  # fp32 log-sum-exp only


def test_builtin_structure():
    g = extract(M.build("tiny-llama"), 32, 1)
    block = g.blocks[0]
    assert [o.tp_role for o in block.ops if o.kind == "matmul"] == \
        ["column"] * 3 + ["row"] + ["column"] * 2 + ["row"]
    assert (g.attention_heads, g.kv_heads) == (4, 2)
    assert [o.tp_role for o in g.layers[0].ops] == ["vocab"]
    assert any(o.tp_role == "vocab" for o in g.layers[-1].ops)
    assert g.layers[-1].ops[-1].kind == "loss"


class _DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent Python: neither fx nor export can capture it
            return x * 2
        return x


class _Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.gate = _DataDependent()
        self.head = nn.Linear(8, 16)

    def forward(self, input_ids):
        return self.head(self.gate(self.embed(input_ids)))


def test_untraceable_model_names_module_and_fix():
    with torch.device("meta"):
        model = _Untraceable()
    with pytest.raises(UntraceableModelError) as info:
        extract(model, 8, 1)
    message = str(info.value)
    assert "'gate'" in message and "_DataDependent" in message
    assert "x.sum() > 0" in message and "Fix:" in message


class _CastsAndCopies(nn.Module):
    """A block whose code casts to fp32 and back and copies a transposed tensor (fms-style
    position encoding and attention output), between two linears."""

    def __init__(self, h=64):
        super().__init__()
        self.a, self.b = nn.Linear(h, h), nn.Linear(h, h)

    def forward(self, x):
        y = self.a(x)
        z = y.float()                              # a cast kernel: read 2, write 4 per element
        z = z * 2.0
        y = z.type_as(y)                           # back to bf16: read 4 (+ 2 of y), write 2
        y = y.transpose(0, 1).contiguous()         # a layout copy: read 2, write 2
        y = y.contiguous().float()                 # contiguous already: a view; a cast (2, 4)
        y = y.float()                              # fp32 already: a view
        # casts keep the transposed strides (preserve_format): this contiguous copies
        return self.b(y.transpose(0, 1).to(x.dtype).contiguous())


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_CastsAndCopies(), _CastsAndCopies()])
        self.emb = nn.Embedding(100, 64)
        self.head = nn.Linear(64, 100)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_casts_and_layout_copies_are_kernels_not_views():
    """A dtype cast, a ``.contiguous()`` of a non-contiguous tensor and other calls that make a
    new tensor run a copy kernel in eager PyTorch; a cast to the same dtype, a transpose or a
    ``.contiguous()`` of a contiguous tensor move nothing."""
    g = extract(_Stack().to(torch.bfloat16), 16, 2)
    block = g.blocks[0]
    n = 2 * 16 * 64                                # elements of one activation
    copies = [(op.target, op.bytes_read, op.bytes_written) for op in block.ops
              if op.kind == "elementwise" and op.target not in ("mul",)]
    assert copies == [("float", 2 * n, 4 * n), ("type_as", 4 * n + 2 * n, 2 * n),
                      ("contiguous", 2 * n, 2 * n), ("float", 2 * n, 4 * n),
                      ("to", 4 * n, 2 * n), ("contiguous", 2 * n, 2 * n)]
    views = [op.target for op in block.ops if op.kind == "view"]
    assert views.count("transpose") == 2 and views.count("float") == 1
    assert views.count("contiguous") == 1
