"""Pipeline schedules: step time of m micro-batches over p ranks with v chunks each.

Narayanan et al. 2021, section 2.2: for uniform stages of time t per micro-batch (forward +
backward), 1F1B and GPipe take (m + p - 1) t and interleaved 1F1B (m + (p - 1) / v) t; the bubble is
(p - 1) / (v m) of the ideal m t, i.e. (p - 1) / (v m + p - 1) of the total. For non-uniform stages
the slowest stage paces the steady state and the others fill the warm-up and cool-down:
``T = m * max_i t_i + (sum_i t_i - max_i t_i) / v``, which reduces to the uniform formula.
"""

from __future__ import annotations


def pipeline_time(stage_times: list[float] | tuple[float, ...], num_micro_batches: int,
                  virtual_stages: int = 1) -> tuple[float, float]:
    """(step seconds, bubble seconds) of a pipelined step.

    Args:
        stage_times: per pipeline rank, seconds for one micro-batch forward + backward.
        num_micro_batches: m >= 1.
        virtual_stages: v >= 1 chunks per rank (interleaved 1F1B).

    Raises:
        ValueError: empty stage list, m < 1 or v < 1.
    """
    if not stage_times or num_micro_batches < 1 or virtual_stages < 1:
        raise ValueError("pipeline_time needs stages, m >= 1 and v >= 1")
    t_max = max(stage_times)
    total = num_micro_batches * t_max + (sum(stage_times) - t_max) / virtual_stages
    return total, total - num_micro_batches * t_max


def bubble_fraction(pp: int, num_micro_batches: int, virtual_stages: int = 1) -> float:
    """Share of a uniform pipeline's step spent idle: (p - 1) / (v m + p - 1)."""
    return (pp - 1) / (virtual_stages * num_micro_batches + pp - 1)
