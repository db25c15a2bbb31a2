"""Expert capacity: how many routed rows each expert runs when MoE layers drop tokens.

Megatron-Core (token drop since commit e2ec14ab56, 2024-05-02; read at d98e8a64dd) caps each
expert per router call: the router of one rank sees T tokens (its micro-batch share: / cp, and
/ tp under sequence parallelism), each routed to top_k of E experts, and an expert keeps at
most ``capacity = ceil(T x top_k / E x capacity_factor)`` of them (moe_utils.py
``get_capacity``, applied in ``apply_router_token_dropping``, router.py). The rest are dropped.
With ``--moe-pad-expert-input-to-capacity`` every expert runs exactly ``capacity`` rows (the
all-to-all dispatcher sizes its splits and grouped GEMM by it: token_dispatcher.py
``MoEAlltoAllTokenDispatcher.preprocess``, ``drop_and_pad``); without it an expert runs
min(its load, capacity).

Routing is balanced (in expectation) unless ``TrainingConfig.moe_expert_load`` says how the
router spreads the rows (e.g. per-expert token counts logged from a run): then expert e receives
``l_e`` times the balanced load (``l_e`` = its share x E, mean 1) from every router call, an
expert capacity keeps ``min(l_e, capacity / balanced load)`` of it, expert by expert, and the EP
rank holding the busiest block of experts sets the pace: every framework priced here places E /
ep contiguous experts on each EP rank (Megatron-Core moe_layer.py ``local_expert_indices =
[ep_rank x num_local_experts + i]``; torchtitan shards the expert dimension with ``Shard(0)``;
DeepSpeed's all-to-all splits the [E, capacity, hidden] dispatch by expert: moe/sharded_moe.py
``MOELayer.forward`` "ecm -> gecm") and the all-to-all that combines their outputs waits for the
slowest. Without loads routing is balanced in expectation only: each token's experts a uniformly
random set (what ``--moe-router-force-load-balancing`` runs), every call drawn apart, so the
busiest EP rank runs a little more than its share (:func:`random_routing_scale`) and a factor of
1 drops that excess; a factor well above 1 drops nothing and costs what dropless does unless the
input is padded; below 1 it drops the excess over the capacity. The routed rows of a layer scale
by :func:`routed_scale`; the dispatch/combine all-to-all, the expert GEMMs and the routed
activations they save scale with them (:mod:`autopar.cost.blocks`). Given loads, every router
call is taken to see the same spread (the cap applies per call, so calls that differ drop more
than their mean shows; no fluctuation is added to them), and one load vector serves every MoE
layer (the user's choice, e.g. the worst layer's); a trained router's loads vary by layer and
over training.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from ..config import TrainingConfig
from ..errors import InvalidTrainingConfig
from ..frameworks.vocabulary import DEEPSPEED_MIN_CAPACITY

#: Frameworks that run token dropping with a capacity factor, each with its source; a framework
#: not listed is refused (:func:`check_framework`).
SUPPORT: dict[str, str] = {
    "megatron": "Megatron-LM arguments.py --moe-expert-capacity-factor, "
                "--moe-pad-expert-input-to-capacity (Megatron-Core transformer_config.py "
                "moe_expert_capacity_factor, moe_pad_expert_input_to_capacity)",
    "nemo": "NeMo 2.0 model configs pass Megatron-Core's TransformerConfig "
            "moe_expert_capacity_factor and moe_pad_expert_input_to_capacity",
    "deepspeed": "deepspeed/moe/layer.py MoE(capacity_factor=..., drop_tokens=True), set in the "
                 "model code; every expert padded to its capacity (FrameworkProfile."
                 "moe_capacity_rule 'deepspeed')",
}

#: Where frameworks without a capacity factor say they are dropless.
_DROPLESS = {
    "torchtitan": "torchtitan models/moe/moe.py MoEArgs has no capacity field: token-choice "
                  "routing with every routed token computed",
    "torchtitan-0.3": "torchtitan 0.3.0 models/common/token_dispatcher.py: the training "
                      "dispatchers compute every routed token (no capacity factor)",
    "torch": "plan.apply's expert parallelism (autopar/runtime/ep.py) dispatches every routed "
             "token",
}


def check_framework(train: TrainingConfig) -> None:
    """Refuse a capacity factor for a framework that does not drop tokens.

    Raises:
        InvalidTrainingConfig: ``moe_capacity_factor`` set under a framework not in
            :data:`SUPPORT`, naming the frameworks that run it.
    """
    if train.moe_capacity_factor is None or train.framework in SUPPORT:
        return
    why = _DROPLESS.get(train.framework, "autopar has no source that it drops tokens")
    raise InvalidTrainingConfig(
        f"moe_capacity_factor={train.moe_capacity_factor}: framework {train.framework!r} runs "
        f"dropless MoE ({why}); frameworks that drop tokens at a capacity, as autopar prices "
        f"them: {sorted(SUPPORT)}. Fix: drop moe_capacity_factor (--moe-capacity-factor), or "
        f"use framework 'megatron' (--framework megatron).")


def check_model(train: TrainingConfig, num_experts: int, top_k: int = 0) -> None:
    """Refuse MoE routing inputs the model cannot have.

    Args:
        num_experts: routed experts E of the model's MoE layers (0: dense).
        top_k: experts per token (0: not checked).

    Raises:
        InvalidTrainingConfig: ``moe_capacity_factor`` or ``moe_expert_load`` set and
            ``num_experts`` is 0; a ``moe_expert_load`` whose length is not ``num_experts``, or
            whose largest share exceeds 1 / top_k (an expert takes each token at most once).
    """
    load = train.moe_expert_load
    if not num_experts:
        for name, value in (("moe_capacity_factor", train.moe_capacity_factor),
                            ("moe_expert_load", load)):
            if value is not None:
                flag = name.replace("_", "-")
                raise InvalidTrainingConfig(
                    f"{name}={value!r:.60}: the model has no routed experts. Fix: drop {name} "
                    f"(--{flag}), or use a mixture-of-experts model.")
        return
    if load is None:
        return
    if len(load) != num_experts:
        raise InvalidTrainingConfig(
            f"moe_expert_load lists {len(load)} experts but the model's MoE layers route to "
            f"{num_experts}. Fix: give one load per routed expert, in expert order.")
    if top_k and max(load) / sum(load) > 1.0 / top_k + 1e-9:
        raise InvalidTrainingConfig(
            f"moe_expert_load gives one expert {max(load) / sum(load):.3f} of the routed rows, "
            f"more than 1 / top_k = {1.0 / top_k:.3f}: with {top_k} experts per token an expert "
            "takes each token at most once. Fix: give per-expert token counts of one layer.")


def relative_loads(train: TrainingConfig, num_experts: int) -> tuple[float, ...] | None:
    """Each routed expert's load over the balanced load (mean 1), shape [E], from
    ``train.moe_expert_load``; None when routing is balanced (no load given) or the length is
    not ``num_experts`` (a layer of another size: priced balanced)."""
    load = train.moe_expert_load
    if load is None or len(load) != num_experts:
        return None
    total = sum(load)
    return tuple(x * num_experts / total for x in load)


def busiest_rank(rel: tuple[float, ...], ep: int) -> float:
    """Mean of ``rel`` over the busiest of ``ep`` contiguous blocks of E / ep experts (the
    experts one EP rank holds; module docstring); ``ep`` 1: the mean over all.

    Raises:
        ValueError: ``ep`` does not divide the number of experts.
    """
    if ep < 1 or len(rel) % ep:
        raise ValueError(f"ep {ep} does not divide the {len(rel)} routed experts")
    local = len(rel) // ep
    return max(sum(rel[r * local:(r + 1) * local]) for r in range(ep)) / local


def expert_capacity(tokens: float, top_k: int, num_experts: int, factor: float) -> int:
    """Rows one expert may take from one router call of ``tokens`` tokens (Megatron-Core
    moe_utils.py ``get_capacity(num_tokens=tokens x top_k, num_experts, capacity_factor)``)."""
    return math.ceil(tokens * top_k / num_experts * factor)


def expected_max_normal(n: int) -> float:
    """Expected maximum of ``n`` independent standard normal draws, by Blom's approximation
    ``Phi^-1((n - 0.375) / (n + 0.25))`` (Blom 1958, Statistical Estimates and Transformed Beta
    Variables; within 0.01 of the exact value for n <= 1000); 0 for n <= 1."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def _expert_count(tokens: float, top_k: int, num_experts: int) -> tuple[float, float]:
    """(mean, standard deviation) of one expert's rows from one router call of ``tokens``
    tokens under random top-k routing: Binomial(T, k / E)."""
    p = top_k / num_experts
    return tokens * p, math.sqrt(tokens * p * (1.0 - p))


