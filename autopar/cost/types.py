"""The cost model's answer: :class:`Estimate` and its typed breakdowns, pure data.

Breakdowns are records, not string-keyed dicts: :class:`TimeBreakdown` (seconds by component),
:class:`~autopar.cost.memory.MemoryBreakdown` (bytes by component), :class:`LinkComm` (one link
class's traffic; an estimate holds one per link class that carries any, sorted by name) and
:class:`GroupLinks` (the link class each mesh dimension's groups cross). Each serialises to the
dict plan files have always held (``as_dict``) and reads it back (``from_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..config import ParallelConfig
from ..errors import InvalidPlanFile
from .memory import MemoryBreakdown
from .regime import ErrorBand

#: How MFU and HFU count FLOPs. Model FLOPs are those torch's FlopCounterMode counts for one
#: forward pass of the extracted graph plus the measured backward (2x for GEMMs, 2.5x for
#: attention), with causal attention counted at the half a causal kernel executes (Narayanan et
#: al. 2021 eq. 3 and NeMo count it non-causal, which lets utilisation exceed 100% at long
#: sequences); recomputation is excluded from MFU and included in HFU.
FLOPS_CONVENTION = (
    "model FLOPs = measured forward + backward FLOPs of the graph (FlopCounterMode), causal "
    "attention counted at the executed half; MFU excludes recompute, HFU includes it; "
    "peak = the GPU's dense peak for the training precision"
)



def _unknown(kind: str, keys, known) -> None:
    """Refuse keys of a stored breakdown that its record does not have."""
    extra = sorted(set(keys) - set(known))
    if extra:
        raise InvalidPlanFile(f"invalid plan file: {kind} has unknown key(s) {extra}; it holds "
                              f"{list(known)}. Fix: remove them, or regenerate the plan with "
                              "`autopar plan --out plan.json`.")


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds of one step by component; they add up to the step time (:attr:`total`).

    Attributes:
        compute, tp_comm, cp_comm, ep_comm, pp_comm: the bottleneck pipeline rank's per
            micro-batch compute and exposed TP / CP / EP / pipeline-send seconds, times the
            micro-batches.
        bubble: pipeline idle seconds.
        dp_comm_exposed: data-parallel collective seconds no compute hides.
        overlap_slowdown: what the DP collectives run beside compute cost it by holding SMs
            (:func:`autopar.cost.comm.overlapped_comm`).
        dp_copies: the sharded-DP implementation's memory-bound copies on the compute stream.
        optimizer: the optimizer step.
        fixed_step: the framework profile's ``step_fixed_s``.
        host_exposed: the bottleneck rank's host issue seconds beyond its stream's, times the
            micro-batches (:mod:`autopar.cost.host`: a pass whose kernels the GPU runs faster
            than the host launches them). Plan files of earlier versions have none.
        absent: names of components a plan file of an earlier autopar version lacked (read as
            0, left out again by :meth:`as_dict`); empty for a new estimate.
    """

    compute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    pp_comm: float
    bubble: float
    dp_comm_exposed: float
    overlap_slowdown: float
    dp_copies: float
    optimizer: float
    fixed_step: float
    host_exposed: float = 0.0
    absent: frozenset = frozenset()

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The component names, in order (the keys of :meth:`as_dict`)."""
        return tuple(f.name for f in fields(cls) if f.name != "absent")

    @property
    def total(self) -> float:
        """Sum of the components (seconds)."""
        return sum(self.as_dict().values())

    def as_dict(self) -> dict[str, float]:
        """Components by name in seconds, in field order (the plan file's form)."""
        return {k: getattr(self, k) for k in self.names() if k not in self.absent}

    @classmethod
    def from_dict(cls, d: dict) -> "TimeBreakdown":
        """Read :meth:`as_dict`'s form; a component missing (older plan files) reads as 0.

        Raises:
            InvalidPlanFile: a key that is no component."""
        _unknown("time_breakdown", d, cls.names())
        return cls(**{k: d.get(k, 0.0) for k in cls.names()},
                   absent=frozenset(k for k in cls.names() if k not in d))


def memory_breakdown_from_dict(d: dict, where: str = "memory_breakdown") -> MemoryBreakdown:
    """:class:`MemoryBreakdown` from its ``as_dict`` form.

    Raises:
        InvalidPlanFile: a component missing or unknown."""
    names = tuple(f.name for f in fields(MemoryBreakdown))
    _unknown(where, d, names)
    missing = [k for k in names if k not in d]
    if missing:
        raise InvalidPlanFile(f"invalid plan file: {where} lacks {missing}. Fix: add them (bytes), "
                              "or regenerate the plan with `autopar plan --out plan.json`.")
    return MemoryBreakdown(**{k: d[k] for k in names})


@dataclass(frozen=True)
class LinkComm:
    """What one GPU of the slowest pipeline rank puts on one link class per step.

    Attributes:
        link: the link class ("nvlink", "infiniband", ...).
        nbytes: bytes on the wire (each message times the ring's factor, 2(n-1)/n for
            all-reduce, (n-1)/n for all-gather / reduce-scatter / all-to-all, 1 for send/recv;
            :mod:`autopar.cost.comm`; plan files of earlier versions hold message sizes).
        seconds: seconds the link carries them, before overlap.
        dims: the mesh dimensions whose traffic it carries, in booking order; None in plan
            files of earlier versions.
    """

    link: str
    nbytes: float
    seconds: float
    dims: tuple[str, ...] | None = None


#: Mesh dimensions whose groups :class:`GroupLinks` names, in order.
GROUP_DIMS = ("tp", "cp", "pp", "dp", "ep", "etp")


@dataclass(frozen=True)
class GroupLinks:
    """The bottleneck link class each mesh dimension's groups cross ("local" for one rank),
    from the rank placement; None for a dimension the estimate does not name (``etp`` without
    MoE parallel folding; ``ep`` in plan files of earlier versions)."""

    tp: str | None = None
    cp: str | None = None
    pp: str | None = None
    dp: str | None = None
    ep: str | None = None
    etp: str | None = None
    order: tuple[str, ...] = ()

    def of(self, dim: str) -> str | None:
        """The link class of mesh dimension ``dim`` (None when not named)."""
        return getattr(self, dim, None) if dim in GROUP_DIMS else None

    def as_dict(self) -> dict[str, str]:
        """Named dimensions to link classes, in the order they were given."""
        return {d: getattr(self, d) for d in (self.order or GROUP_DIMS)
                if getattr(self, d) is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "GroupLinks":
        """Read :meth:`as_dict`'s form.

        Raises:
            InvalidPlanFile: a key that is no mesh dimension."""
        _unknown("group_links", d, GROUP_DIMS)
        return cls(**d, order=tuple(d))


@dataclass(frozen=True)
class Estimate:
    """Predicted cost of one training step under one :class:`ParallelConfig`.

    Attributes:
        config: the configuration, every field resolved.
        step_time_s: seconds per optimizer step.
        mfu: model FLOPs utilisation in [0, 1] (see :data:`FLOPS_CONVENTION`).
        hfu: hardware FLOPs utilisation (recompute included).
        tokens_per_s: training throughput of the whole cluster (tokens/s).
        memory_per_gpu_bytes: peak bytes on the most loaded GPU (bytes).
        memory_limit_bytes: the GPU's memory (bytes).
        fits: ``memory_per_gpu_bytes <= memory_limit_bytes``.
        num_micro_batches: micro-batches per step per pipeline (gradient accumulation steps).
        model_flops_per_step: FLOPs of one step (all GPUs), MFU's numerator times step time.
        time_breakdown: seconds by component (:class:`TimeBreakdown`: compute, tp_comm,
            cp_comm, ep_comm, pp_comm, bubble, dp_comm_exposed, overlap_slowdown, dp_copies,
            optimizer, fixed_step, the framework profile's ``step_fixed_s``; they add up to
            step_time_s). ``dp_copies`` is the sharded-DP implementation's memory-bound copies
            on the compute stream (FSDP1's flat-gradient concat, FSDP2's all-gather copy-out
            and reduce-scatter copy-in: ``FrameworkProfile.zero_grad_copy_passes``,
            ``fsdp2_copies``).
            ``overlap_slowdown`` is what the data-parallel collectives the framework runs
            beside compute cost by taking SMs from it (NCCL's thread blocks,
            :mod:`autopar.hardware.nccl`; :func:`autopar.cost.comm.overlapped_comm`), beyond
            ``dp_comm_exposed``, the part no compute hides. Plan files of earlier autopar
            versions have no ``overlap_slowdown`` or ``dp_copies``.
        memory_breakdown: bytes by component on the peak GPU (:class:`MemoryBreakdown`).
        stage_memory_bytes: peak bytes of each pipeline rank.
        stage_time_s: seconds per micro-batch (forward + backward) of each pipeline rank.
        comm_by_link: per link class that carries any (sorted by name), the bytes on the wire
            per step that one GPU of the slowest pipeline rank sends (and, in a ring, receives as
            much) in its collectives and pipeline sends, the seconds before overlap, and the
            mesh dimensions whose traffic it carries (:class:`LinkComm`; a DP group spanning
            nodes also reduces over NVLink inside each node). Plan files hold it as
            ``comm_bytes_by_link``, ``comm_seconds_by_link`` and ``comm_dims_by_link``.
        peak_stage: index of the pipeline rank with the most memory.
        stage_fwd_s / stage_bwd_s: per pipeline rank, seconds of one micro-batch's forward and
            backward (incl. recompute, TP/CP communication, pipeline sends and the host issue
            time no GPU work hides) over all its chunks.
        stage_wgrad_s: per pipeline rank, the weight-gradient part of ``stage_bwd_s`` (what a
            zero-bubble schedule runs as its separate W pass); empty in older plan files.
        stage_memory_breakdown: per pipeline rank, bytes by component (as memory_breakdown).
        group_links: the bottleneck link class each mesh dimension's groups cross, from the
            rank placement (:class:`GroupLinks`); None in plan files that lack it.
        error_band: the expected relative error of ``step_time_s`` for this regime (framework
            x precision x GPU generation x sharding kind x dense/MoE x scale and model size
            buckets, :class:`autopar.cost.regime.Regime`), from the published runs' residuals
            (:class:`autopar.cost.regime.ErrorBand`; "± unknown" with ``half_width`` None
            where too few published runs validate the regime); None in older plan files.
        warnings: plausibility warnings, e.g. an MFU above the best published for this GPU
            generation, framework and precision (:func:`autopar.cost.regime.plausibility_warnings`).
    """

    config: ParallelConfig
    step_time_s: float
    mfu: float
    hfu: float
    tokens_per_s: float
    memory_per_gpu_bytes: float
    memory_limit_bytes: float
    fits: bool
    num_micro_batches: int
    model_flops_per_step: float
    time_breakdown: TimeBreakdown
    memory_breakdown: MemoryBreakdown
    stage_memory_bytes: tuple[float, ...]
    stage_time_s: tuple[float, ...]
    comm_by_link: tuple[LinkComm, ...]
    peak_stage: int = 0
    group_links: GroupLinks | None = None
    stage_fwd_s: tuple[float, ...] = ()
    stage_bwd_s: tuple[float, ...] = ()
    stage_wgrad_s: tuple[float, ...] = ()
    stage_memory_breakdown: tuple[MemoryBreakdown, ...] = ()
    flops_convention: str = FLOPS_CONVENTION
    # -- how far to trust the numbers (issue 13; autopar.cost.regime) ------------------------
    error_band: ErrorBand | None = None
    warnings: tuple[str, ...] = ()

    @property
    def seconds_per_billion_tokens(self) -> float:
        """Wall-clock seconds to train on 1e9 tokens at this throughput."""
        return 1e9 / self.tokens_per_s if self.tokens_per_s > 0 else float("inf")

    def link_comm(self, link: str) -> LinkComm:
        """The traffic of link class ``link`` (zero bytes and seconds when it carries none)."""
        for lc in self.comm_by_link:
            if lc.link == link:
                return lc
        return LinkComm(link, 0.0, 0.0, ())

    #: Keys of the plan file's estimate object, in the order :meth:`to_dict` writes them.
    JSON_KEYS = ("config", "step_time_s", "mfu", "hfu", "tokens_per_s", "memory_per_gpu_bytes",
                 "memory_limit_bytes", "fits", "num_micro_batches", "model_flops_per_step",
                 "time_breakdown", "memory_breakdown", "stage_memory_bytes", "stage_time_s",
                 "comm_bytes_by_link", "comm_seconds_by_link", "peak_stage", "group_links",
                 "comm_dims_by_link", "stage_fwd_s", "stage_bwd_s", "stage_wgrad_s",
                 "stage_memory_breakdown", "flops_convention", "error_band", "warnings")

    def to_dict(self) -> dict:
        """Plain-JSON form: the keys of :data:`JSON_KEYS`, breakdowns as dicts (the layout plan
        files have always had)."""
        links = self.comm_by_link
        dims = (None if any(lc.dims is None for lc in links) else
                {lc.link: lc.dims for lc in links})
        d = {
            "config": self.config.to_dict(),
            "step_time_s": self.step_time_s, "mfu": self.mfu, "hfu": self.hfu,
            "tokens_per_s": self.tokens_per_s,
            "memory_per_gpu_bytes": self.memory_per_gpu_bytes,
            "memory_limit_bytes": self.memory_limit_bytes, "fits": self.fits,
            "num_micro_batches": self.num_micro_batches,
            "model_flops_per_step": self.model_flops_per_step,
            "time_breakdown": self.time_breakdown.as_dict(),
            "memory_breakdown": self.memory_breakdown.as_dict(),
            "stage_memory_bytes": list(self.stage_memory_bytes),
            "stage_time_s": list(self.stage_time_s),
            "comm_bytes_by_link": {lc.link: lc.nbytes for lc in links},
            "comm_seconds_by_link": {lc.link: lc.seconds for lc in links},
            "peak_stage": self.peak_stage,
            "group_links": (self.group_links.as_dict() if self.group_links is not None
                            else None),
            "comm_dims_by_link": dims,
            "stage_fwd_s": list(self.stage_fwd_s), "stage_bwd_s": list(self.stage_bwd_s),
            "stage_wgrad_s": list(self.stage_wgrad_s),
            "stage_memory_breakdown": [m.as_dict() for m in self.stage_memory_breakdown],
            "flops_convention": self.flops_convention,
            "error_band": asdict(self.error_band) if self.error_band is not None else None,
            "warnings": tuple(self.warnings),
        }
        return d
