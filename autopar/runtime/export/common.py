"""What every exporter shares: the :class:`Export` result, per-block recompute helpers, and
:func:`finish`, which appends the re-estimate of what an export really writes."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

from ...config import ParallelConfig
from ...errors import InvalidTrainingConfig
from ...hardware import Cluster
from ..verdict import verdict

#: Recompute modes by what they keep, most first (autopar.config.RECOMPUTE_MODES order).
_MODE_ORDER = ("none", "selective", "selective-op", "full")


class Export(str):
    """An exported plan: its text (a ``str``, as :meth:`text` writes it: print it, write it to a
    file, slice it), carrying what made it.

    It compares and hashes as that text. It is read-only.

    Attributes:
        value: the framework's form (list of CLI arguments, TOML text, JSON-able dict, or a
            command/script string).
        warnings: plan choices the framework cannot express, each with the nearest equivalent
            that ``value`` uses instead.
        comment: the comment prefix of the text form ("#"; "" for JSON, which has none).
        written: the configuration the value really runs, in autopar's terms (None for
            launchers, which run the plan as it is).
        fits: whether ``written`` fits in memory under autopar's re-estimate (None when not
            re-estimated).
        body: the text form of ``value`` when it is not JSON (a dict written as YAML).
    """

    value: object
    warnings: tuple[str, ...]
    comment: str
    written: ParallelConfig | None
    fits: bool | None
    body: str | None

    # a str, so that plan.to_slurm_script()[:800] and len() work as on the text a user sees
    def __new__(cls, value: object, warnings: tuple[str, ...] = (), comment: str = "#",
                written: ParallelConfig | None = None, fits: bool | None = None,
                body: str | None = None) -> "Export":
        warnings = tuple(warnings)
        self = super().__new__(cls, _text(value, warnings, comment, body))
        for name, v in (("value", value), ("warnings", warnings), ("comment", comment),
                        ("written", written), ("fits", fits), ("body", body)):
            object.__setattr__(self, name, v)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"an Export is read-only (setting {name!r}); build a new one")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"an Export is read-only (deleting {name!r})")

    def with_warnings(self, warnings: tuple[str, ...]) -> "Export":
        """This export with ``warnings`` in place of its own, its text remade (not named
        ``replace``: that is the text's ``str.replace``)."""
        return Export(**{**self._fields(), "warnings": tuple(warnings)})

    def _fields(self) -> dict:
        return {"value": self.value, "warnings": self.warnings, "comment": self.comment,
                "written": self.written, "fits": self.fits, "body": self.body}

    def __reduce__(self):
        return (Export, tuple(self._fields().values()))

    def __repr__(self) -> str:
        return (f"Export(value={self.value!r}, warnings={self.warnings!r}, "
                f"written={self.written!r}, fits={self.fits!r})")

    def __str__(self) -> str:
        """:meth:`text`, so ``print(plan.to_torchrun_command("train.py"))`` prints the command."""
        return self.text()

    def text(self) -> str:
        """The value as text (a plain ``str``), warnings first as comments (for JSON: under
        ``"_autopar_warnings"``, a key DeepSpeed ignores)."""
        return str.__str__(self)


def _text(value: object, warnings: tuple[str, ...], comment: str, body: str | None) -> str:
    """:meth:`Export.text` of these fields."""
    if isinstance(value, dict) and body is None:
        d = dict(value)
        if warnings:
            d["_autopar_warnings"] = list(warnings)
        return json.dumps(d, indent=2) + "\n"
    # a list is command-line arguments: quoted for a POSIX shell (a layout string holds | and *)
    body = (body if body is not None else shlex.join(value)
            if isinstance(value, list) else str(value))
    head = "".join(f"{comment} autopar: {w}\n" for w in warnings)
    tail = "" if body.endswith("\n") else "\n"
    if body.startswith("#!"):
        # a script's interpreter line must stay first (sbatch and the kernel read only it)
        shebang, _, rest = body.partition("\n")
        return shebang + "\n" + head + rest + tail
    return head + body + tail


def block_modes(plan) -> tuple[str, ...]:
    """The recompute mode of every decoder block of ``plan``."""
    c = plan.config
    if isinstance(c.recompute, str):
        n = sum(c.stage_blocks) if c.stage_blocks else (
            (plan.model_config or {}).get("num_layers") or 1)
        return (c.recompute,) * n
    return tuple(c.recompute)


def one_reshard_policy(c: ParallelConfig, w: ParallelConfig, framework: str,
                       warn: list[str]) -> ParallelConfig:
    """``w`` with per-block FSDP resharding dropped (every block reshards after forward), said
    in ``warn``, when ``c`` keeps some blocks' gathered parameters: Megatron, torchtitan and
    DeepSpeed set one policy for all blocks (:mod:`autopar.frameworks`, ``per_block_reshard``)."""
    if c.reshard_after_forward is None:
        return w
    kept = sum(1 for f in c.reshard_after_forward if not f)
    warn.append(f"reshard_after_forward: {kept} blocks keep their gathered parameters from "
                f"forward to backward; {framework} sets one policy for all blocks, so every block "
                "reshards (one more all-gather per micro-batch for those blocks, less memory)")
    return w.replace(reshard_after_forward=None)


def strongest_mode(modes) -> str:
    """The mode that saves the most memory among ``modes`` (none < selective < full)."""
    return max(modes, key=_MODE_ORDER.index)


def uniform(blocks: tuple[int, ...]) -> bool:
    """All entries equal (or none)."""
    return len(set(blocks)) <= 1


#: Training fields an exporter writes back to their default when its framework has no switch
#: for them (:func:`unwritten`).
_TRAIN_DEFAULTS = {"activation_offload": False, "optimizer_state_dtype": "fp32"}


def unwritten(t, name: str, warn: list[str], note: str):
    """``t`` (a TrainingConfig) with field ``name`` back at its default (:data:`_TRAIN_DEFAULTS`)
    and ``note`` appended to ``warn`` when it was not at the default; ``t`` unchanged otherwise."""
    default = _TRAIN_DEFAULTS[name]
    if getattr(t, name) == default:
        return t
    warn.append(note)
    return replace(t, **{name: default})


def finish(plan, value, warn: list[str], written: ParallelConfig, framework: str,
            comment: str = "#", train=None, needs: str = "",
            wrote_edits: tuple[str, ...] = (), limits: dict | None = None,
            framework_cut: bool = False, runner_edits: dict | None = None) -> Export:
    """The export, with the re-estimate of ``written`` under ``framework`` appended (``needs``:
    what the user must add before the file starts; ``wrote_edits``: the plan's profile edits
    the file sets; ``limits``: degrees the runner fixes, kept by the nearest plan;
    ``framework_cut``: the stage cut is the framework's own computation; ``runner_edits``:
    cost fields where the runner differs from the profile; :func:`autopar.runtime.verdict.
    verdict`)."""
    lines, fits = verdict(plan, written, framework, train, needs, wrote_edits, limits,
                          framework_cut, runner_edits)
    return Export(value, tuple(warn + lines), comment=comment, written=written, fits=fits)


def node_layout(plan) -> tuple[int, int, list[str]]:
    """(nodes, processes per node, warnings) for the plan's world on its cluster."""
    cluster = Cluster.from_spec(plan.cluster)
    world, per_node = plan.world_size, cluster.gpus_per_node
    warn = []
    if world < per_node:
        per_node = world
    if world % per_node:
        warn.append(f"{world} ranks do not fill whole {per_node}-GPU nodes; used "
                    f"{-(-world // per_node)} nodes with {per_node} ranks each (adjust by hand)")
    return -(-world // per_node), per_node, warn


#: The rendezvous port the launch commands use (torchrun's default, c10d rendezvous).
RDZV_PORT = 29500


def torchrun_command(plan, script: str, script_args: tuple[str, ...] = (), *,
                     rdzv_host: str = "$MASTER_ADDR", rdzv_port: int = RDZV_PORT,
                     rdzv_id: str = "autopar") -> tuple[str, list[str]]:
    """(the ``torchrun`` command line, one per node, that starts the plan's ranks running
    ``script``; warnings): the standalone rendezvous on one node, c10d at ``rdzv_host``
    otherwise (:func:`autopar.runtime.launch.to_torchrun_command` documents the arguments).

    Raises:
        InvalidTrainingConfig: ``script`` is not a non-empty string (an empty one was written as
            ``''``, which torchrun cannot start).
    """
    if not isinstance(script, str) or not script.strip():
        raise InvalidTrainingConfig(
            f"the training script must be a non-empty path; got {script!r}. Fix: the script each "
            "rank runs, e.g. to_torchrun_command('train.py').")
    nodes, per_node, warn = node_layout(plan)
    cmd = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={per_node}"]
    if nodes == 1:
        cmd.append("--standalone")
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_host}:{rdzv_port}",
                f"--rdzv-id={rdzv_id}"]
    cmd += [shlex.quote(script), *(shlex.quote(a) for a in script_args)]
    return " ".join(cmd), warn


