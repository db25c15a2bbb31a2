"""The search's objective: the fastest plan by the model, or the robust choice (the default).

The cost model errs (issue 25: 13-23% MAPE on runs nobody here tuned to, mostly predicting too
fast), and a search that takes the model's fastest plan exploits those errors: a plan with one
more parallel dimension that the model finds 3% faster is not faster where the model's error is
10%. The **robust** objective (:func:`robust_result`) therefore prefers a simpler plan whose
accuracy the published runs validate whenever the fastest plan's advantage over it is inside the
fastest plan's own error band:

- **Simpler**: fewer parallel dimensions of degree > 1 among tp, cp, pp, dp and ep
  (:func:`dims`, the first field of :func:`autopar.search.ranking.simplicity_key`).
- **Validated**: the plan's error band is its regime's validated band
  (:attr:`autopar.cost.regime.ErrorBand.validated`: at least
  :data:`autopar.cost.regime.VALIDATED_RUNS` published runs from
  :data:`autopar.cost.regime.VALIDATED_SOURCES` sources of its regime: framework, precision, GPU
  generation, sharding kind, dense/MoE, scale and model size buckets).
- **The fastest plan's band** (:func:`trusted_band`): its validated half-width; for an
  unvalidated regime, the corpus-wide band (:func:`stand_in_half_width`: the cell pooled over
  every field, i.e. the 68% quantile of the absolute leave-one-source-out residual over every
  development run). With no evidence about the regime, a run drawn from the whole corpus is the
  best description of its error. (The widest validated cell is not used: keyed by scale and
  model size, it can be a regime no plan of this problem resembles, e.g. a 64M-parameter test
  model whose step is all fixed costs.)
- **Candidates**: the fitting plans the search kept (its top plans and its time/memory Pareto
  front) and, when the fastest plan uses two or more dimensions, the top plans and Pareto front
  of one extra search restricted to meshes of fewer dimensions (and, where the corpus validates
  no tensor- or pipeline-parallel regime of this framework, precision, GPU, model and scale, to
  meshes without them: :func:`simpler_pins`). A simpler validated plan outside those is not
  considered.
- **Rule**: among the candidates that are simpler than the fastest plan F, validated, and no
  more than F's band slower (``t / t_F - 1 <= half-width``), the one with the fewest dimensions
  wins, then the fastest of those, then :func:`autopar.search.ranking.simplicity_key`. When it
  exists it is returned, and F is listed first among the alternatives with the note of
  :func:`passed_over_note`; otherwise F is returned, as the ``"fastest"`` objective does.

Deterministic: the searches are, and the choice is a total order over their results.
"""

from __future__ import annotations

from dataclasses import replace

from ..cost import published
from ..cost.model import CostModel
from ..cost.regime import ANY, FIELDS, Regime, band_for
from ..cost.types import Estimate
from ..errors import AutoparError, InvalidSearchOption
from . import space
from .margin import search_with_margin
from .optimize import SearchResult
from .ranking import PARALLEL_DIMS, simplicity_key, tied

#: The objectives ``optimize(..., objective=...)`` and ``autopar plan --objective`` accept; the
#: first is the default.
OBJECTIVES = ("robust", "fastest")


def check_objective(objective) -> str:
    """``objective`` if it is one of :data:`OBJECTIVES`.

    Raises:
        InvalidSearchOption: anything else.
    """
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise InvalidSearchOption(
            f"objective must be one of {list(OBJECTIVES)}; got {objective!r}. Fix: "
            "objective='robust' (the default: a simpler, validated plan when the fastest one's "
            "advantage is inside its error band) or objective='fastest' (the model's fastest).")
    return objective


def dims(e: Estimate) -> int:
    """Parallel dimensions of degree > 1 (tp, cp, pp, dp, ep) of ``e``'s configuration."""
    return sum(1 for d in PARALLEL_DIMS if getattr(e.config, d) > 1)


def validated(e: Estimate) -> bool:
    """True when ``e``'s error band is its regime's validated band."""
    band = e.error_band
    return band is not None and band.validated


def stand_in_half_width() -> float | None:
    """The corpus-wide band's half-width: the cell of :data:`autopar.cost.published.BANDS`
    pooled over every field (all runs of the development split); None when the table has no
    such cell. Read at each call."""
    row = published.BANDS.get((ANY,) * len(FIELDS))
    return row[0] if row else None


def trusted_band(e: Estimate) -> tuple[float | None, bool]:
    """(half-width, validated) of the band a faster plan's advantage is judged against: its own
    validated half-width, or for an unvalidated regime :func:`stand_in_half_width` (None when
    the corpus validates no regime)."""
    if validated(e):
        return e.error_band.half_width, True
    return stand_in_half_width(), False


def band_text(e: Estimate) -> str:
    """"± 7%", or, in an unvalidated regime, "± 12%, the corpus-wide band; this plan's own
    error is unknown": the rule needs a width, the estimate's band still says it has none."""
    half, own = trusted_band(e)
    if half is None:
        return "± unknown"
    if own:
        return f"± {half * 100:.0f}%"
    return f"± {half * 100:.0f}%, the corpus-wide band; this plan's own error is unknown"


def advantage(fast: Estimate, slow: Estimate) -> float:
    """How much faster ``fast`` is than ``slow`` by the model: ``t_slow / t_fast - 1``."""
    return slow.step_time_s / fast.step_time_s - 1