def random_routing_scale(tokens: float, top_k: int, num_experts: int, ep: int,
                         cap: float | None = None) -> float:
    """Rows the busiest of ``ep`` EP ranks runs over its balanced share when routing is balanced
    in expectation only: each token's ``top_k`` experts a uniformly random set of the
    ``num_experts`` E (what Megatron-Core's ``--moe-router-force-load-balancing`` runs: the
    router's logits replaced by normal draws, moe_utils.py ``RandomSTE``), every router call
    of ``tokens`` T tokens drawn apart.

    From one call an expert receives X ~ Binomial(T, k / E) rows (normal: mean m = T k / E,
    variance T (k / E)(1 - k / E)) and keeps Y = min(X, ``cap``) under a capacity (None:
    dropless; the truncated normal's mean and variance). An EP rank holds L = E / ep experts and
    receives from the ep calls of its EP group: L x ep such counts, whose variance sums with the
    factor (1 - L / E) E / (E - 1) of drawing L of E without replacement (the hypergeometric
    count of a token's picks among the rank's experts; 0 when one rank holds every expert).
    The all-to-all that returns the experts' outputs waits for the busiest rank: its expected
    rows are the mean plus :func:`expected_max_normal` (ep) standard deviations.

    Returns:
        that over L x ep x m (the rank's dropless balanced rows): above 1 without a capacity
        (DeepSeek-V3's 4,096 x 8 rows over 256 experts at ep 64: 1.012), below 1 with a
        capacity that drops the fluctuation's excess (capacity factor 1).
    """
    if ep < 1 or num_experts % ep:
        raise ValueError(f"ep {ep} does not divide the {num_experts} routed experts")
    local = num_experts // ep
    m, s = _expert_count(tokens, top_k, num_experts)
    mean_y, var_y = m, s * s
    if cap is not None and s > 0:
        a = (min(cap, tokens) - m) / s
        pdf, tail = NormalDist().pdf(a), 1.0 - NormalDist().cdf(a)
        first = -pdf + a * tail                             # E[min(Z, a)]
        second = (1.0 - tail) - a * pdf + a * a * tail      # E[min(Z, a)^2]
        mean_y, var_y = m + s * first, s * s * max(0.0, second - first * first)
    n = local * ep
    var = n * var_y * (1.0 - local / num_experts) * num_experts / max(num_experts - 1, 1)
    return (n * mean_y + expected_max_normal(ep) * math.sqrt(var)) / (n * m) if m > 0 else 1.0


