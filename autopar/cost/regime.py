"""How far to trust an estimate: its expected error band and whether its MFU is plausible.

Both come from the published-run corpus (``benchmarks/data/*.json``) through tables that a
benchmark script generates into :mod:`autopar.cost.published` (``python -m benchmarks.bands
--write``; ``tests/test_bands.py`` fails when the tables drift from the corpus). This module
holds the rules: what a *regime* is, how a band is computed from residuals, and when a regime's
published runs validate it (else its band is unknown: no coarser cell stands in).

- **Regime** (:class:`Regime`): issue 25's regime, framework x precision x GPU generation x
  sharding kind x dense/MoE x scale bucket (nodes: :func:`scale_bucket`) x model size bucket
  (parameters: :func:`size_bucket`). The same plan runs at different speeds in different
  frameworks and the cost model's error differs with them (``python -m benchmarks.accuracy
  --cv source``: bias from -27% to +7% by source), and with the model's size and the cluster's
  scale (on the development split, Megatron's 64M-parameter CI runs on one Hopper node were
  predicted about 88% too fast, its pipeline runs of >100B models on more than 64 Hopper nodes
  within 7%), so a band is per regime: a small model's or a single node's residuals never
  widen, or narrow, a large plan's band, and a MoE plan never takes a dense one's.
- **Error band** (:class:`ErrorBand`): over the regime's published runs, the residuals
  ``e = (predicted - measured) / measured`` of the step time, each predicted leave-one-source-
  out (autopar fits no constant to the corpus, :data:`benchmarks.validation.FITTED_CONSTANTS`
  is empty, so every prediction is already out of sample). The half-width is the
  nearest-rank :data:`BAND_QUANTILE` quantile of ``|e|`` (the share of a normal distribution
  within one standard deviation: "about two of three runs like this one landed within it"),
  reported with the mean signed residual (the bias).
- **Validated regimes only** (issue 25): an estimate's band is its own regime's, and only where
  at least :data:`VALIDATED_RUNS` published runs from :data:`VALIDATED_SOURCES` sources
  validate it; elsewhere the band says "unvalidated regime: ± unknown" rather than borrowing a
  coarser cell's (another regime's error is not this one's: the runs nobody here tuned to
  missed by 15-25% in regimes whose borrowed band read ± 7%). The generated table still holds
  the coarser cells (:data:`LEVELS`, at least :data:`MIN_RECORDS` runs) for reports.
- **Plausibility**: the best MFU measured in the corpus per framework x precision x GPU
  generation, in autopar's FLOPs convention (:data:`autopar.cost.types.FLOPS_CONVENTION`:
  the model FLOPs autopar counts for the run's model over its *measured* step time, so the
  published figures' own conventions do not mix in). An estimate above it carries a warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..frameworks import band_framework
from ..hardware.gpu import band_generation
from . import published

#: Quantile of |residual| a band's half-width covers: 0.6827, the mass of a normal
#: distribution within one standard deviation (a non-parametric "one sigma").
BAND_QUANTILE = 0.6827
#: Fewest published runs a cell needs to give a band (a nearest-rank 68% quantile of fewer
#: than 5 values is the largest or second largest of them).
MIN_RECORDS = 5
#: Fewest published runs, and independent sources, of its own regime an estimate's band needs.
#: With n runs, the share of new runs a 68% band built from them covers has a standard error of
#: about sqrt(0.68 x 0.32 / n): 0.15 at n = 10 (so the band's 68% is 53-83%), 0.21 at n = 5.
#: Two sources, because leave-one-source-out residuals of a single source measure only how
#: consistent that source is with itself under the model, not how the model carries over.
VALIDATED_RUNS = 10
VALIDATED_SOURCES = 2
#: The fields of a regime's key (:meth:`Regime.key`), in order.
FIELDS = ("framework", "precision", "gpu", "sharding", "experts", "scale", "size")
_POOLED = (False, False, False)   # experts, scale and size pooled
#: Cells the generated table holds, from the regime itself to the pooled one: which of
#: :data:`FIELDS` each keeps ("*" stands for the dropped ones). Only the first two give an
#: estimate its band (:func:`band_for`): the full regime, and the same regime pooled over
#: frameworks, the cell of a stack banded with no framework of its own
#: (:data:`autopar.frameworks.BAND_FRAMEWORK` "*"). The coarser ones, which pool the experts,
#: scale and size buckets too, are for reports.
LEVELS: tuple[tuple[bool, ...], ...] = (
    (True,) * 7, (False,) + (True,) * 6) + tuple(level + _POOLED for level in (
    (True, True, True, True), (True, True, True, False), (True, True, False, False),
    (True, False, False, False), (False, True, True, True), (False, True, True, False),
    (False, True, False, False), (False, False, False, False)))
ANY = "*"
#: Scale buckets (issue 25 item 1), by the nodes the plan spans (the cluster's): one node (no
#: inter-node link in any group), up to 64 nodes, more than 64.
SCALE_BUCKETS = ("1 node", "2-64 nodes", ">64 nodes")
#: Model size buckets by total parameters (:attr:`autopar.graph.types.ModelGraph.
#: num_parameters`, all experts counted): (upper bound, name); a bucket holds its lower bound
#: and excludes its upper one (3e9 is "3-30B"); 100e9 and more is ">100B".
SIZE_BUCKETS = ((3e9, "<3B"), (30e9, "3-30B"), (100e9, "30-100B"), (math.inf, ">100B"))


def gpu_generation(device_name: str) -> str:
    """The generation an estimate on a GPU named ``device_name`` is banded by:
    :func:`autopar.hardware.gpu.band_generation` (its architecture, e.g. "A100-SXM4-80GB" ->
    "ampere", or the part's own where its balance of compute to memory sets it apart, "H20-96GB"
    -> "hopper-h20"); the lower-cased name itself for a GPU that function does not know (it
    then matches no published run). A generation without published runs (the Blackwell and
    CDNA 3/4 parts at this writing) has no band: its estimates say "± unknown (unvalidated
    regime)"."""
    gen = band_generation(device_name)
    return device_name.lower() if gen == "unknown" else gen


