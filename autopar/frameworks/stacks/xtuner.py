"""XTuner 0.1.x (InternLM/xtuner, mmengine + DeepSpeed ZeRO, Hugging Face models with their
attention swapped for XTuner's flash-attention forward): an option on the ``deepspeed``
profile, :func:`with_xtuner_attention`, not a profile of its own (the rest of the step is
DeepSpeed's).

What it changes, read at XTuner 0.1.16 (mainline ``3a8035d657871ff8253aaa7f9be23c0e30ed77fb``,
2024-04-02, the date of its sequence-parallel speed benchmark; sequence parallelism landed in
``59834032c82d39994c13252aea9b00011d1b2457``, 2024-03-22, with the same code):

- ``xtuner/model/modules/dispatch/llama.py`` ``llama_attn_forward``: after the rotary
  embedding, ``key_states = repeat_kv(key_states, self.num_key_value_groups)`` and the same for
  ``value_states``, unconditionally (with or without sequence parallelism), then
  ``flash_attn_wo_mask`` / ``flash_attn_w_mask``;
- those are wrapped by ``xtuner/parallel/sequence/attention.py`` ``sequence_parallel_wrapper``,
  whose ``pre_process_for_sequence_parallel_attn`` all-to-alls Q, K and V (``_SeqAllToAll``,
  sequence-sharded to head-sharded) after the repeat, asserting only that the query heads
  divide by the sequence-parallel size; ``post_process_for_sequence_parallel_attn`` all-to-alls
  the output back.

So each KV head is repeated ``heads / kv heads`` times (Hugging Face ``repeat_kv``: expand then
reshape, a copy, copies of one head adjacent), K and V cross both all-to-alls at the query
heads' width, and flash-attn's autograd function keeps the repeated K and V for backward. The
attention FLOPs do not change (they count query heads).
"""

from __future__ import annotations

from dataclasses import replace

from ..choices import ContextParallelAttention, with_choice
from ..profiles import FrameworkProfile
from . import get_profile

#: Where XTuner's behaviour was read (module docstring).
AT = "XTuner 0.1.16 (3a8035d657871ff8253aaa7f9be23c0e30ed77fb, 2024-04-02)"

#: XTuner's sequence parallelism: its fused flash-attention per rank, KV heads repeated first.
XTUNER_SEQUENCE_PARALLEL = ContextParallelAttention(
    name="xtuner-sequence-parallel",
    summary="XTuner's Ulysses-style sequence parallelism: KV heads repeated to the query heads "
            "before the all-to-all, flash-attn per rank on whole sequences",
    cp_attention={}, ulysses_kv_repeat=True, sources={
        "cp_attention": f"{AT} dispatch/llama.py: flash_attn_func (causal) on the whole "
                        "sequence of the rank's heads after the all-to-all: fused",
        "ulysses_kv_repeat": f"{AT} xtuner/model/modules/dispatch/llama.py llama_attn_forward: "
                             "key_states = repeat_kv(key_states, self.num_key_value_groups) "
                             "(and value_states) before flash_attn_wo_mask, which "
                             "xtuner/parallel/sequence/attention.py sequence_parallel_wrapper "
                             "wraps: pre_process_for_sequence_parallel_attn all-to-alls q, k "
                             "and v after the repeat and asserts only n_head % "
                             "sequence_parallel_world_size == 0 (n_head of the query)"})

#: Why XTuner keeps the repeated K and V (memory.kv_repeat_saved = 1).
KV_REPEAT_SAVED_SOURCE = (
    f"{AT} dispatch/llama.py llama_attn_forward: repeat_kv (expand + reshape, a copy) of K and "
    "V to every query head, unconditionally, before flash_attn_func, whose autograd function "
    "saves its q, k, v inputs: 1")


def with_xtuner_attention(profile: str | FrameworkProfile = "deepspeed") -> FrameworkProfile:
    """``profile`` (XTuner's engine, DeepSpeed) running XTuner's attention: Ulysses CP with the
    KV heads repeated before the all-to-all (:data:`XTUNER_SEQUENCE_PARALLEL`, so tp * cp need
    divide only the query heads and K, V cross the all-to-all at their width), and K and V kept
    at the query heads' width for backward (``memory.kv_repeat_saved`` = 1,
    :data:`KV_REPEAT_SAVED_SOURCE`). Like :func:`autopar.frameworks.stacks.with_pure_bf16` it
    edits the memory conventions, so it is estimated with ``CostModel(..., framework=profile)``.

    Raises:
        InvalidTrainingConfig: an unknown framework name.
    """
    p = with_choice(get_profile(profile), XTUNER_SEQUENCE_PARALLEL)
    mem = replace(p.memory, kv_repeat_saved=1,
                  sources={**p.memory.sources, "kv_repeat_saved": KV_REPEAT_SAVED_SOURCE})
    return replace(p, memory=mem)
