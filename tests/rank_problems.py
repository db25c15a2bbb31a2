"""Small per-block recomputation problems of one pipeline rank for property tests: a hypothesis
strategy of blocks of 1-3 kinds with 4 modes each, and their brute-force answer
(tests/test_issue24_search.py, tests/test_issue26_search_speed.py)."""

from __future__ import annotations

import itertools
from collections import OrderedDict

from hypothesis import strategies as st

from autopar.search.rankcost import MODES, RankCosts

_T = st.sampled_from([1.0, 1.25, 1.5, 2.0, 2.5, 3.0])
_B = st.sampled_from([0, 1, 2, 3, 5, 8])
#: (blocks of the kind, seconds, activation bytes, transient bytes per mode) per kind
SIGS = st.lists(st.tuples(st.integers(1, 3), st.lists(_T, min_size=4, max_size=4),
                          st.lists(_B, min_size=4, max_size=4),
                          st.lists(_B, min_size=4, max_size=4)), min_size=1, max_size=3)
#: a floor or budget in the problems' byte units
BYTES = _B


def rank_problem(sigs, floor: float, budget: float, fixed_s: float = 0.0) -> RankCosts:
    """The :class:`RankCosts` of ``sigs`` (a :data:`SIGS` draw), kind i's blocks numbered
    10 i, 10 i + 1, ..."""
    costs = [(k, dict(zip(MODES, t)), dict(zip(MODES, map(float, a))),
              dict(zip(MODES, map(float, tr)))) for k, t, a, tr in sigs]
    by_sig = OrderedDict((f"s{i}", list(range(10 * i, 10 * i + k)))
                         for i, (k, *_r) in enumerate(costs))
    return RankCosts(0.0, fixed_s, float(floor), by_sig, costs, True, float(budget))


def brute(rc: RankCosts, modes) -> tuple[float, float] | None:
    """(seconds, bytes at the peak) of the fastest fitting per-block assignment, then least
    memory, by trying every mode for every block; None when none fits."""
    blocks = [(t, a, tr) for k, t, a, tr in rc.sigs for _ in range(k)]
    best = None
    for pick in itertools.product(modes, repeat=len(blocks)):
        time = sum(t[m] for (t, _a, _tr), m in zip(blocks, pick))
        acts = sum(a[m] for (_t, a, _tr), m in zip(blocks, pick))
        cap = max([rc.floor_bytes] + [tr[m] for (_t, _a, tr), m in zip(blocks, pick)])
        if acts + cap <= rc.budget_bytes and (best is None or (time, acts + cap) < best):
            best = (time, acts + cap)
    return best