def sharding_kind(tp: int, pp: int, cp: int, zero_stage: int | None) -> str:
    """The plan's dominant kind of sharding: "pipeline" (pp > 1), "tensor" (tp or cp > 1,
    no pipeline), "fsdp" (data parallel with ZeRO-3) or "data" (data parallel, ZeRO 0-2)."""
    if pp > 1:
        return "pipeline"
    if tp > 1 or cp > 1:
        return "tensor"
    return "fsdp" if zero_stage == 3 else "data"


def scale_bucket(num_nodes: int) -> str:
    """The scale bucket (:data:`SCALE_BUCKETS`) of a plan spanning ``num_nodes`` nodes:
    "1 node" (1 or fewer), "2-64 nodes" (2 to 64 inclusive) or ">64 nodes"."""
    return "1 node" if num_nodes <= 1 else "2-64 nodes" if num_nodes <= 64 else ">64 nodes"


def size_bucket(params: float) -> str:
    """The size bucket (:data:`SIZE_BUCKETS`) of a model of ``params`` parameters: "<3B",
    "3-30B", "30-100B" or ">100B" (each holds its lower bound: 3e9 is "3-30B")."""
    return next(name for bound, name in SIZE_BUCKETS if params < bound)


def experts_kind(num_experts: int) -> str:
    """"moe" for a model with more than one expert per MoE block, else "dense"."""
    return "moe" if (num_experts or 0) > 1 else "dense"


@dataclass(frozen=True)
class Regime:
    """What an estimate's accuracy depends on.

    Attributes:
        framework: the framework whose published runs band the plan's
            (:func:`autopar.frameworks.band_framework` of the training framework), or "*".
        precision: the training precision (:data:`autopar.config.PRECISIONS`).
        gpu: the GPU generation (:func:`gpu_generation`).
        sharding: the sharding kind (:func:`sharding_kind`).
        experts: "dense" or "moe" (:func:`experts_kind`).
        scale: the scale bucket (:func:`scale_bucket`).
        size: the model size bucket (:func:`size_bucket`).
    """

    framework: str
    precision: str
    gpu: str
    sharding: str
    experts: str
    scale: str
    size: str

    @classmethod
    def of(cls, train, cluster, graph, config) -> "Regime":
        """The regime of a resolved ``config`` for ``train`` (a TrainingConfig) of the model
        ``graph`` (a :class:`~autopar.graph.types.ModelGraph`) on ``cluster``."""
        return cls.of_kind(train, cluster, graph,
                           sharding_kind(config.tp, config.pp, config.cp, config.zero_stage))

    @classmethod
    def of_kind(cls, train, cluster, graph, sharding: str) -> "Regime":
        """The regime of a plan of sharding kind ``sharding`` for ``train`` of ``graph`` on
        ``cluster``: the plan spans the cluster's nodes (the search uses every GPU), the size is
        the graph's total parameters, MoE when any block has more than one expert."""
        return cls(band_framework(train.framework), train.precision,
                   gpu_generation(cluster.device.name), sharding,
                   experts_kind(graph.num_experts), scale_bucket(cluster.num_nodes),
                   size_bucket(graph.num_parameters))

    def key(self) -> tuple[str, ...]:
        """The values of :data:`FIELDS`, in order."""
        return tuple(getattr(self, f) for f in FIELDS)


