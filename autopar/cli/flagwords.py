"""An error's text in the command line's words: the Python API's names (``TrainingConfig.
seq_len``, a pin ``ep=2``) as the flags a command-line user types (``--seq-len``, ``--ep 2``)."""

from __future__ import annotations

import re

#: The Python API's names in an error -> the command line's flags (a CLI user types those).
_FLAGS = {"TrainingConfig.seq_len": "--seq-len", "TrainingConfig.global_batch_size": "--global-batch",
          "TrainingConfig.micro_batch_size": "--micro-batch",
          "TrainingConfig(framework=...)": "--framework"}
#: The search's own arguments (and a None to leave a choice open) in an error -> what a
#: command-line user types instead.
_SEARCH_WORDS = {"within time_limit_s=": "within --time-limit ",
                 "raise time_limit_s, or pin choices with fixed=":
                     "raise --time-limit, or pin choices with flags (--tp, --pp, --cp, ...)",
                 # a field left None is a flag left out (there is no "--dp None")
                 "an int >= 1 or None to let autopar choose":
                     "an int >= 1, or leave the flag out to let autopar choose"}
_PINS = {"tp": "--tp", "pp": "--pp", "dp": "--dp", "cp": "--cp", "ep": "--ep",
         "expert_tp": "--expert-tp", "dispatcher": "--dispatcher", "zero_stage": "--zero",
         "virtual_stages": "--virtual-stages", "micro_batch_size": "--micro-batch",
         "schedule": "--schedule", "recompute": "--recompute", "vp_group": "--vp-group"}
#: TrainingConfig's mixture-of-experts fields -> their flags (each is typed when it is named).
_MOE_FLAGS = {"moe_expert_load": "--moe-expert-load",
              "moe_capacity_factor": "--moe-capacity-factor",
              "moe_pad_to_capacity": "--moe-pad-to-capacity"}
_PIN = re.compile(r"(?<![\w.*-])(" + "|".join(sorted(_PINS, key=len, reverse=True))
                  + r")=('?)([\w.-]+)\2(?![\w(])")
#: ``ParallelConfig.tp`` and the like (not inside the "(...)" the flag is written before).
_FIELD = re.compile(r"(?<!\()ParallelConfig\.(" + "|".join(sorted(_PINS, key=len, reverse=True))
                    + r")(?!\w)")
_PIN_FLAG = re.compile(r"(?<![\w-])(" + "|".join(sorted(_PINS.values(), key=len, reverse=True))
                       + r")(?![\w-])")


def flag_words(text: str, pins: str = "--", given: frozenset[str] | None = None) -> str:
    """An error's text in the command line's words: ``TrainingConfig.seq_len`` as ``--seq-len
    (TrainingConfig.seq_len)``, a pin ``dispatcher='alltoall'`` as ``--dispatcher alltoall``,
    ``expert_tp=None`` as ``no --expert-tp``; ``ParallelConfig.tp`` as ``--tp
    (ParallelConfig.tp)``; ``pins="--compare-"`` writes the pins as the
    ``--compare-*`` flags (``--compare-ep 2``); the mixture-of-experts training fields as their
    flags (``moe_capacity_factor=1.0`` as ``--moe-capacity-factor 1.0``). ``given``: the ParallelConfig fields the
    command line set (None: all); before "Fix:" a value the user did not type (``dp=16``
    derived from the GPU count) keeps its field name, not a flag the user never gave; the fix
    names the flags to type."""
    for api, words in _SEARCH_WORDS.items():
        text = text.replace(api, words)
    for api, flag in _FLAGS.items():
        # a text naming both ("--framework / TrainingConfig(framework=...)") keeps the flag
        text = text.replace(f"{flag} / {api}", flag).replace(api, f"{flag} ({api})")

    for api, flag_ in _MOE_FLAGS.items():
        # "drop x (--x)" keeps the flag; x=True is the switch alone; x=v the flag and value
        text = text.replace(f"{api} ({flag_})", flag_)
        text = re.sub(rf"(?<![\w.-]){api}=True\b", flag_, text)
        text = re.sub(rf"(?<![\w.-]){api}=([\w.+-]+)", rf"{flag_} \1", text)
        text = re.sub(rf"(?<![\w.-]){api}(?![\w=])", flag_, text)

    def flag(name: str) -> str:
        return pins + _PINS[name][2:]
    # a field the flags set ("ParallelConfig.tp must be a positive integer"), as --x (api) does
    text = _FIELD.sub(lambda m: m.group(0) if given is not None and m.group(1) not in given
                      else f"{_PINS[m.group(1)]} ({m.group(0)})", text)
    if pins != "--":   # a flag the rule's text names itself ("drop --ep"), ours above too
        text = _PIN_FLAG.sub(lambda m: pins + m.group(1)[2:], text)
    # a pin set to None is the flag left out (there is no "--expert-tp None" to type)
    def word(m, typed) -> str:
        if typed is not None and m.group(1) not in typed:
            return m.group(0)
        # a sentence's full stop is not part of the value ("expert_tp=None.")
        value, stop = (m.group(3)[:-1], ".") if m.group(3).endswith(".") else (m.group(3), "")
        return (f"no {flag(m.group(1))}" if value == "None" else
                f"{flag(m.group(1))} {value}") + stop
    # what the error found names only the flags typed; its fix says what to type, in flags
    head, fix, tail = text.partition("Fix:")
    if pins == "--":   # the switch a fix turns on (--sp; its --compare- form has none)
        tail = re.sub(r"(?<![\w.-])sequence_parallel=True\b", "--sp", tail)
    return (_PIN.sub(lambda m: word(m, given), head) + fix
            + _PIN.sub(lambda m: word(m, None), tail))