def busiest_expert_scale(tokens: float, top_k: int, num_experts: int, ep: int = 1) -> float:
    """DeepSpeed's dropless buffer over the balanced load under random routing (as
    :func:`random_routing_scale`): every expert is padded to the busiest expert's count of the
    step's calls (deepspeed/moe/sharded_moe.py ``topkgating``: ``new_capacity = max(exp_counts)``,
    all-reduced with MAX over the expert group), the expected maximum of E x ep binomial counts
    of mean T k / E."""
    m, s = _expert_count(tokens, top_k, num_experts)
    return 1.0 + expected_max_normal(num_experts * max(ep, 1)) * s / m if m > 0 else 1.0


def routed_scale(train: TrainingConfig, tokens: float, top_k: int, num_experts: int,
                 ep: int = 1, rule: str = "megatron") -> float:
    """Rows the busiest EP rank's experts run in an MoE layer, over its share of dropless,
    balanced routing (T x top_k / ep rows per router call of T tokens).

    Args:
        train: its ``moe_capacity_factor`` (None: dropless), ``moe_pad_to_capacity`` and
            ``moe_expert_load`` (None: balanced).
        tokens: tokens one router call sees, T (a rank's micro-batch share).
        top_k: experts per token; num_experts: routed experts E of the layer.
        ep: expert-parallel degree (1: each rank holds every expert, so only the capacity
            matters; also the lower bound over ep the search uses).
        rule: the framework's :attr:`autopar.frameworks.FrameworkProfile.moe_capacity_rule`.

    Returns:
        ``megatron``: padded: E x min(capacity, T) / (T x top_k) (an expert never holds a token
        twice: with capacity >= T Megatron-Core's capacity mask keeps all T); not padded: the
        busiest rank's mean of min(l_e, capacity / (T x top_k / E)) over its experts; dropless:
        the busiest rank's mean l_e. Without loads (balanced in expectation) both are
        :func:`random_routing_scale`'s, with the capacity or without. ``deepspeed`` (every
        expert a buffer of C rows): with a factor C = max(ceil(T / E x factor x top_k), 4), so
        E x C / (T x top_k); dropless C = the busiest expert's count, so max l_e, or without
        loads :func:`busiest_expert_scale`.
    """
    if not num_experts or not top_k or tokens <= 0:
        return 1.0
    factor = train.moe_capacity_factor
    rel = relative_loads(train, num_experts)
    load = tokens * top_k / num_experts
    if rule == "deepspeed":
        if factor is None:
            return max(rel) if rel else busiest_expert_scale(tokens, top_k, num_experts, ep)
        return max(math.ceil(tokens / num_experts * factor * top_k),
                   DEEPSPEED_MIN_CAPACITY) / load
    if factor is None:
        return busiest_rank(rel, ep) if rel else random_routing_scale(
            tokens, top_k, num_experts, ep)
    cap = expert_capacity(tokens, top_k, num_experts, factor)
    if train.moe_pad_to_capacity:
        return min(cap, tokens) / load
    if rel is None:
        return random_routing_scale(tokens, top_k, num_experts, ep, cap)
    kept = min(cap, tokens) / load
    return busiest_rank(tuple(min(x, kept) for x in rel), ep)


def capacity_text(train: TrainingConfig) -> str:
    """", MoE capacity factor 1.5 (padded)" and ", MoE expert loads (busiest 2.67x the mean)"
    for a plan's or an estimate's header line, or "" for balanced dropless MoE."""
    text = ""
    if train.moe_capacity_factor is not None:
        text = (f", MoE capacity factor {train.moe_capacity_factor:g}"
                + (" (padded)" if train.moe_pad_to_capacity else ""))
    load = train.moe_expert_load
    if load is not None:
        text += f", MoE expert loads (busiest {max(load) * len(load) / sum(load):.2f}x the mean)"
    return text
