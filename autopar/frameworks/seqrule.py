"""How a framework cuts each sequence over context-parallel (CP) and sequence-parallel (SP) ranks,
as a divisibility rule on the sequence length: :class:`SeqLenRule`.

Two mechanisms set the rule:

- **Load-balanced CP**: with causal attention, later tokens attend to more keys, so Megatron-Core
  and torchtitan cut the sequence into ``2 * cp`` equal chunks and give CP rank ``i`` chunks
  ``i`` and ``2 cp - 1 - i`` (Megatron-LM ``megatron/core/utils.py``
  ``get_batch_on_this_cp_rank``; torch ``context_parallel`` "headtail" load balancer). The
  sequence length must then be a multiple of ``2 * cp``.
- **Sequence parallelism** (Korthikanti et al. 2022) shards each CP rank's ``seq / cp`` tokens
  over the TP group with reduce-scatter / all-gather of equal shards, so ``seq / cp`` must be a
  multiple of ``tp`` (Megatron-LM ``megatron/core/tensor_parallel/mappings.py``: "First dimension
  of the tensor should be divisible by tensor parallel size").

Together (Megatron-Core, CP > 1 and SP on): ``seq % (cp * lcm(2, tp)) == 0``. torchtitan asserts a
stricter product for every job, CP and SP or not: ``seq % (tp * 2 * cp) == 0``
(``ParallelDims.seq_len_divisor``).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm

from ..errors import InvalidTrainingConfig
from .rules import seq_rule_split


@dataclass(frozen=True)
class SeqLenRule:
    """The sequence-length divisibility a framework needs for a (tp, cp, sequence_parallel).

    Attributes:
        cp_chunks: chunks each CP rank holds: 2 for the load-balanced split into ``2 * cp``
            chunks, 1 for a contiguous split (``seq % cp`` only).
        always: the framework asserts ``seq % (tp * cp_chunks * cp) == 0`` for every job,
            whether CP and SP are on or not (torchtitan's ``seq_len_divisor``); otherwise the CP
            part applies only when cp > 1 and the TP part only under sequence parallelism.
        source: the framework file and line the rule was read from.

    Raises:
        InvalidTrainingConfig: at construction, ``cp_chunks`` not 1 or 2, or no source.
    """

    cp_chunks: int = 1
    always: bool = False
    source: str = ("autopar/runtime/cp.py (contiguous split when 2 cp does not divide the "
                   "sequence) and torch.distributed.tensor.parallel SequenceParallel (equal "
                   "shards of each CP rank's tokens over TP)")

    def __post_init__(self) -> None:
        if self.cp_chunks not in (1, 2) or not self.source:
            raise InvalidTrainingConfig(
                f"SeqLenRule(cp_chunks={self.cp_chunks!r}, source={self.source!r}): cp_chunks "
                "must be 1 or 2 and the rule needs a source. Fix: pass cp_chunks=1 or 2 and the "
                "framework file the rule comes from.")

    def divisor(self, tp: int, cp: int, sequence_parallel: bool) -> int:
        """The number the sequence length (tokens) must be a multiple of."""
        if self.always:
            return tp * self.cp_chunks * cp
        d = self.cp_chunks * cp if cp > 1 else 1
        if sequence_parallel and tp > 1:
            d = lcm(d, cp * tp)
        return d

    def violation(self, framework: str, seq_len: int, tp: int, cp: int,
                  sequence_parallel: bool, sp_optional: bool = True) -> str | None:
        """Why ``framework`` cannot split sequences of ``seq_len`` tokens over tp x cp (with
        ``sequence_parallel``), with a fix; None when it can.

        ``sp_optional``: the framework runs TP without SP (then turning SP off is offered).
        The rule's text is :func:`autopar.frameworks.rules.seq_rule_split`'s.
        """
        v = seq_rule_split(self, framework, seq_len, tp, cp, sequence_parallel, sp_optional)
        return None if v is None else v.text


#: Megatron-Core: arguments.py asserts ``seq_length % (2 * context_parallel_size)`` when CP > 1;
#: SP needs each CP rank's tokens divisible by TP (mappings.py).
MEGATRON_RULE = SeqLenRule(
    cp_chunks=2, always=False,
    source="Megatron-LM d98e8a64ddf3 megatron/training/arguments.py: 'seq-length should be a "
           "multiple of 2 * context-parallel-size if context-parallel-size > 1'; "
           "megatron/core/tensor_parallel/mappings.py: 'First dimension of the tensor should be "
           "divisible by tensor parallel size' (SP)")
#: torchtitan v0.2.2: every model's parallelize.py asserts ``seq_len % seq_len_divisor``.
TORCHTITAN_RULE = SeqLenRule(
    cp_chunks=2, always=True,
    source="torchtitan v0.2.2 torchtitan/distributed/parallel_dims.py "
           "ParallelDims.seq_len_divisor = tp * (cp * 2), asserted in "
           "models/llama3/infra/parallelize.py")
#: torchtitan 0.3.0: trainer.py asserts ``seq_len % ((tp if SP) * (2 cp if cp > 1))``; kept as
#: v0.2.2's ``tp * 2 cp`` (exact with CP; at cp = 1 it also refuses odd multiples of tp, which 0.3
#: runs), as :class:`SeqLenRule` has no form for "the CP part only when cp > 1, times tp".
TORCHTITAN_03_RULE = SeqLenRule(
    cp_chunks=2, always=True,
    source="torchtitan 0.3.0 torchtitan/trainer.py: seq_len % ((tp if "
           "enable_sequence_parallel) * (2 * cp if cp > 1)); autopar keeps v0.2.2's tp * (cp * 2) "
           "at cp = 1 too (stricter by 2 there)")
#: DeepSpeed: no CP from the JSON config and no Megatron-style SP (AutoTP), so only the
#: generic rule of a contiguous split applies.
DEEPSPEED_RULE = SeqLenRule(
    cp_chunks=1, always=False,
    source="DeepSpeed 0.19.6: no context parallelism in the JSON config and no sequence "
           "parallelism in AutoTP (deepspeed/module_inject/auto_tp.py)")