def choose(fastest: Estimate, candidates) -> Estimate | None:
    """The simpler validated plan the robust rule returns instead of ``fastest`` (module
    docstring), or None when ``fastest`` stands."""
    half, _own = trusted_band(fastest)
    if half is None:
        return None
    d = dims(fastest)
    inside = [c for c in candidates if c.fits and dims(c) < d and validated(c)
              and (tied(c.step_time_s, fastest.step_time_s)
                   or advantage(fastest, c) <= half)]
    if not inside:
        return None
    return min(inside, key=lambda c: (dims(c), c.step_time_s, *simplicity_key(c)))


def validated_kinds(cm: CostModel) -> set[str]:
    """The sharding kinds (:func:`autopar.cost.regime.sharding_kind`) whose regime, for ``cm``'s
    framework, precision, GPU, model (dense/MoE, size bucket) and cluster (scale bucket), the
    corpus validates: the regimes a simpler plan of the same problem would have."""
    return {k for k in ("data", "fsdp", "tensor", "pipeline")
            if band_for(Regime.of_kind(cm.train, cm.cluster, cm.graph, k)).validated}


def simpler_pins(kinds: set[str], fixed: dict | None) -> dict:
    """Pins for the extra search of simpler plans, given the validated sharding ``kinds``
    (:func:`validated_kinds`): pp = 1 where no pipeline regime is validated, and tp = cp = 1
    too where no tensor regime is either (only data-parallel plans can then be validated); a
    choice the caller pinned is kept."""
    pins: dict = {}
    if "pipeline" not in kinds:
        pins["pp"] = 1
        if "tensor" not in kinds:
            pins.update(tp=1, cp=1)
    return {**pins, **dict(fixed or {})}


def robust_result(cm: CostModel, result: SearchResult, fixed: dict | None = None, *,
                  memory_margin: float | None = None, time_limit_s: float | None = None,
                  top_k: int = 6) -> SearchResult:
    """``result`` (a search of ``cm`` with ``fixed``, at ``memory_margin``) under the robust
    objective: unchanged when its best plan stands, else with the simpler validated plan as
    ``best`` and ``top`` = (that plan, the fastest plan, the rest of ``result.top``), at most
    ``top_k`` long (module docstring). The extra search of simpler meshes runs with the same
    ``fixed`` choices (:func:`simpler_pins` added), ``memory_margin`` and ``time_limit_s``;
    when it finds nothing, or is interrupted, the kept plans alone are the candidates."""
    fastest = result.best
    candidates = list(result.top) + list(result.pareto)
    kinds = validated_kinds(cm) if dims(fastest) >= 2 else set()
    if kinds:   # else no simpler plan can be validated: no extra search
        limits = space.SpaceLimits(max_dims=dims(fastest) - 1)
        try:
            extra = search_with_margin(cm, simpler_pins(kinds, fixed), memory_margin=memory_margin,
                                       time_limit_s=time_limit_s, top_k=top_k, limits=limits)
            candidates += list(extra.top) + list(extra.pareto)
        except (AutoparError, KeyboardInterrupt):
            pass   # nothing simpler fits (or the user stopped it): the kept plans decide
    chosen = choose(fastest, candidates)
    if chosen is None:
        return result
    rest = [e for e in result.top if e.config != chosen.config and e.config != fastest.config]
    top = (chosen, fastest, *rest)[:max(top_k, 2)]
    return replace(result, best=chosen, top=top)


def passed_over(estimate: Estimate, alternatives, objective: str) -> Estimate | None:
    """The fastest plan the robust objective passed over for ``estimate`` (the first of
    ``alternatives`` when it is faster), or None."""
    if objective != "robust" or not alternatives:
        return None
    a = alternatives[0]
    if a.step_time_s < estimate.step_time_s and not tied(a.step_time_s, estimate.step_time_s):
        return a
    return None


def passed_over_note(estimate: Estimate, faster: Estimate) -> str:
    """"X% faster by the model, inside its band (± Y%): not trusted over a simpler, validated
    plan" for the plan ``faster`` the robust objective passed over for ``estimate``.

    X is ``1 - t_faster / t_estimate``, the alternatives' "vs chosen" figure
    (:func:`autopar.report.summary.gap_text`) without its minus sign, so the note and the table
    agree; the rule itself (:func:`choose`) compares :func:`advantage`, ``t_estimate /
    t_faster - 1``, which is larger, with the band, so X is inside the band whenever the rule
    applied."""
    pct = 100 * (1 - faster.step_time_s / estimate.step_time_s)
    return (f"{pct:.{1 if pct >= 0.1 else 3}f}% faster by the model, inside its band "
            f"({band_text(faster)}): not trusted over a simpler, validated plan")


def objective_text(estimate: Estimate, alternatives, objective: str) -> str:
    """One line saying which objective chose the plan and how."""
    if objective == "fastest":
        return ("fastest: the model's fastest plan (the default, robust, returns a simpler plan "
                "of a validated regime instead when one comes within this plan's error band)")
    faster = passed_over(estimate, alternatives, objective)
    if faster is None:
        return ("robust: the model's fastest plan; no simpler validated plan came within its "
                f"error band ({band_text(estimate)})")
    return (f"robust: a simpler plan of a validated regime ({dims(estimate)} parallel "
            f"dimension{'s' if dims(estimate) != 1 else ''} against {dims(faster)}); the "
            f"fastest, alternative 1, is {passed_over_note(estimate, faster)}")