#: Rank orders each framework can build, innermost dimension first (autopar's ``placement``
#: convention), with the flag that selects each (None: the framework's default, no flag).
#: Sources: Megatron-LM ``megatron/training/arguments.py`` ``--use-tp-pp-dp-mapping`` ("changes
#: the order from tp-cp-ep-dp-pp to tp-cp-ep-pp-dp", read at d98e8a64ddf3); torchtitan 0.2.2
#: ``torchtitan/distributed/parallel_dims.py`` builds its mesh as [pp, dp_replicate, dp_shard,
#: cp, tp] with no option; DeepSpeed 0.19 ``deepspeed/runtime/pipe/topology.py``
#: ``PipeModelDataParallelTopology`` axes [pipe, data, model], no option.
RANK_ORDERS: dict[str, tuple[tuple[tuple[str, ...], list[str]], ...]] = {
    "megatron": ((("tp", "cp", "dp", "pp"), []),
                 (("tp", "cp", "pp", "dp"), ["--use-tp-pp-dp-mapping"])),
    "torchtitan": ((("tp", "cp", "dp", "pp"), []),),
    "deepspeed": ((("tp", "cp", "dp", "pp"), []),),
    # accelerate 1.16 parallelism_config.py ParallelismConfig._get_mesh: mesh_order
    # ["dp_replicate", "dp_shard", "cp", "sp", "tp"], outermost first, no option
    "accelerate": ((("tp", "cp", "dp", "pp"), []),),
}


