"""Megatron-LM's block recompute (--recompute-method block --recompute-num-layers N) in the
search: where no recompute does not fit, the smallest N that fits (autopar.search.first_n)."""

from __future__ import annotations

from types import SimpleNamespace

import autopar
from autopar.frameworks import get_profile
from autopar.frameworks.rules import first_n_modes
from autopar.search.first_n import first_n_estimate


def test_first_n_modes_per_chunk():
    assert first_n_modes((3, 2), 2) == ("full", "full", "none", "full", "full")
    assert first_n_modes((2, 2), 0) == ("none",) * 4


class _Run:
    """A search run whose estimate fits once every chunk recomputes at least ``need`` blocks
    and costs one second per recomputed block."""

    def __init__(self, need: int, first_n: bool = True):
        self.need, self.calls = need, []
        self.profile = SimpleNamespace(recompute_first_n=first_n)
        self.cm = SimpleNamespace(resolve=lambda c: c.replace(stage_blocks=(6, 6)))

    def estimate(self, c):
        modes = c.recompute
        n = sum(1 for m in modes[:6] if m == "full")
        self.calls.append(n)
        return SimpleNamespace(fits=n >= self.need, step_time_s=float(n), n=n)


def test_the_smallest_fitting_n_by_bisection():
    c = autopar.ParallelConfig(tp=1, pp=2, dp=1)
    run = _Run(need=3)
    e = first_n_estimate(run, c, ("none", "selective", "full"))
    assert e.n == 3 and len(run.calls) <= 3 and 6 not in run.calls
    assert first_n_estimate(_Run(need=6), c, ("none", "full")) is None   # only "full" fits
    assert first_n_estimate(_Run(need=1, first_n=False), c, ("none", "full")) is None
    assert first_n_estimate(_Run(need=1), c, ("none", "selective")) is None


def test_megatron_search_recomputes_the_fewest_blocks_that_fit():
    """A plan where Megatron-LM must recompute something: the search's plan under megatron is
    at least as fast as its best uniform policy, and a first-N mix it returns is one Megatron
    runs (the profile accepts it) and exports as --recompute-method block."""
    train = autopar.TrainingConfig(global_batch_size=512, seq_len=8192, framework="megatron")
    fixed = dict(tp=4, pp=8, zero_stage=0, sequence_parallel=True)
    plan = autopar.optimize("llama3-70b", "4x8xH100", train, fixed=fixed)
    uniform = min((autopar.estimate("llama3-70b", "4x8xH100", train,
                                    autopar.ParallelConfig(**fixed, recompute=m))
                   for m in ("selective", "full")),
                  key=lambda e: (not e.fits, e.step_time_s))
    assert plan.estimate.fits and plan.estimate.step_time_s <= uniform.step_time_s * (1 + 1e-9)
    # here none and selective recompute do not fit (94.7 GB) and full does (161 s): one block
    # of each chunk recomputed fits at 126 s
    rc = plan.config.recompute
    assert not isinstance(rc, str) and "none" in rc and "full" in rc
    assert plan.estimate.step_time_s < 0.9 * uniform.step_time_s
    assert get_profile("megatron").unsupported(plan.config) is None
    assert "--recompute-method block" in plan.to_megatron_args().text()