def cell_text(cell: tuple[str, ...]) -> str:
    """A cell for people: "megatron bf16 hopper pipeline, dense, 1 node, <3B parameters" (the
    pooled fields left out; "all published runs" when every field is)."""
    experts, size = FIELDS.index("experts"), FIELDS.index("size")
    head = " ".join(c for c in cell[:experts] if c != ANY)
    tail = [c for c in cell[experts:size] if c != ANY]
    if len(cell) > size and cell[size] != ANY:
        tail.append(f"{cell[size]} parameters")
    return ", ".join(p for p in (head, *tail) if p) or "all published runs"


def cell(key: tuple[str, ...], level: tuple[bool, ...]) -> tuple[str, ...]:
    """``key`` with the fields ``level`` drops replaced by :data:`ANY`."""
    return tuple(k if keep else ANY for k, keep in zip(key, level))


def measured_range(residuals: list[float], q: float = BAND_QUANTILE) -> tuple[float, float]:
    """(low, high): the nearest-rank (1 - q) / 2 and (1 + q) / 2 quantiles of measured /
    predicted step time, ``1 / (1 + e)`` for each residual ``e = (predicted - measured) /
    measured``, rounded to 4 decimals: the middle ``q`` of the runs measured between ``low`` and
    ``high`` times the prediction (unlike the half-width, it shows which side they fell on).

    Raises:
        ValueError: no residuals.
    """
    ratios = [1.0 / (1.0 + e) for e in residuals]
    return (round(nearest_rank(ratios, (1.0 - q) / 2), 4),
            round(nearest_rank(ratios, (1.0 + q) / 2), 4))


def nearest_rank(values: list[float], q: float = BAND_QUANTILE) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (the ceil(q n)-th smallest; Hyndman and Fan
    1996, definition 1).

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("nearest_rank of no values")
    s = sorted(values)
    k = max(1, math.ceil(q * len(s) - 1e-9))
    return s[k - 1]


@dataclass(frozen=True)
class ErrorBand:
    """The expected relative error of an estimate's step time.

    Attributes:
        half_width: the band is step_time_s * (1 +- half_width) (a fraction, e.g. 0.09); None
            for an unvalidated regime (:func:`band_for`), whose ``bias`` is None too.
        bias: mean signed residual (predicted - measured) / measured of the cell's runs
            (negative: the runs took longer than predicted).
        records: published runs in the cell; sources: independent sources among them (0 and 0
            when the cell has fewer than :data:`MIN_RECORDS`).
        cell: the regime's key (:data:`FIELDS`: framework, precision, gpu, sharding, experts,
            scale, size).
        quantile: the share of the cell's runs whose |residual| is within half_width.
        measured_range: (low, high): the middle ``quantile`` of the cell's runs measured between
            low and high times the predicted step time (:func:`measured_range`); None where
            unvalidated.
    """

    half_width: float | None
    bias: float | None
    records: int
    sources: int
    cell: tuple[str, ...]
    quantile: float = BAND_QUANTILE
    measured_range: tuple[float, float] | None = None

    @property
    def validated(self) -> bool:
        """False for an unvalidated regime (no band: ``half_width`` and ``bias`` None)."""
        return self.half_width is not None

    def text(self) -> str:
        """"± 9%" (the half-width in whole percent, rounded up), or "± unknown (unvalidated
        regime)"."""
        if self.half_width is None:
            return "± unknown (unvalidated regime)"
        # rounded up: the text never claims less error than the regime's out-of-sample band
        return f"± {math.ceil(self.half_width * 100 - 1e-9):.0f}%"

    def describe(self) -> str:
        """One line: the band, the cell and its runs, the bias."""
        where = cell_text(self.cell)
        if self.half_width is None:
            # the table keeps no cell under MIN_RECORDS runs, so a smaller count is not known
            runs = (f"at most {MIN_RECORDS - 1} published runs" if self.records < MIN_RECORDS
                    else f"{self.records} published runs from {self.sources} source"
                         f"{'s' if self.sources != 1 else ''}")
            return (f"unvalidated regime ({where}): {runs}, where a band needs at least "
                    f"{VALIDATED_RUNS} runs from {VALIDATED_SOURCES} sources; the error here is "
                    "unknown, and another regime's band would not say it")
        middle = ""
        if self.measured_range is not None:
            low, high = self.measured_range
            middle = (f"; the middle {self.quantile:.0%} of them took {low:.2f}-{high:.2f} "
                      "times the predicted step time")
        return (f"{self.text()}: {self.quantile:.0%} of {self.records} published runs ({where}; "
                f"{self.sources} source{'s' if self.sources != 1 else ''}) were within it; "
                f"their mean error {self.bias * 100:+.0f}% (predicted vs measured){middle}")


