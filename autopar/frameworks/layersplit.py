"""How Megatron-LM splits a model's decoder layers over pipeline ranks and their virtual
(interleaved) stages, given the arguments a job starts with: :class:`MegatronLayerSplit`.

Megatron-LM (NVIDIA/Megatron-LM at d98e8a64) builds ``get_num_layers_to_build`` layers on each
pipeline chunk (``megatron/core/transformer/transformer_block.py``) and refuses a split it cannot
build in ``validate_args`` (``megatron/training/arguments.py``), ``TransformerConfig.__post_init__``
(``megatron/core/transformer/transformer_config.py``) and that function's assertions. Which rule
applies depends on the flags given (``v`` = virtual stages per rank, 1 without interleaving):

- ``--pipeline-model-parallel-layout``: any split; the layout's ``t`` per chunk, its chunk count a
  multiple of pp (``megatron/core/transformer/pipeline_parallel_layer_layout.py``);
- ``--decoder-first-pipeline-num-layers F`` / ``--decoder-last-pipeline-num-layers L``: the first
  (last) rank holds F (L) layers, the middle ranks share the rest equally; F, L and a middle
  rank's share must be multiples of v;
- ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: the
  embedding (loss) counts as a layer, ``n = layers + 1 (+ 1)``; ``n % pp == 0``, ``(n / pp) % v ==
  0``, and the first (last) chunk builds one decoder layer fewer;
- none of them: ``layers % pp == 0`` and ``(layers / pp) % v == 0``.

``v`` is ``--num-virtual-stages-per-pipeline-rank``, or a rank's layers divided by
``--num-layers-per-virtual-pipeline-stage`` (which Megatron refuses with F or L); interleaving
needs pp > 1, and pp > 2 without P2P overlap (``arguments.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidParallelConfig

_ARGS = "megatron/training/arguments.py validate_args"
_CONFIG = "megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__"
_BUILD = "megatron/core/transformer/transformer_block.py get_num_layers_to_build"
_LAYOUT = "megatron/core/transformer/pipeline_parallel_layer_layout.py"


@dataclass(frozen=True)
class MegatronLayerSplit:
    """Megatron-LM's flags that decide how decoder layers split over pipeline chunks.

    Attributes:
        first / last: ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-...``, or None.
        embedding / loss: ``--account-for-embedding-in-pipeline-split`` / ``-loss-``.
        virtual_stages: ``--num-virtual-stages-per-pipeline-rank`` (also read from the older
            ``--virtual-pipeline-model-parallel-size``), or None.
        layers_per_virtual_stage: ``--num-layers-per-virtual-pipeline-stage``, or None.
        layout: ``--pipeline-model-parallel-layout``, or None.
        overlap_p2p: P2P overlap on (off with ``--no-overlap-p2p-communication``).
        pp_divides: when known, the GPUs per tensor x context parallel group (world / (tp x
            cp)): a pipeline size proposed as a fix must divide it, or the degrees would not
            fill the cluster; None = any.
    """

    first: int | None = None
    last: int | None = None
    embedding: bool = False
    loss: bool = False
    virtual_stages: int | None = None
    layers_per_virtual_stage: int | None = None
    layout: str | None = None
    overlap_p2p: bool = True
    pp_divides: int | None = None

    @property
    def sets_virtual_stages(self) -> bool:
        """Whether the flags choose the virtual stage count (else it is 1)."""
        return any(x is not None for x in (self.virtual_stages, self.layers_per_virtual_stage,
                                           self.layout))

    def chunks(self, num_layers: int, pp: int, virtual_stages: int | None = None
               ) -> tuple[int, ...]:
        """Decoder layers per pipeline chunk in model order, as Megatron-LM builds them
        (``pp x v`` entries; chunk ``c`` on rank ``c % pp``).

        Args:
            num_layers: the model's decoder layers (``--num-layers``).
            pp: ``--pipeline-model-parallel-size``.
            virtual_stages: v to use in place of the flags' (an override), or None.

        Raises:
            InvalidParallelConfig: Megatron-LM refuses the split; the message names its check
                (file and function) and the nearest legal split.
        """
        if self.layout is not None:
            return self._layout_chunks(num_layers, pp, virtual_stages)
        v = virtual_stages or self.virtual_stages
        uneven = self.first is not None or self.last is not None
        extra = int(self.embedding) + int(self.loss)
        n = num_layers + extra
        if virtual_stages is None and self.layers_per_virtual_stage is not None:
            if self.virtual_stages is not None:
                self._refuse(num_layers, pp, None, "--num-layers-per-virtual-pipeline-stage and "
                             "--num-virtual-stages-per-pipeline-rank are both given; Megatron "
                             f"takes one ({_ARGS})", fix="drop one of them")
            if uneven:
                self._refuse(num_layers, pp, None, "--num-layers-per-virtual-pipeline-stage "
                             "does not combine with --decoder-first/last-pipeline-num-layers "
                             f"({_ARGS})", fix="give --num-virtual-stages-per-pipeline-rank")
            if n % pp:
                self._refuse(num_layers, pp, None, self._layers(n) + f" must be a multiple "
                             f"of pp={pp} ({_ARGS}: num_layers % "
                             "transformer_pipeline_model_parallel_size == 0)")
            per_rank = n // pp
            if per_rank % self.layers_per_virtual_stage:
                self._refuse(num_layers, pp, None, f"each rank's {per_rank} layers must be a "
                             "multiple of --num-layers-per-virtual-pipeline-stage "
                             f"{self.layers_per_virtual_stage} ({_ARGS})",
                             fix=f"--num-layers-per-virtual-pipeline-stage one of "
                                 f"{_divisors(per_rank)}")
            v = per_rank // self.layers_per_virtual_stage
        v = v or 1
        if v > 1 and pp <= (1 if self.overlap_p2p else 2):
            need = 2 if self.overlap_p2p else 3
            self._refuse(num_layers, pp, v, f"an interleaved schedule needs pp >= {need}"
                         + ("" if self.overlap_p2p else " without P2P overlap") + f" ({_ARGS})",
                         fix=f"pp >= {need}, or no virtual stages")
        if uneven:
            ranks = self._uneven_ranks(num_layers, pp, v)
        else:
            if n % pp:
                self._refuse(num_layers, pp, v, self._layers(n) + f" must be a multiple of "
                             f"pp={pp} ({_ARGS if v == 1 else _BUILD}: "
                             f"num_layers % pipeline_model_parallel_size == 0)")
            if (n // pp) % v:
                self._refuse(num_layers, pp, v, f"each rank's {n // pp} layers must be a "
                             f"multiple of the {v} virtual stages ({_BUILD}: "
                             "num_layers_per_pipeline_rank % vp_size == 0)")
            ranks = [n // pp] * pp
        out = [ranks[c % pp] // v for c in range(pp * v)]
        out[0] -= int(self.embedding)
        out[-1] -= int(self.loss)
        if min(out) < 0:
            self._refuse(num_layers, pp, v, "a chunk holding the embedding or the loss has no "
                         f"decoder layer to give up ({_BUILD})")
        return tuple(out)

    def _uneven_ranks(self, num_layers: int, pp: int, v: int) -> list[int]:
        """Layers per rank under --decoder-first/last-pipeline-num-layers (_CONFIG "Uneven PP")."""
        if self.embedding or self.loss:
            self._refuse(num_layers, pp, v, "--decoder-first/last-pipeline-num-layers do not "
                         "combine with --account-for-embedding/loss-in-pipeline-split "
                         f"({_CONFIG})", fix="drop one kind")
        rest, stages = num_layers, pp
        for name, n in (("first", self.first), ("last", self.last)):
            if n is None:
                continue
            if n <= 0 or n % v:
                self._refuse(num_layers, pp, v, f"--decoder-{name}-pipeline-num-layers {n} must "
                             f"be a positive multiple of the {v} virtual stages ({_CONFIG})")
            rest -= n
            stages -= 1
        if stages < 0 or bool(rest) != bool(stages) or stages and (
                rest % stages or (rest // stages) % v):
            self._refuse(num_layers, pp, v, f"the {rest} layers left for the {max(stages, 0)} "
                         "middle ranks must split equally, each share a multiple of the "
                         f"{v} virtual stages ({_CONFIG}, Uneven PP)")
        mid = rest // stages if stages else 0
        return [self.first if self.first is not None and r == 0 else
                self.last if self.last is not None and r == pp - 1 else mid for r in range(pp)]

    def _layout_chunks(self, num_layers: int, pp: int, virtual_stages: int | None
                       ) -> tuple[int, ...]:
        """Decoder layers per chunk of ``--pipeline-model-parallel-layout`` (_LAYOUT
        parse_str_to_list and validate_layer_layout)."""
        if self.first is not None or self.last is not None or self.embedding or self.loss:
            self._refuse(num_layers, pp, None, "--pipeline-model-parallel-layout does not "
                         "combine with --decoder-first/last-pipeline-num-layers or "
                         f"--account-for-*-in-pipeline-split ({_CONFIG})", fix="drop one kind")
        chunks = layout_chunks(self.layout)
        bad = ("" if len(chunks) % pp == 0 else f"its {len(chunks)} chunks are not a multiple of "
               f"pp={pp}")
        if not bad and virtual_stages and len(chunks) != pp * virtual_stages:
            bad = f"its {len(chunks)} chunks are not pp x v = {pp} x {virtual_stages}"
        if not bad and sum(c.count("t") for c in chunks) != num_layers:
            held = sum(c.count("t") for c in chunks)
            bad = f"it holds {held} decoder layers ('t'), not {num_layers}"
        flat = "".join(chunks)
        if not bad and (flat.count("E") != 1 or flat.count("L") != 1 or flat[:1] != "E"
                        or flat[-1:] != "L"):
            bad = "it must start with the embedding 'E' and end with the loss 'L', each once"
        if bad:
            self._refuse(num_layers, pp, None, f"--pipeline-model-parallel-layout "
                         f"{self.layout!r}: {bad} ({_LAYOUT})", fix="a layout with pp x v chunks "
                         f"and {num_layers} 't' in all, e.g. {_even_layout(num_layers, pp)!r}")
        return tuple(c.count("t") for c in chunks)

    def _layers(self, n: int) -> str:
        extra = " + ".join(x for x, on in (("the embedding", self.embedding),
                                            ("the loss", self.loss)) if on)
        return f"{n} layers" + (f" (decoder layers + {extra})" if extra else "")

    def _refuse(self, num_layers: int, pp: int, v: int | None, rule: str, fix: str = "") -> None:
        vs = f" with {v} virtual stages per rank" if v and v > 1 else ""
        raise InvalidParallelConfig(
            f"Megatron-LM cannot split {num_layers} decoder layers over pipeline-model-parallel "
            f"size {pp}{vs}: {rule}. Fix: {fix or self._fix(num_layers, pp, v or 1)}.")

    def _fix(self, num_layers: int, pp: int, v: int) -> str:
        """The nearest legal even splits: another pp, another v at this pp, and an uneven
        first/last split at this pp and v when its busiest rank is no busier than an even
        split's would be."""
        n = num_layers + int(self.embedding) + int(self.loss)
        lpv = self.layers_per_virtual_stage
        legal = [p for p in range(2, n + 1) if n % (p * v) == 0 and p != pp
                 and (lpv is None or (n // p) % lpv == 0)
                 and (self.pp_divides is None or self.pp_divides % p == 0)]
        pps = [p for p in (max((p for p in legal if p < pp), default=None),
                           min((p for p in legal if p > pp), default=None)) if p]
        vflag = f" and {v} virtual stages" if v > 1 else ""
        out = [" or ".join(f"pp={p}" for p in pps) + vflag] if pps else []
        if n % pp == 0 and v > 1:
            vs = [d for d in _divisors(n // pp) if d > 1]
            out.append(f"keep pp={pp} with --num-virtual-stages-per-pipeline-rank "
                       f"{' or '.join(map(str, vs)) + ' or ' if vs else ''}none")
        # Megatron takes first/last stage sizes with neither the account-for flags nor
        # --num-layers-per-virtual-pipeline-stage
        split = (None if self.embedding or self.loss or lpv is not None
                 else _uneven_split(num_layers, pp, v))
        if split is not None:
            first, mid, last = split
            out.append(f"keep pp={pp}{vflag} with --decoder-first-pipeline-num-layers {first} "
                       f"--decoder-last-pipeline-num-layers {last} ({mid} on each middle rank)")
        return "; or ".join(out) or "another pipeline-model-parallel size"


def layout_chunks(layout: str) -> list[str]:
    """The chunks of a ``--pipeline-model-parallel-layout`` string, unrolled (``"Et*2|(t|)*2L"``
    -> ``["Ett", "t", "tL"]``), as Megatron-LM's ``PipelineParallelLayerLayout.parse_str_to_list``
    reads it: commas dropped, ``(...)*n`` then ``x*n`` repeated, ``|`` between chunks.

    Raises:
        InvalidParallelConfig: a character other than E, L, t, m (embedding, loss, decoder
            layer, MTP layer), ``|``, ``(``, ``)``, ``*`` and digits.
    """
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    chunks = text.split("|")
    odd = sorted(set("".join(chunks)) - set("ELtm"))
    if odd:
        raise InvalidParallelConfig(
            f"--pipeline-model-parallel-layout {layout!r}: unknown characters {odd} ({_LAYOUT}:"
            " E embedding, L loss, t decoder layer, m MTP layer, '|' between chunks). Fix: e.g. "
            "'Et*3|t*4|t*4|t*3L'.")
    return chunks


def _even_layout(num_layers: int, pp: int) -> str:
    base, more = divmod(num_layers, pp)
    parts = [f"t*{base + (r < more)}" for r in range(pp)]
    return "|".join(["E" + parts[0], *parts[1:-1], parts[-1] + "L"] if pp > 1
                    else ["E" + parts[0] + "L"])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _uneven_split(num_layers: int, pp: int, v: int) -> tuple[int, int, int] | None:
    """(first, middle, last) layers per rank, each a positive multiple of ``v``, that hold
    ``num_layers`` on ``pp`` ranks with the busiest rank no busier than ``ceil(layers / pp)``
    rounded up to a multiple of ``v``, the most balanced such (first <= last, lighter ends
    first); None if none."""
    if pp < 2:
        return None
    cap = -(-(-(-num_layers // pp)) // v) * v
    best = None
    mids = range(v, cap + 1, v) if pp > 2 else (0,)
    for mid in mids:
        for first in range(v, cap + 1, v):
            last = num_layers - first - (pp - 2) * mid
            if 0 < last <= cap and last % v == 0 and first <= last:
                # fewest layers on the busiest rank, then the most in the middle (the first
                # and last ranks also hold the embedding and the output layer)
                key = (max(first, mid, last), -mid, last - first)
                if best is None or key < best[0]:
                    best = (key, (first, mid, last))
    return best[1] if best else None
