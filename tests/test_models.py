"""Tests of autopar.models: configs, presets, parameter counts, tracing and real CPU runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.fx
import torch.nn.functional as F

from autopar.errors import InvalidModelConfig
from autopar.models import PRESETS, ModelConfig, Transformer, build, get_config, list_presets
from autopar.models.transformer import MLP, Attention, Block, RMSNorm, SwiGLU

PLANS_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_plans.json"
NARAYANAN = ["gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b", "gpt-39.1b", "gpt-76.1b",
             "gpt-145.6b", "gpt-310.1b", "gpt-529.6b", "gpt-1008b"]
LLAMAS = ["llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b"]


def _plans() -> list[dict]:
    return json.loads(PLANS_PATH.read_text())


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() counts a tied weight once


def gpt_formula(c: ModelConfig) -> int:
    """Per layer: q,k,v,o weights+biases 4h^2+4h, fc1/fc2 2hf+f+h, two LayerNorms 4h.

    With f = 4h that is 12h^2 + 13h (Narayanan et al. 2021); plus (V + s)h embeddings and the final
    LayerNorm's 2h, which the paper's formula leaves out.
    """
    L, h, V, s = c.num_layers, c.hidden_size, c.vocab_size, c.seq_len
    assert c.ffn_hidden_size == 4 * h and c.tied_embeddings
    return 12 * L * h * h + 13 * L * h + (V + s) * h + 2 * h


def llama_formula(c: ModelConfig) -> int:
    L, h, a, kv, f, V = (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads,
                         c.ffn_hidden_size, c.vocab_size)
    per_layer = 2 * h * h + 2 * h * h * kv // a + 3 * h * f + 2 * h
    return L * per_layer + V * h * (1 if c.tied_embeddings else 2) + h


# ---------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("name", ["tiny-gpt", "gpt3-175b", *NARAYANAN])
def test_gpt_param_count_matches_closed_form(name):
    config = get_config(name)
    if name == "tiny-gpt":  # its ffn is 2h, so count the general form
        h, L, f = config.hidden_size, config.num_layers, config.ffn_hidden_size
        expected = L * (4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h) \
            + (config.vocab_size + config.seq_len) * h + 2 * h
    else:
        expected = gpt_formula(config)
    assert n_params(build(name)) == expected


def test_gpt_published_sizes_are_close_to_names():
    # Narayanan's names round their formula; 1.7B is 1.65e9 by that same formula.
    for name in NARAYANAN:
        billions = float(name.split("-")[1].rstrip("b"))
        assert n_params(build(name)) / 1e9 == pytest.approx(billions, rel=0.035)
    assert n_params(build("gpt3-175b")) == pytest.approx(174.6e9, rel=1e-3)


@pytest.mark.parametrize("name", ["tiny-llama", *LLAMAS])
def test_llama_param_count_matches_closed_form(name):
    assert n_params(build(name)) == llama_formula(get_config(name))


def test_llama_published_totals():
    assert n_params(build("llama3-405b")) == pytest.approx(405.8e9, rel=1e-3)
    assert n_params(build("llama2-70b")) == pytest.approx(68.98e9, rel=1e-3)
    assert n_params(build("llama2-7b")) == pytest.approx(6.74e9, rel=1e-3)
    assert n_params(build("llama3-8b")) == pytest.approx(8.03e9, rel=1e-3)


def test_meta_build_allocates_nothing():
    # how fast the build is belongs to benchmarks/extraction.py, not to a timed test
    model = build("llama3-405b")
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(b.is_meta for b in model.buffers())


# ---------------------------------------------------------------- configs and presets


def test_from_dict_round_trips_every_published_record():
    for record in _plans():
        d = record["model"]
        config = ModelConfig.from_dict(d)
        for key, value in d.items():
            assert getattr(config, key) == value, (record["id"], key)
        assert ModelConfig.from_dict(config.to_dict()) == config
        assert json.loads(json.dumps(config.to_dict())) == config.to_dict()
        assert get_config(d) == config


def test_presets_match_published_records():
    by_id = {r["id"]: r["model"] for r in _plans()}
    for name in NARAYANAN:
        record = by_id["megatron-ptdp-" + name.split("-", 1)[1]]
        ours = get_config(name).to_dict()
        assert {k: ours[k] for k in record if k != "name"} == {k: v for k, v in record.items()
                                                                if k != "name"}
    for preset, record_id in [("gpt3-175b", "dgxc-gpt3-175b-bf16-128gpu"),
                              ("llama3-405b", "llama3-405b-8192gpu-s8192"),
                              ("llama3-70b", "dgxc-llama3.1-70b-bf16-64gpu"),
                              ("llama3-8b", "dgxc-llama3.1-8b-bf16-8gpu")]:
        ours = get_config(preset).to_dict()
        record = by_id[record_id]
        assert {k: ours[k] for k in record if k != "name"} == {k: v for k, v in record.items()
                                                                if k != "name"}


def test_family_defaults():
    gpt = ModelConfig.from_dict(dict(name="g", family="gpt", num_layers=2, hidden_size=64,
                                     num_heads=4, vocab_size=100, seq_len=16))
    assert (gpt.num_kv_heads, gpt.ffn_hidden_size, gpt.norm, gpt.mlp, gpt.position) == \
        (4, 256, "layernorm", "gelu", "learned")
    assert gpt.bias and gpt.tied_embeddings
    assert gpt.attention_dropout == gpt.hidden_dropout == 0.1
    llama = ModelConfig(name="l", family="LLaMA", num_layers=2, hidden_size=4096, num_heads=32,
                        vocab_size=100, seq_len=16)
    assert (llama.family, llama.ffn_hidden_size, llama.norm, llama.mlp, llama.position) == \
        ("llama", 11008, "rmsnorm", "swiglu", "rope")
    assert not llama.bias and not llama.tied_embeddings
    assert llama.attention_dropout == llama.hidden_dropout == 0.0
    assert llama.head_dim == 128


def test_presets_registry():
    names = list_presets()
    assert {"gpt3-175b", "tiny-gpt", "tiny-llama", *NARAYANAN, *LLAMAS} <= set(names)
    assert all(PRESETS[n].source and PRESETS[n].config.name == n for n in names)
    assert get_config("LLaMA3-8B") is PRESETS["llama3-8b"].config
    config = get_config("tiny-gpt")
    assert get_config(config) is config
    with pytest.raises(TypeError):
        PRESETS["x"] = PRESETS["tiny-gpt"]  # type: ignore[index]


BASE = dict(name="bad", family="gpt", num_layers=2, hidden_size=64, num_heads=4, vocab_size=100,
            seq_len=16)


@pytest.mark.parametrize("change, words", [
    (dict(num_heads=5), ["num_heads=5", "hidden_size=64", "fix"]),
    (dict(num_kv_heads=3), ["num_kv_heads=3", "divide num_heads=4", "[1, 2, 4]"]),
    (dict(num_layers=0), ["num_layers=0", "positive"]),
    (dict(hidden_size=64.0), ["hidden_size", "int"]),
    (dict(num_layers=True), ["num_layers", "int"]),
    (dict(vocab_size="100"), ["vocab_size", "int"]),
    (dict(family="bert"), ["family='bert'", "gpt", "llama"]),
    (dict(norm="batchnorm"), ["norm='batchnorm'", "rmsnorm"]),
    (dict(mlp="relu"), ["mlp='relu'", "swiglu"]),
    (dict(tied_embeddings="yes"), ["tied_embeddings", "bool"]),
    (dict(hidden_dropout=1.5), ["hidden_dropout", "[0, 1)"]),
    (dict(family="llama", hidden_size=36, num_heads=4), ["head_dim", "even", "RoPE"]),
    (dict(num_layer=2), ["unknown key", "'num_layer'", "did you mean 'num_layers'"]),
])
def test_invalid_configs_raise_helpful_errors(change, words):
    with pytest.raises(InvalidModelConfig) as info:
        ModelConfig.from_dict({**BASE, **change})
    message = str(info.value)
    assert "'bad'" in message or "bad" in message
    for word in words:
        assert word in message, message


def test_a_hugging_face_config_json_is_named_as_one():
    # the new-user pass of 2026-12-07: a transformers config.json given as --model listed 18
    # unknown keys and guesses such as 'num_attention_heads' -> did you mean 'num_kv_heads'?
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
          "num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 11008,
          "max_position_embeddings": 4096, "vocab_size": 32000}
    with pytest.raises(InvalidModelConfig) as info:
        ModelConfig.from_dict(hf)
    message = str(info.value)
    assert message.startswith("this is a Hugging Face config (model_type 'llama'), not autopar's")
    assert "hf-* preset" in message and "num_attention_heads -> num_heads" in message
    assert "did you mean" not in message


def test_missing_keys_and_bad_specs():
    with pytest.raises(InvalidModelConfig, match="missing required key.*vocab_size"):
        ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "vocab_size"})
    with pytest.raises(InvalidModelConfig, match="Did you mean 'llama3-8b'.*Valid presets:.*tiny"):
        get_config("lama3-8b")
    # a letter O for a zero: the preset it spells with the digit, not the nearest spelling
    with pytest.raises(InvalidModelConfig, match="Did you mean 'llama2-70b'"):
        get_config("llama2-7OB")
    with pytest.raises(InvalidModelConfig, match="preset name"):
        get_config(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidModelConfig, match="floating-point"):
        build("tiny-gpt", dtype=torch.int64)


# ---------------------------------------------------------------- module structure and tracing


def test_module_structure():
    gpt, llama = build("tiny-gpt"), build("tiny-llama")
    assert gpt.lm_head.weight is gpt.embed.weight and gpt.lm_head.bias is None
    assert llama.lm_head.weight is not llama.embed.weight
    assert tuple(gpt.pos_embed.weight.shape) == (32, 64) and llama.pos_embed is None
    assert gpt.drop.p == 0.1 and llama.drop is None
    gb, lb = gpt.layers[0], llama.layers[0]
    assert isinstance(gb, Block) and isinstance(gb.attn, Attention) and isinstance(gb.mlp, MLP)
    assert isinstance(lb.mlp, SwiGLU) and isinstance(lb.attn_norm, RMSNorm)
    assert isinstance(gb.attn_norm, torch.nn.LayerNorm) and gb.attn.wq.bias is not None
    assert gb.attn_drop.p == gb.mlp_drop.p == 0.1 and lb.attn_drop is None and lb.mlp_drop is None
    assert tuple(lb.attn.wk.weight.shape) == (2 * 16, 64) and lb.attn.wq.bias is None
    assert lb.attn.rope is llama.rope and llama.rope.cos.shape == (32, 16)
    assert "rope.cos" not in llama.state_dict()


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_fx_trace_matches_eager(name):
    model = build(name, device="cpu", dtype=torch.float32).eval()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    traced = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(traced(ids), model(ids))
    x = torch.randn(2, 12, 64)
    torch.testing.assert_close(torch.fx.symbolic_trace(model.layers[0])(x), model.layers[0](x))
    sdpa = [n for n in traced.graph.nodes if n.target is F.scaled_dot_product_attention]
    assert len(sdpa) == model.config.num_layers
    assert sdpa[0].kwargs["enable_gqa"] == (name == "tiny-llama")
    assert not any("repeat" in str(n.target) or "expand" in str(n.target)
                   for n in traced.graph.nodes)


def test_fx_trace_of_large_meta_model():
    model = build("llama3-8b")
    assert torch.fx.symbolic_trace(model.layers[0]).graph is not None
    out = model(torch.zeros(1, 64, dtype=torch.long, device="meta"))
    assert out.shape == (1, 64, 128256) and out.dtype == torch.bfloat16


def test_gqa_attention_matches_repeated_kv_reference():
    model = build("tiny-llama", device="cpu", dtype=torch.float32)
    attn, x = model.layers[0].attn, torch.randn(2, 8, 64)
    q = attn.wq(x).unflatten(-1, (4, 16)).transpose(1, 2)
    k = attn.wk(x).unflatten(-1, (2, 16)).transpose(1, 2)
    v = attn.wv(x).unflatten(-1, (2, 16)).transpose(1, 2)
    q, k = attn.rope(q, k)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = (q @ k.transpose(-1, -2)) / 4.0
    scores = scores.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    ref = attn.wo((scores.softmax(-1) @ v).transpose(1, 2).flatten(2))
    torch.testing.assert_close(attn(x), ref)


# ---------------------------------------------------------------- real CPU runs


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_forward_backward_on_cpu(name):
    model = build(name, device="cpu", dtype=torch.float32)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    logits = model(ids)
    assert logits.shape == (2, 32, 256)
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert torch.isfinite(loss) and 4.0 < loss.item() < 7.0  # near ln(256) = 5.55 at init
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_init_is_deterministic_and_dtype_independent(name):
    a = build(name, device="cpu", dtype=torch.float32, seed=3)
    b = build(name, device="cpu", dtype=torch.float32, seed=3)
    c = build(name, device="cpu", dtype=torch.bfloat16, seed=3)
    assert isinstance(a, Transformer)
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), n
        assert torch.equal(pa.to(torch.bfloat16), pc), n
    assert not torch.equal(a.embed.weight, build(name, device="cpu", seed=4).embed.weight.float())
    assert a.embed.weight.std().item() == pytest.approx(0.02, rel=0.1)
    if a.rope is not None:
        assert torch.equal(a.rope.cos[0], torch.ones(16)) and torch.isfinite(a.rope.sin).all()
    # bf16 runs too
    c(torch.zeros(1, 8, dtype=torch.long)).float().sum().backward()


def test_squared_relu_mlp():
    # Nemotron-4's MLP (Megatron-LM --squared-relu): two matrices, relu(x)^2
    import torch
    from autopar.models import ModelConfig, build
    cfg = ModelConfig.from_dict(dict(name="sq", family="gpt", num_layers=2, hidden_size=64,
                                     num_heads=4, vocab_size=128, seq_len=32, mlp="squared-relu",
                                     bias=False))
    model = build(cfg, device="cpu", dtype=torch.float32, seed=0)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_parameters
    mlp = model.layers[0].mlp
    x = torch.randn(3, 64)
    assert torch.allclose(mlp(x), mlp.fc2(torch.relu(mlp.fc1(x)) ** 2))
    gelu = ModelConfig.from_dict({**cfg.to_dict(), "mlp": "gelu"})
    assert gelu.num_parameters == cfg.num_parameters
    import autopar
    args = autopar.optimize(cfg, "1x8xA100-80GB", autopar.TrainingConfig(8, 32),
                            top_k=1).to_megatron_args().value
    assert "--squared-relu" in args and "--swiglu" not in args


def test_a_preset_suggestion_is_a_near_one_or_none():
    # the new-user pass: --model gpt4 was answered "Did you mean 'gpt-18.4b'?"
    with pytest.raises(InvalidModelConfig) as exc:
        get_config("gpt4")
    assert "Did you mean" not in str(exc.value)
    for typed, meant in (("gpt3", "gpt3-175b"), ("mixtral", "mixtral-8x7b"),
                         ("tinyllama", "tiny-llama"), ("deepseekv3", "deepseek-v3")):
        with pytest.raises(InvalidModelConfig, match=f"Did you mean '{meant}'"):
            get_config(typed)


def test_a_path_given_as_a_model_says_whether_the_file_exists(tmp_path):
    """The new-user pass of 2026-12-07 (second): a path that does not exist was told only
    that a model file must be .json."""
    with pytest.raises(InvalidModelConfig, match=r"file path \(and no such file exists\): "
                                                  r"a model file must be a \.json file"):
        get_config(str(tmp_path / "nope.py"))
    real = tmp_path / "model.py"
    real.write_text("x = 1\n")
    with pytest.raises(InvalidModelConfig, match=r"It looks like a file path: a model file"):
        get_config(str(real))