def own_rounds(c: ParallelConfig, framework: str, warn: list[str]) -> ParallelConfig:
    """``c`` without Megatron-LM's micro-batch group (:attr:`ParallelConfig.vp_group`) for a
    ``framework`` whose interleaved schedule takes its own rounds (torch's
    ``ScheduleInterleaved1F1B``; DeepSpeed and ColossalAI have none to group), said in
    ``warn``; ``c`` itself when it has none."""
    if c.vp_group is None:
        return c
    warn.append(f"vp_group {c.vp_group}: {framework} sets the micro-batch groups of an "
                "interleaved schedule itself; not written, the plan re-estimated without it")
    return c.replace(vp_group=None)


def rank_order(c: ParallelConfig, framework: str, warn: list[str]) -> tuple[list[str], tuple]:
    """(flags selecting the plan's rank placement in ``framework``, the placement the framework
    will really build). Only dimensions of degree > 1 decide: orders that differ only in trivial
    dimensions are the same layout. A placement the framework cannot build is said in ``warn``
    and replaced by the framework's default (which the re-estimate then prices)."""
    want = tuple(c.placement or ("tp", "cp", "dp", "pp"))

    def real(order):
        return tuple(d for d in order if getattr(c, d) > 1)

    for order, flags in RANK_ORDERS[framework]:
        if real(order) == real(want):
            return list(flags), want
    default = RANK_ORDERS[framework][0][0]
    warn.append(f"rank placement {'-'.join(want)} (innermost first): {framework} builds only "
                + " or ".join("-".join(o) for o, _ in RANK_ORDERS[framework])
                + f"; the groups are laid out as {'-'.join(default)}")
    return [], default


def balanced_cut(total: int, parts: int) -> tuple[int, ...]:
    """``total`` layers cut into ``parts`` stages differing by at most one, larger first."""
    q, r = divmod(total, parts)
    return tuple(q + (1 if i < r else 0) for i in range(parts))
