"""Issue 23: loading and measuring plans as the docs say.

Item 3: docs/apply.md loads a Hugging Face model's plan with ``Plan.from_json(path,
model=model)`` where ``model`` is the real one (weights in CPU memory); that raised
InvalidPlanFile for a model already in the plan's dtype (torch.export baked the CPU device of
RoPE's ``inv_freq`` into the graph, which then failed on meta tensors), while a meta copy loaded.
"""

from __future__ import annotations

import copy

import pytest
import torch

import autopar

SEQ = 32


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        tie_word_embeddings=False, attn_implementation="sdpa"))


def _mixtral() -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=SEQ, tie_word_embeddings=False,
        router_jitter_noise=0.0, attn_implementation="sdpa"))


@pytest.mark.parametrize("family", [_llama, _mixtral], ids=["llama", "mixtral"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_real_hf_model_loads_its_plan_as_a_meta_copy_does(family, precision, tmp_path):
    pytest.importorskip("transformers")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    # docs/apply.md: the full model, same seed on every rank, in the plan's precision
    model = family().to(dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train = autopar.TrainingConfig(global_batch_size=8, seq_len=SEQ, precision=precision)
    on_meta = copy.deepcopy(model).to("meta")
    cluster = autopar.Cluster.custom(1, 2, "A100-80GB")
    plan = autopar.optimize(on_meta, cluster, train)
    path = tmp_path / "plan.json"
    plan.to_json(path)
    real = autopar.Plan.from_json(path, model=model)  # raised InvalidPlanFile (rotary_emb)
    meta = autopar.Plan.from_json(path, model=on_meta)
    assert real.estimate.step_time_s > 0
    assert real.estimate == meta.estimate == plan.estimate
    assert real.alternatives == meta.alternatives
    # planning the real model gives the same plan (it raised UntraceableModelError)
    assert autopar.optimize(model, cluster, train).estimate == plan.estimate
    # the user's model is untouched: still real, on the CPU, with its weights
    assert all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_meta_copy_keeps_ties_dtypes_and_the_original():
    from autopar.graph.assemble import meta_copy, on_meta
    model = autopar.models.build("tiny-llama", device="cpu", dtype=torch.float32, seed=0)
    model.lm_head.weight = model.embed.weight  # tie, as tie_word_embeddings does
    clone = meta_copy(model)
    assert on_meta(clone) and not on_meta(model)
    assert clone.lm_head.weight is clone.embed.weight
    assert [(n, p.shape, p.dtype, p.requires_grad) for n, p in clone.named_parameters()] == \
        [(n, p.shape, p.dtype, p.requires_grad) for n, p in model.named_parameters()]
    assert isinstance(clone.embed.weight, torch.nn.Parameter)
