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

autopar prices routing as balanced (every expert receives T x top_k / E rows of a router call;
:mod:`autopar.cost.compute`), so a factor >= 1 drops nothing and costs what dropless does unless
the input is padded; below 1 it drops the excess. The routed rows of a layer scale by
:func:`routed_scale`; the dispatch/combine all-to-all, the expert GEMMs and the routed
activations they save scale with them (:mod:`autopar.cost.blocks`). What imbalance a trained
router causes, and so what a factor saves over dropless, is not modelled: it depends on the data
and the router's state, which no input describes.
"""

from __future__ import annotations

import math

from ..config import TrainingConfig
from ..errors import InvalidTrainingConfig

#: Frameworks that run token dropping with a capacity factor, each with its source; a framework
#: not listed is refused (:func:`check_framework`).
SUPPORT: dict[str, str] = {
    "megatron": "Megatron-LM arguments.py --moe-expert-capacity-factor, "
                "--moe-pad-expert-input-to-capacity (Megatron-Core transformer_config.py "
                "moe_expert_capacity_factor, moe_pad_expert_input_to_capacity)",
    "nemo": "NeMo 2.0 model configs pass Megatron-Core's TransformerConfig "
            "moe_expert_capacity_factor and moe_pad_expert_input_to_capacity",
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


def check_model(train: TrainingConfig, num_experts: int) -> None:
    """Refuse a capacity factor on a model without routed experts.

    Raises:
        InvalidTrainingConfig: ``moe_capacity_factor`` set and ``num_experts`` is 0.
    """
    if train.moe_capacity_factor is not None and not num_experts:
        raise InvalidTrainingConfig(
            f"moe_capacity_factor={train.moe_capacity_factor}: the model has no routed experts "
            "to cap. Fix: drop moe_capacity_factor (--moe-capacity-factor), or use a "
            "mixture-of-experts model.")


def expert_capacity(tokens: float, top_k: int, num_experts: int, factor: float) -> int:
    """Rows one expert may take from one router call of ``tokens`` tokens (Megatron-Core
    moe_utils.py ``get_capacity(num_tokens=tokens x top_k, num_experts, capacity_factor)``)."""
    return math.ceil(tokens * top_k / num_experts * factor)


def routed_scale(train: TrainingConfig, tokens: float, top_k: int, num_experts: int) -> float:
    """Routed rows an MoE layer runs over the T x top_k of dropless routing (balanced).

    Args:
        train: its ``moe_capacity_factor`` (None: dropless, 1.0) and ``moe_pad_to_capacity``.
        tokens: tokens one router call sees, T (a rank's micro-batch share).
        top_k: experts per token; num_experts: routed experts E of the layer.

    Returns:
        Padded: E x min(capacity, T) / (T x top_k) (an expert never holds a token twice: with
        capacity >= T Megatron-Core's capacity mask keeps all T). Not padded: min(1, capacity
        / (T x top_k / E)), what is left after the excess over capacity is dropped.
    """
    factor = train.moe_capacity_factor
    if factor is None or not num_experts or not top_k or tokens <= 0:
        return 1.0
    cap = expert_capacity(tokens, top_k, num_experts, factor)
    load = tokens * top_k / num_experts
    if train.moe_pad_to_capacity:
        return min(cap, tokens) / load
    return min(1.0, cap / load)


def capacity_text(train: TrainingConfig) -> str:
    """", MoE capacity factor 1.5 (padded)" for a plan's or an estimate's header line, or ""
    for dropless MoE."""
    if train.moe_capacity_factor is None:
        return ""
    return (f", MoE capacity factor {train.moe_capacity_factor:g}"
            + (" (padded)" if train.moe_pad_to_capacity else ""))
