"""The ``autopar`` command's argument parser: the flags of ``plan``, ``estimate``, ``explain`` and
``models`` (``calibrate`` and ``measure``: :mod:`autopar.cli.measure_cmds`; value types:
:mod:`autopar.cli.argtypes`), and one-line errors for bad flags. The full flag reference is docs/cli.md."""

from __future__ import annotations

import argparse
import difflib
import sys

from ..config import (DISPATCHERS, FRAMEWORKS, OPTIMIZER_STATE_DTYPES, RECOMPUTE_MODES,
                      SCHEDULE_ALIASES, SCHEDULES)
from ..cost.offload import frameworks_running
from ..frameworks.options import STACK_OPTIONS
from . import measure_args
from .argtypes import expert_load, int_at_least, lower_case, positive_float
from .exports import EXPORTERS


def _common(p: argparse.ArgumentParser, plot: str) -> None:
    p.add_argument("--model", default=None,
                   help="preset name (see `autopar models`) or a JSON file with a model dict")
    p.add_argument("--cluster", default=None,
                   help="cluster spec NODESxGPUSxGPU[+NICSxLINK] or TOTALxGPU, e.g. 4x8xA100-80GB "
                   "(required, except with estimate --plan)")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per optimizer step (default: ~4M tokens, a multiple of GPUs, "
                        "at most 16M tokens; a note states it)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence (default: the model's)")
    p.add_argument("--precision", default=None, choices=["bf16", "fp16", "fp32", "fp8"],
                   help="training precision (default bf16)")
    p.add_argument("--no-flash-attention", action="store_true",
                   help="model attention as the unfused path (stores s x s scores)")
    p.add_argument("--optimizer-offload", action="store_true",
                   help="optimizer states and step on the CPU (ZeRO-Offload): no GPU memory")
    p.add_argument("--param-offload", action="store_true",
                   help="ZeRO-3/FSDP parameter shards on the CPU (FSDP CPUOffload, DeepSpeed "
                   f"offload_param; frameworks {', '.join(frameworks_running('params'))}; needs "
                   "zero stage 3)")
    p.add_argument("--activation-offload", action="store_true",
                   help="decoder blocks' saved activations on the CPU (save_on_cpu; "
                   f"frameworks {', '.join(frameworks_running('activations'))})")
    p.add_argument("--moe-capacity-factor", type=positive_float, default=None,
                   help="MoE token dropping: each expert takes at most ceil(tokens x top-k / "
                        "experts x FACTOR) tokens of a router call (Megatron-Core "
                        "--moe-expert-capacity-factor; default: dropless)")
    p.add_argument("--moe-pad-to-capacity", action="store_true",
                   help="with --moe-capacity-factor: every expert runs its full capacity "
                        "(--moe-pad-expert-input-to-capacity)")
    p.add_argument("--moe-expert-load", type=expert_load, default=None, metavar="LOADS",
                   help="how the router spreads tokens over the routed experts: one number per "
                        "expert in expert order (e.g. logged token counts), comma-separated or "
                        "a file; the EP rank with the busiest block of experts sets the pace "
                        "(default: balanced routing)")
    p.add_argument("--stack-option", action="append", default=None, metavar="NAME",
                   help="a named variant of the framework's stack (a version, a flag, the "
                        "model's own code), repeatable: "
                        + ", ".join(f"{n} ({', '.join(o.frameworks) or 'any'})"
                                    for n, o in STACK_OPTIONS.items()))
    p.add_argument("--optimizer-state-dtype", default=None, choices=list(OPTIMIZER_STATE_DTYPES),
                   help="dtype of Adam's moments (default fp32)")
    p.add_argument("--framework", default=None, choices=list(FRAMEWORKS),
                   help="what will run the plan (default torch: plan.apply; megatron with "
                   "--megatron-args, torchtitan with --torchtitan-toml or --torchtitan-config); "
                   "the search emits only plans it can run, an estimate says when it cannot run "
                   "the configuration (the published stacks, nemo, fsdp1, internevo, ..., borrow "
                   "the layouts of the framework they are built on: see docs/cli.md)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help=f"also draw {plot} to a PNG (needs matplotlib)")
    p.add_argument("--tokens", type=positive_float, default=None,
                   help="tokens of the whole training run, e.g. 2e12: prints days and GPU-hours")
    p.add_argument("--price-per-gpu-hour", type=positive_float, default=None,
                   help="rental price of one GPU for one hour (with --tokens: cost of the run), "
                        "in --currency")
    p.add_argument("--currency", default="USD",
                   help="ISO 4217 code of --price-per-gpu-hour's currency, stated with the cost "
                        "(default USD; autopar converts nothing)")
    p.add_argument("--calibration", metavar="FILE", default=None,
                   help="calibration file from `autopar calibrate` on the cluster's GPUs: its "
                        "measurements replace the datasheet constants")


def _parallel_flags(p: argparse.ArgumentParser, prefix: str = "", what: str = "",
                    search: bool = False) -> None:
    dash = f"--{prefix}" if prefix else "--"
    dest = prefix.replace("-", "_")
    p.add_argument(f"{dash}tp", dest=f"{dest}tp", type=int, default=None,
                   help=f"tensor-parallel degree{what}")
    p.add_argument(f"{dash}pp", dest=f"{dest}pp", type=int, default=None,
                   help=f"pipeline-parallel degree{what}")
    p.add_argument(f"{dash}dp", dest=f"{dest}dp", type=int, default=None,
                   help=f"data-parallel degree{what}")
    p.add_argument(f"{dash}cp", dest=f"{dest}cp", type=int, default=None,
                   help=f"context-parallel degree{what}")
    p.add_argument(f"{dash}zero", dest=f"{dest}zero", type=int, default=None,
                   choices=[0, 1, 2, 3], help=f"ZeRO stage{what}")
    p.add_argument(f"{dash}recompute", dest=f"{dest}recompute", default=None,
                   choices=list(RECOMPUTE_MODES),
                   help=f"activation recomputation of every block{what}")
    p.add_argument(f"{dash}sp", dest=f"{dest}sequence_parallel",
                   action=argparse.BooleanOptionalAction, default=None,
                   help=f"sequence parallelism on (with tp > 1) or off{what}")
    p.add_argument(f"{dash}virtual-stages", dest=f"{dest}virtual_stages", type=int,
                   default=None, help=f"interleaved 1F1B chunks per pipeline rank{what}")
    p.add_argument(f"{dash}vp-group", dest=f"{dest}vp_group", type=int, default=None,
                   help=f"interleaved 1F1B micro-batches per chunk in turn (Megatron-LM "
                        f"--microbatch-group-size-per-virtual-pipeline-stage; default pp){what}")
    p.add_argument(f"{dash}micro-batch", dest=f"{dest}micro_batch", type=int, default=None,
                   help=f"sequences per micro-batch{what}")
    p.add_argument(f"{dash}ep", dest=f"{dest}ep", type=int, default=None,
                   help=f"expert-parallel degree of MoE layers{what}")
    p.add_argument(f"{dash}expert-tp", dest=f"{dest}expert_tp", type=int, default=None,
                   help=f"expert-tensor-parallel degree of MoE layers (MoE parallel folding; "
                        f"default: tp){what}")
    # 'auto' asks the search to choose: a pin of plan / explain, not one configuration
    auto = ("; 'auto' lets the search choose between alltoall and allgather where the framework "
            "runs both, at about twice the MoE search time" if search else "")
    p.add_argument(f"{dash}dispatcher", dest=f"{dest}dispatcher", default=None,
                   choices=[*DISPATCHERS, *(["auto"] if search else [])],
                   help=f"MoE token dispatcher: NCCL all-to-all, DeepEP, or Megatron-Core's "
                        f"all-gather over the expert-TP x EP group (default alltoall; a given "
                        f"one is kept{auto}){what}")
    # the spellings ParallelConfig takes (torch's class names, case-insensitive) are read too
    p.add_argument(f"{dash}schedule", dest=f"{dest}schedule", default=None,
                   type=lambda s: SCHEDULE_ALIASES.get(s.lower(), s.lower()),
                   choices=list(SCHEDULES),
                   help=f"pipeline schedule (torch.distributed.pipelining's){what}")


_non_negative_int = int_at_least(0)


class _Parser(argparse.ArgumentParser):
    """argparse with errors in one line: the problem, the closest option of the subcommand
    given for a misspelt one, and where the full list is (argparse's default prints the whole
    usage, ~30 lines for ``plan``, before the one line that matters); with ``--json`` on the
    command line that line is a JSON object on stdout instead (type ``"UsageError"``). Choices
    among lower-case names are read in any case (:meth:`add_argument`)."""

    #: The subparser of the command line's subcommand while :meth:`parse_args` reports
    #: unrecognized arguments (None: the top level, or no subcommand was given).
    _command_parser: "argparse.ArgumentParser | None" = None
    #: The command line holds ``--json``: :meth:`error` prints its line as JSON on stdout
    #: (set by :meth:`parse_args` on this parser and its subcommands', which report their own
    #: flags' errors).
    _json_errors: bool = False

    def add_argument(self, *args, **kwargs):
        """As argparse's, but an option choosing among lower-case names (every choice a
        lower-case string) and given no ``type`` reads its value in any case
        (:func:`~autopar.cli.argtypes.lower_case`): ``--precision BF16`` is ``bf16``,
        ``--framework Megatron`` is ``megatron``; every such option, of every subcommand."""
        choices = kwargs.get("choices")
        if kwargs.get("type") is None and choices and all(
                isinstance(c, str) and c == c.lower() for c in choices):
            kwargs["type"] = lower_case
        return super().add_argument(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but unrecognized arguments are judged against the subcommand given:
        argparse reports them from the top-level parser, which knows every subcommand's
        options, so ``models --out`` was answered "Did you mean --out?". A lone flag given as
        the value of :data:`FLAG_VALUED` (``--megatron-args "--sequence-parallel"``) is taken as
        that value: argparse reads any token starting with ``-`` and holding no space as an
        option, and answered "expected one argument"."""
        args = _join_flag_values(sys.argv[1:] if args is None else list(args),
                                 set(_option_strings(self)))
        for parser in (self, *_subparsers(self).values()):
            parser._json_errors = "--json" in args
            parser._args = args
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            self._command_parser = _subparsers(self).get(getattr(ns, "command", None))
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        command = _subparsers(self).get(getattr(ns, "command", None))
        both = _opposite_flags(args, command)
        if both:
            # argparse keeps the last of --sp / --no-sp without a word
            self._command_parser = command
            self.error(f"argument {both[1]}: not allowed with argument {both[0]} (they set "
                       "opposite values; give one)")
        return ns

    def error(self, message):
        hint = ""
        scope = self._command_parser or self
        if message.startswith("unrecognized arguments:"):
            known = _option_strings(scope)
            flags = [t.split("=")[0] for t in message.split(":", 1)[1].split() if t[:1] == "-"]
            close = [m for tok in flags for m in _near_flag(tok, known) if m != tok]
            other = [f"{tok} is an option of {', '.join(where)}, not of {scope.prog}"
                     for tok in flags if (where := [f"autopar {n}" for n, sub in _subparsers(
                         self).items() if sub is not scope and tok in _option_strings(sub)])]
            if close or other:   # an option of another command: say so, not a near spelling
                hint = f" {other[0]}." if other else f" Did you mean {', '.join(close)}?"
        if message.endswith("expected one argument"):
            flags = message.split(":")[0].removeprefix("argument ").split("/")
            args = getattr(self, "_args", [])
            after = [args[i + 1] for i, a in enumerate(args[:-1]) if a in flags]
            if any(a[:1] == "-" for a in after):   # e.g. --cluster -1x8xH100
                hint = (f" A value that begins with '-' is read as an option: attach it, "
                        f"{flags[-1]}=VALUE.")
        line = f"{message}.{hint} Fix: see '{scope.prog} --help' for the options."
        if self._json_errors:
            from .output import print_error_json   # rich and the report: not for --help
            print_error_json("UsageError", line)
            self.exit(2)
        self.exit(2, f"{self.prog}: error: {line}\n")


#: Options whose value is itself a string of flags (another framework's arguments).
FLAG_VALUED = ("--megatron-args", "--torchtitan-config")


def _join_flag_values(args: list[str], own: set[str]) -> list[str]:
    """``args`` with ``OPT VALUE`` written ``OPT=VALUE`` for an option of :data:`FLAG_VALUED`
    whose value starts with ``-`` and is not one of autopar's own options (``own``), e.g.
    ``--megatron-args --use-distributed-optimizer``; other arguments unchanged."""
    out, i = [], 0
    while i < len(args):
        tok = args[i]
        nxt = args[i + 1] if i + 1 < len(args) else None
        if (tok in FLAG_VALUED and nxt is not None and nxt.startswith("-")
                and nxt.split("=", 1)[0] not in own):
            out.append(f"{tok}={nxt}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def _opposite_flags(args: list[str], parser: "argparse.ArgumentParser | None"
                    ) -> tuple[str, str] | None:
    """The first ``(--X, --no-X)`` pair of ``parser``'s on/off options (e.g. ``--sp`` /
    ``--no-sp``) that ``args`` both hold; None when there is none (or no subcommand parser)."""
    if parser is None:
        return None
    given = set(args)
    for action in parser._actions:
        if isinstance(action, argparse.BooleanOptionalAction):
            on, off = action.option_strings[:2]
            if on in given and off in given:
                return on, off
    return None


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    """``{name: subparser}`` of ``parser``'s subcommands (empty without any)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every --option of ``parser`` and its subcommands."""
    out = []
    for action in parser._actions:
        out += [o for o in action.option_strings if o.startswith("--")]
    for sub in _subparsers(parser).values():
        out += _option_strings(sub)
    return sorted(set(out))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``autopar`` command."""
    ap = _Parser(prog="autopar", description="Plan parallel training of "
                 "transformers on GPU clusters.")
    from importlib.metadata import PackageNotFoundError, version
    try:   # the installed distribution's version (pyproject.toml), not the package root's
        v = version("autopar")
    except PackageNotFoundError:
        v = "unknown (not installed)"
    ap.add_argument("--version", action="version", version=f"autopar {v}")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="search the fastest plan that fits")
    _common(p, "the schedule of one step, memory per stage and the Pareto front")
    _parallel_flags(p, what=" (pinned; the rest is searched)", search=True)
    _search_flags(p)
    p.add_argument("--out", default=None, help="write the plan JSON to this file (a line says so)")
    p.add_argument("--export", nargs=2, metavar=("FRAMEWORK", "FILE"), default=None,
                   action="append",
                   help=f"also write the plan for a framework ({', '.join(EXPORTERS)}: Megatron-LM"
                   " arguments; Megatron-Bridge ConfigContainer override YAML; torchtitan's "
                   "format for the installed torchtitan, when none is installed the one the plan was "
                   "made for (--framework torchtitan: 0.2, torchtitan-0.3: 0.3) "
                   "(torchtitan-0.2: TOML, torchtitan-0.3: Python config); "
                   "DeepSpeed JSON; Accelerate launch YAML with its FSDP or DeepSpeed plugin; "
                   "Colossal-AI plugin JSON) to FILE and print what that "
                   "file really runs (re-estimated; the nearest runnable plan when it does not "
                   "fit); repeat it to write several")
    _parallel_flags(p, "compare-", " of a hand-tuned plan to set against the best")
    e = sub.add_parser("estimate", help="judge one configuration, with an OOM verdict and fixes")
    _common(e, "the schedule of one step and memory per stage")
    _parallel_flags(e, what=" (overrides --megatron-args / --torchtitan-toml)")
    e.add_argument("--placement", default=None, metavar="DIMS",
                   help="rank placement, innermost first, e.g. tp,cp,dp,pp (the default)")
    e.add_argument("--cp-mode", default=None, choices=["ring", "ulysses", "allgather"],
                   help="how context parallelism exchanges K/V (default ring)")
    e.add_argument("--megatron-args", default=None, metavar="ARGS",
                   help="Megatron-LM arguments as one string, e.g. \"--tensor-model-parallel-size 4 "
                   "--pipeline-model-parallel-size 2 --sequence-parallel\", or the path of a file "
                   "of them (what --export megatron writes)")
    e.add_argument("--torchtitan-toml", default=None, metavar="FILE",
                   help="torchtitan v0.2.x job TOML ([parallelism], [activation_checkpoint], "
                   "[training])")
    e.add_argument("--torchtitan-config", default=None, metavar="FILE",
                   help="torchtitan >= 0.3 Python config (config.parallelism.*, "
                   "config.training.*, config.activation_checkpoint), or its overrides as one "
                   "string, e.g. \"--module llama3 --config llama3_8b "
                   "--parallelism.tensor_parallel_degree 8\"")
    e.add_argument("--plan", default=None, metavar="FILE",
                   help="re-estimate a plan file's configuration (e.g. after editing it); its "
                   "model, cluster and training config are used unless flags are given")
    x = sub.add_parser("explain", help="why the best plan beats the usual alternatives")
    _common(x, "the step time of each compared plan by component")
    _parallel_flags(x, what=" (pinned in the searched best plan)", search=True)
    _search_flags(x)
    _parallel_flags(x, "compare-", " of a hand-tuned plan to explain too")
    x.add_argument("--plan", default=None, metavar="FILE",
                   help="explain a plan file's configuration against the usual alternatives; "
                   "its model, cluster and training config are used unless flags are given")
    mo = sub.add_parser("models", help="list model presets with their size and shape")
    mo.add_argument("--json", action="store_true", help="print the presets as JSON on stdout")
    measure_args.add_parsers(sub, positive_float, int_at_least)
    return ap


def _search_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--time-limit", type=positive_float, default=None,
                   help="seconds to search before returning the best so far")
    p.add_argument("--top-k", type=_non_negative_int, default=5,
                   help="alternatives to show (default 5)")
    p.add_argument("--objective", choices=["robust", "fastest"], default="robust",
                   help="robust (default): when the fastest plan's advantage over a simpler plan "
                   "(fewer parallel dimensions) of a validated regime is inside the fastest "
                   "plan's error band (for an unvalidated regime the corpus-wide band "
                   "stands in), return the simpler plan and list the faster one first among "
                   "the alternatives; fastest: the model's fastest plan")
    p.add_argument("--memory-margin", type=_margin, default=None, metavar="FRACTION",
                   help="keep this fraction of each GPU's memory free for the memory model's "
                   f"error (0 to 0.5; default {_margin_default_text()}): plans use at most "
                   "1 - FRACTION of it by prediction; 0 plans to the last byte")


def _near_flag(token: str, known) -> list[str]:
    """The known option spelt closest to ``token``, compared without their leading dashes (the
    dashes every option shares made '--foo' look close to '--out')."""
    bare = {k.lstrip("-"): k for k in known}
    return [bare[m] for m in difflib.get_close_matches(token.lstrip("-"), list(bare), n=1)]


def _margin_default_text() -> str:
    """The default margin and the measured band it comes from, for --help (from the generated
    table, so the text never goes stale when the corpus grows)."""
    from ..cost.regime import default_margin, memory_band
    band, moe = memory_band(), memory_band(moe=True)
    if not band:
        return "0: no measured peaks to derive it from"
    # one decimal, as README.md's generated line says it
    text = (f"{default_margin():g}: room for a peak {band[4] * 100:.1f}%% above its prediction, "
            f"as 68%% of {band[2]} measured dense runs' peaks stayed within")
    if moe:
        text += (f"; {default_margin(moe=True):g} for mixtures of experts ({moe[4] * 100:.1f}%% "
                 f"over {moe[2]} runs)")
    return text


def _margin(text: str) -> float:
    from ..cost.regime import MAX_MEMORY_MARGIN
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_MEMORY_MARGIN:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a fraction in [0, {MAX_MEMORY_MARGIN}] (e.g. 0.1 keeps 10% free)")
    return value