@dataclass(frozen=True)
class MfuCeiling:
    """The best MFU published for a framework x precision x GPU generation x experts kind, in
    autopar's FLOPs convention (model FLOPs over the measured step time).

    Attributes:
        mfu: the fraction; record: the corpus record's id; source: its source;
        cell: (framework, precision, gpu, experts), "*" for a framework pooled.
    """

    mfu: float
    record: str
    source: str
    cell: tuple[str, str, str]


def validates(records: int, sources: int) -> bool:
    """Whether a cell of ``records`` published runs from ``sources`` independent sources
    validates its regime: at least :data:`VALIDATED_RUNS` and :data:`VALIDATED_SOURCES`."""
    return records >= VALIDATED_RUNS and sources >= VALIDATED_SOURCES


@lru_cache(maxsize=None)
def band_for(regime: Regime) -> ErrorBand:
    """The error band of the regime's own cell (all of :data:`FIELDS`) when at least
    :data:`VALIDATED_RUNS` published runs from :data:`VALIDATED_SOURCES` sources validate it;
    else an unvalidated band (no half-width, the runs and sources the cell has, often none):
    never a coarser cell's, nor another scale's or size's."""
    row = published.BANDS.get(regime.key())
    if row is None:   # the table holds cells of MIN_RECORDS runs or more
        return ErrorBand(None, None, 0, 0, regime.key())
    half, bias, n, sources = row
    if not validates(n, sources):
        return ErrorBand(None, None, n, sources, regime.key())
    return ErrorBand(half, bias, n, sources, regime.key(),
                     measured_range=published.MEASURED_RANGES.get(regime.key()))


@lru_cache(maxsize=None)
def mfu_ceiling(framework: str, precision: str, gpu: str,
                experts: str = "dense") -> MfuCeiling | None:
    """The best published MFU for this framework, precision, GPU generation and ``experts``
    kind ("dense" or "moe": a dense plan is never held to an MoE run's figure, nor the other
    way); for a framework without published runs there, the best of any framework; None
    without runs."""
    for c in ((framework, precision, gpu, experts), (ANY, precision, gpu, experts)):
        row = published.MFU_CEILINGS.get(c)
        if row is not None:
            return MfuCeiling(row[0], row[1], row[2], c)
    return None


def plausibility_warnings(mfu: float, regime: Regime) -> tuple[str, ...]:
    """Warnings for an MFU above the best one the corpus measured in its regime's framework,
    precision, GPU generation and experts kind (:func:`mfu_ceiling`; none when below or when
    the corpus has no run of that precision, GPU generation and kind). The text names the cell
    compared (the framework, or any framework when it has no run there) and the shared
    convention of both figures."""
    best = mfu_ceiling(regime.framework, regime.precision, regime.gpu, regime.experts)
    if best is None or mfu <= best.mfu:
        return ()
    who = (regime.framework if best.cell[0] != ANY else
           f"any framework ({regime.framework} has no run there)")
    kind = "mixtures of experts" if regime.experts == "moe" else "dense models"
    ours, theirs = distinct_percents(mfu, best.mfu)
    return (f"MFU {ours} exceeds the best measured in autopar's corpus of published runs for "
            f"{regime.precision} {kind} on {regime.gpu.capitalize()} GPUs, {who}: {theirs} "
            f"({best.record}); both are model FLOPs (recomputation excluded) over the step "
            "time, against the GPU's dense peak: the estimate is likely optimistic (its step "
            "time too short)",)


