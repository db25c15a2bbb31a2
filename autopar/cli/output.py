"""How the commands report: search progress and Ctrl-C handling while a search runs, the cost of
the whole run (``--tokens``, ``--price-per-gpu-hour``), the estimate's trust lines, and the JSON
output with its units."""

from __future__ import annotations

import json
import signal
import threading

from rich.console import Console

from ..errors import InvalidTrainingConfig
from ..report.advice import run_cost
from ..report.summary import plural, trust_lines


class Progress:
    """The search's progress callback: stage, share done and the best step time so far
    (printed unless ``quiet``); after a first Ctrl-C it stops the search as soon as a plan
    exists, so the best plan so far is printed (see :class:`Interrupt`). :meth:`stopped`
    says where a stopped search ended."""

    #: What each stage counts, as the lines name it (``search``: the mesh groups of
    #: :func:`autopar.search.phases.mesh_groups`, counted as ``meshes`` in the plan's summary).
    WHAT = {"search": "meshes", "refine": "refinement of the best candidates"}

    def __init__(self, console: Console, quiet: bool = False, interrupt: "Interrupt | None" = None):
        self.console, self.last, self.quiet, self.interrupt = console, None, quiet, interrupt
        self.at: tuple[str, int, int] | None = None   # the last (stage, done, total) reported

    def __call__(self, stage, done, total, best):
        self.at = (stage, done, total)
        if self.interrupt is not None and self.interrupt.pressed and best is not None \
                and done < total:
            raise KeyboardInterrupt  # the search catches it and returns the best so far
        if self.quiet:
            return
        pct = 100 * done // max(total, 1)
        key = (stage, pct // 20)
        if key == self.last:
            return
        self.last = key
        msg = f"searching {self.WHAT.get(stage, stage)}: {done}/{total}"
        if best is not None:
            msg += (f", best so far {best.step_time_s:.3f} s/step (tp={best.config.tp} "
                    f"pp={best.config.pp} dp={best.config.dp} cp={best.config.cp})")
        self.console.print(msg, style="dim", highlight=False)

    def cause(self) -> str:
        """What stopped an incomplete search: ``"interrupt"`` (Ctrl-C) or ``"time limit"``."""
        return ("interrupt" if self.interrupt is not None and self.interrupt.pressed
                else "time limit")

    def why(self) -> str:
        """:meth:`cause` for a sentence: ``"the interrupt"`` or ``"the time limit"``."""
        return f"the {self.cause()}"

    def stopped(self, search) -> None:
        """After a search that did not finish (``search``: the plan's
        :class:`~autopar.plan.SearchStats`): the line that says where it stopped and why, e.g.
        ``search stopped by the interrupt at 12/210 meshes (35 configurations estimated)``."""
        if self.quiet or search.complete:
            return
        where = ""
        if self.at is not None:
            stage, done, total = self.at
            where = f" at {done}/{total} {self.WHAT.get(stage, stage)}"
        self.console.print(f"search stopped by {self.why()}{where} "
                           f"({plural(search.evaluated, 'configuration')} estimated): the plan "
                           "is the best found before it, not necessarily the best in the space",
                           style="yellow", highlight=False)


class Interrupt:
    """SIGINT handling from the start of a search to the end of its output: the first Ctrl-C
    asks the search to stop at its best plan so far (it continues until it has one) and the plan
    is printed, even if the search had just finished; a second one aborts at once. Outside this
    context Python's default handler applies (KeyboardInterrupt, answered by
    :func:`autopar.cli.main`). A no-op outside the main thread."""

    def __init__(self, console: Console):
        self.console, self.pressed, self._old = console, False, None

    def _handler(self, signum, frame):
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        self.console.print("interrupt: stopping with the best plan found so far (Ctrl-C again "
                           "to abort)", style="yellow", highlight=False)

    def __enter__(self) -> "Interrupt":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def run_costs(args, rows):
    """``[(name, estimate, run cost)]`` of ``rows`` (``[(name, estimate)]``) for ``--tokens``
    at ``--price-per-gpu-hour`` (:func:`autopar.report.advice.run_cost`); None without
    ``--tokens``.

    Raises:
        InvalidTrainingConfig: a price without ``--tokens``, or a bad ``--currency``.
    """
    if args.tokens is None:
        if args.price_per_gpu_hour is not None:
            raise InvalidTrainingConfig("--price-per-gpu-hour needs --tokens (the run's length). "
                                        "Fix: add e.g. --tokens 2e12.")
        return None
    currency = currency_code(args)
    return [(name, e, run_cost(e, args.tokens, args.price_per_gpu_hour,
                               e.config.tp * e.config.pp * e.config.cp * e.config.dp,
                               currency=currency))
            for name, e in rows]


def currency_code(args) -> str:
    """``--currency`` as an upper-case ISO 4217 code.

    Raises:
        InvalidTrainingConfig: not three letters.
    """
    code = str(getattr(args, "currency", None) or "USD")
    if not (len(code) == 3 and code.isascii() and code.isalpha()):
        raise InvalidTrainingConfig(f"--currency {code!r} is not an ISO 4217 currency code. Fix: "
                                    "three letters, e.g. --currency EUR (default USD)")
    return code.upper()


def json_units(currency: str) -> dict:
    """The ``units`` object of the JSON output: the unit of each field whose name carries none
    (top-level names end in ``_s``, ``_bytes``, ``_per_s``), wherever that field appears (a
    plan's estimate and alternatives, explain's best plan and comparisons)."""
    return {"time_breakdown": "s", "memory_breakdown": "bytes",
            "stage_memory_breakdown": "bytes", "mfu": "fraction of peak FLOP/s",
            "hfu": "fraction of peak FLOP/s",
            "error_band": {"half_width": "fraction of step_time_s (null: unvalidated regime)",
                           "bias": "fraction (null: unvalidated regime)"},
            "free_memory_fraction": "fraction of memory_limit_bytes",
            "search_memory_margin": "fraction of memory_limit_bytes",
            "run_cost": {"seconds": "s", "days": "days of 86,400 s", "gpu_hours": "GPU-hours",
                         "cost": currency, "price_per_gpu_hour": f"{currency} per GPU-hour"}}


def print_trust(out: Console, e) -> None:
    """The estimate's expected error band and plausibility warnings, under its step time."""
    for label, text in trust_lines(e):
        out.print(f"{label}: {text}", style="yellow" if label == "warning" else None,
                  highlight=False, markup=False)


def print_error_json(kind: str, message: str) -> None:
    """A failed command's output under ``--json``: one JSON object on stdout,
    ``{"error": {"type": kind, "message": message}}`` (``kind``: the
    :class:`~autopar.errors.AutoparError` subclass's name, or ``"UsageError"`` for a bad flag)."""
    print(json.dumps({"error": {"type": kind, "message": message}}, indent=2, sort_keys=True),
          flush=True)


def finish(args, data: dict, err: Console) -> None:
    """Print ``data`` as JSON with ``--json``; note the plot file otherwise."""
    if args.json:
        data = {**data, "units": json_units(currency_code(args))}
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    if args.plot and not args.json:
        err.print(f"wrote {args.plot}", style="dim")
