"""Notes on the parallel choices a command was given: a choice that does nothing where it was
given (``--sp`` at tp = 1, ``--cp-mode`` at cp = 1), and an ``estimate`` whose configuration
came from ``ParallelConfig``'s defaults because no parallel flag was given."""

from __future__ import annotations

from ..config import SP_NEEDS_TP

#: The note for ``--sp`` at tp = 1 (plan, explain and estimate).
SP_AT_TP1 = f"{SP_NEEDS_TP}: ignored at tp=1"

#: The note for ``--cp-mode ring`` at cp = 1 (estimate; plan and explain have no --cp-mode):
#: another mode there is said by the estimate itself (:func:`autopar.cost.notes.resolve_notes`),
#: ring, ``ParallelConfig``'s default, is not.
CP_MODE_AT_CP1 = ("--cp-mode sets how context parallelism exchanges K/V, so it needs cp > 1: "
                  "ignored at cp=1")

#: The ``ParallelConfig`` fields whose flags (--tp --pp --dp --cp --zero --recompute
#: --virtual-stages --micro-batch --ep) choose an ``estimate``'s configuration.
_CHOSEN = ("tp", "pp", "dp", "cp", "zero_stage", "recompute", "virtual_stages",
           "micro_batch_size", "ep")

#: The flags that import a whole configuration (``estimate``; ``--plan`` also for explain).
_IMPORTS = ("plan", "megatron_args", "torchtitan_toml", "torchtitan_config")


def ignored_choice_notes(args, par: dict, tp: int | None, cp: int | None) -> list[str]:
    """The notes for choices ignored at the degrees ``tp`` and ``cp`` (None: not fixed, the
    search picks them): :data:`SP_AT_TP1` when ``par`` turns sequence parallelism on at
    tp = 1, :data:`CP_MODE_AT_CP1` when ``--cp-mode ring`` was given at cp = 1."""
    notes = []
    if par.get("sequence_parallel") and tp == 1:
        notes.append(SP_AT_TP1)
    if getattr(args, "cp_mode", None) == "ring" and cp == 1:
        notes.append(CP_MODE_AT_CP1)
    return notes


def default_choices_note(args, par: dict, config) -> list[str]:
    """The note ``estimate`` prints when its configuration ``config`` (the estimate's
    ``ParallelConfig``) is ParallelConfig's defaults: ``par`` (the choices given) holds none of
    :data:`_CHOSEN` and no configuration was imported (:data:`_IMPORTS`); [] otherwise."""
    if any(k in par for k in _CHOSEN) or any(getattr(args, f, None) for f in _IMPORTS):
        return []
    c = config
    rec = c.recompute if isinstance(c.recompute, str) else "mixed"
    ep = f" ep={c.ep}" if c.ep != 1 else ""
    return [f"no parallel flags given: estimated at the defaults tp={c.tp} pp={c.pp} dp={c.dp} "
            f"cp={c.cp}{ep}, ZeRO {c.zero_stage}, recompute {rec}, micro-batch "
            f"{c.micro_batch_size} (--tp --pp --dp --cp --zero --recompute --micro-batch set "
            "them); `autopar plan` with the same model, cluster and batch searches them"]


def sp_only_default(args, profile, moe: bool, par: dict) -> tuple[dict, list[str]]:
    """``estimate``'s choices ``par`` with sequence parallelism on where it is off only by
    default (no ``--sp``/``--no-sp``, no configuration imported or loaded: :data:`_IMPORTS`,
    whose own SP setting stands), tp > 1, and the
    framework ``profile`` runs tensor parallelism only with SP (its
    :meth:`~autopar.frameworks.FrameworkProfile.sequence_parallel_values` on this model, MoE
    or not (``moe``), is (True,): torchtitan; Megatron-LM's MoE layers), with the note saying
    so; ``(par, [])`` otherwise. ParallelConfig's default (off) would be a configuration the
    framework cannot run."""
    if "sequence_parallel" in par or par.get("tp", 1) <= 1 \
            or any(getattr(args, f, None) for f in _IMPORTS) \
            or profile.sequence_parallel_values(moe=moe) != (True,):
        return par, []
    moe_only = moe and False in profile.sequence_parallel_values()   # dense layers take both
    return {**par, "sequence_parallel": True}, [
        f"sequence parallelism on (not given): {profile.name} runs tensor parallelism"
        f"{' on MoE layers' if moe_only else ''} only with it (--no-sp estimates it off, a "
        "configuration it cannot run)"]