def distinct_percents(a: float, b: float, max_decimals: int = 6) -> tuple[str, str]:
    """Fractions ``a`` and ``b`` as percentages with one decimal, or the fewest more decimals
    (up to ``max_decimals``) at which the two texts differ when ``a != b`` ("45.7%" vs "45.7%"
    for 0.45712 and 0.45695 read as a tie: "45.71%" vs "45.70%")."""
    for d in range(1, max_decimals + 1):
        ta, tb = f"{a * 100:.{d}f}%", f"{b * 100:.{d}f}%"
        if ta != tb or a == b:
            break
    return ta, tb


def memory_band(moe: bool = False) -> tuple[float, float, int, float, float] | None:
    """The measured peak-memory band of dense models (:data:`published.MEMORY_BAND`) or of
    mixtures of experts (:data:`published.MOE_MEMORY_BAND`): (half-width, mean signed error,
    runs, largest under-prediction, the growth over prediction that :data:`BAND_QUANTILE` of
    the runs stayed within; the last two as measured / predicted - 1); None when the corpus
    has no memory runs."""
    return getattr(published, "MOE_MEMORY_BAND" if moe else "MEMORY_BAND", None)


def room_for(growth: float) -> float:
    """The share of a GPU's memory, rounded up to a whole percent, to keep free so that a peak
    ``growth`` (a fraction, measured / predicted - 1) above its prediction still fits: a plan at
    (1 - m) of the capacity grows to (1 - m)(1 + growth) <= 1 when m >= growth / (1 + growth)."""
    return math.ceil(round(growth / (1 + growth) * 100, 6)) / 100


#: Largest memory margin a search accepts: beyond half the memory a plan is no longer about the
#: GPU asked for.
MAX_MEMORY_MARGIN = 0.5


def default_margin(moe: bool = False) -> float:
    """The memory margin searches keep by default (:mod:`autopar.search.margin`): the share
    s / (1 + s) of the GPU that a peak s above its prediction takes, for s the growth over
    prediction that 68% of the measured runs of the model's kind (dense or mixture of experts)
    stayed within (:func:`memory_band`), rounded up to a whole percent (:func:`room_for`); 0
    when the corpus has no such runs. A plan at (1 - margin) of the GPU then still fits when its
    peak is s above prediction, as 68% of the measured runs' peaks were at most."""
    band = memory_band(moe)
    return min(room_for(band[4]), MAX_MEMORY_MARGIN) if band else 0.0


def headroom_warnings(memory_bytes: float, limit_bytes: float,
                      moe: bool = False) -> tuple[str, ...]:
    """A warning when a fitting estimate's peak ``memory_bytes`` leaves less of ``limit_bytes``
    (both bytes per GPU) free than the model kind's :func:`memory_band`: the peak memory
    predictions of the measured runs were off by more than that for a third of them, so such a
    plan may not fit on the first try. None when it does not fit (that verdict says it) or
    when the corpus has no memory runs."""
    band = memory_band(moe)
    if band is None or memory_bytes > limit_bytes or memory_bytes <= 0:
        return ()
    half, bias, runs, worst, short = band
    free = limit_bytes / memory_bytes - 1   # how much the peak may grow before it overflows
    if free >= short:
        return ()
    return (f"memory: {memory_bytes / 1e9:.1f} of {limit_bytes / 1e9:.1f} GB per GPU leaves "
            f"{free:.1%} for error, less than the {short:.1%} over prediction that "
            f"{BAND_QUANTILE:.0%} of {runs} measured runs' peaks stayed within (mean error "
            f"{bias:+.0%}, the worst measured {worst:.0%} above its prediction): it may not fit "
            "on the first try; a plan searched for the framework that runs it (autopar plan "
            f"--framework NAME) with memory_margin >= {room_for(short):g} (--memory-margin) keeps that "
            "free",)
