"""The calibration file: what ``autopar calibrate`` measured, as frozen data, strictly loaded.

Layout (version 1; :meth:`Calibration.to_dict` writes it)::

    {"format": "autopar-calibration", "version": 1, "created": ISO-8601 str, "torch": str,
     "backend": "nccl" | "gloo",
     "device": {"kind": "cuda" | "cpu", "name": str, "catalog": str | null, "memory_bytes": num},
     "world": {"world_size": int, "local_world_size": int, "num_nodes": int},
     "model": str | null, "seq_len": int, "precision": "fp32" | "tf32" | "bf16" | "fp16",
     "measured_fields": [str, ...],
     "gemm": [{"m": int, "k": int, "n": int, "seconds": num}, ...],
     "attention": [{"batch": int, "heads": int, "kv_heads": int, "seq_len": int, "head_dim": int,
                    "causal": bool, "fwd_s": num, "fwd_bwd_s": num}, ...],
     "memory": {"copy_bytes": int, "copy_s": num, "launch_s": num},
     "collectives": [{"op": str, "scope": "intra" | "inter", "group_size": int, "nodes": int,
                      "nbytes": int, "seconds": num}, ...],
     "notes": [str, ...]}  (optional: what the run skipped, e.g. past its --budget)

Units: seconds, bytes. Every time is the median over timed repetitions of one call (collectives:
the slowest rank's median, since a collective ends when its last rank does). ``device.catalog``
is the catalogue GPU the measured device is (``autopar.hardware.devices``), null for a CPU or an
unknown GPU. ``measured_fields`` names the cost-model constants the file determines
(:func:`measured_fields`); it must agree with the measurements present.

Rules: no unknown keys, every value of its JSON type, sizes positive, times positive and finite,
ops and scopes from their lists. A version this autopar does not know is refused. Nothing here
executes code from the file.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import InvalidCalibration, output_error

CALIBRATION_FORMAT = "autopar-calibration"
#: Version of the layout this autopar writes and reads.
CALIBRATION_VERSION = 1
#: Collective ops measured (``torch.distributed`` calls: all_reduce, all_gather_into_tensor,
#: reduce_scatter_tensor, all_to_all_single, and a send/recv pair), named as the cost model does.
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
#: "intra": every rank of a group on one node; "inter": one rank per node (a rail group).
SCOPES = ("intra", "inter")
#: Precisions whose GEMMs ``torch.matmul`` runs (fp8 needs scaled kernels: not measured).
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

_FIX = "Fix: rerun `autopar calibrate --out FILE` to regenerate the file."


@dataclass(frozen=True)
class DeviceInfo:
    """The measured device: ``kind`` "cuda" or "cpu", ``name`` as torch reports it, ``catalog``
    the catalogue GPU name it matched (None: a CPU or a GPU not in the catalogue),
    ``memory_bytes`` its memory (the GPU's total; a CPU's physical memory)."""

    kind: str
    name: str
    catalog: str | None
    memory_bytes: float


@dataclass(frozen=True)
class World:
    """The process layout measured: ranks in all, ranks per node, nodes."""

    world_size: int
    local_world_size: int
    num_nodes: int


@dataclass(frozen=True)
class GemmSample:
    """One ``(m x k) @ (k x n)`` GEMM and its median seconds (2mkn FLOPs)."""

    m: int
    k: int
    n: int
    seconds: float

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s (multiply-add = 2 FLOPs)."""
        return 2.0 * self.m * self.k * self.n / self.seconds


@dataclass(frozen=True)
class AttentionSample:
    """``F.scaled_dot_product_attention`` on [batch, heads, seq_len, head_dim] queries and
    ``kv_heads`` key/value heads: forward seconds and forward+backward seconds."""

    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    causal: bool
    fwd_s: float
    fwd_bwd_s: float

    @property
    def counted_flops(self) -> float:
        """Forward FLOPs as the graph counts them (non-causal, 4*b*heads*s*s*head_dim;
        torch.utils.flop_counter's SDPA rule)."""
        return 4.0 * self.batch * self.heads * self.seq_len ** 2 * self.head_dim


@dataclass(frozen=True)
class MemorySample:
    """A device-to-device copy of ``copy_bytes`` (read + write = 2x bytes moved) in ``copy_s``,
    and ``launch_s``, the time of one tiny kernel issued back to back (the launch floor)."""

    copy_bytes: int
    copy_s: float
    launch_s: float

    @property
    def bandwidth_Bps(self) -> float:
        """Bytes moved per second: 2 x copy_bytes / copy_s (STREAM's copy convention)."""
        return 2.0 * self.copy_bytes / self.copy_s


@dataclass(frozen=True)
class CollectiveSample:
    """One collective of ``nbytes`` (nccl-tests conventions, ``hardware.collectives``) over
    groups of ``group_size`` ranks spanning ``nodes`` nodes, all groups running at once."""

    op: str
    scope: str
    group_size: int
    nodes: int
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class Calibration:
    """A calibration file's content (module docstring: layout and rules).

    Use it with ``autopar.optimize(..., calibration=cal)`` / ``estimate`` or the CLI's
    ``--calibration FILE``; :func:`autopar.calibrate.calibrated` maps it onto the cost model.
    """

    created: str
    torch: str
    backend: str
    device: DeviceInfo
    world: World
    model: str | None
    seq_len: int
    precision: str
    measured_fields: tuple[str, ...]
    gemm: tuple[GemmSample, ...]
    attention: tuple[AttentionSample, ...]
    memory: MemorySample | None
    collectives: tuple[CollectiveSample, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """The JSON object of the file (format and version first; ``notes`` only when there
        are any, so that a complete run's file keeps its bytes)."""
        d = asdict(self)
        d["notes"] = list(self.notes)
        if not self.notes:
            del d["notes"]
        d["measured_fields"] = list(self.measured_fields)
        for key in ("gemm", "attention", "collectives"):
            d[key] = list(d[key])
        return {"format": CALIBRATION_FORMAT, "version": CALIBRATION_VERSION, **d}

    def to_json(self, path: str | Path) -> None:
        """Write the file to ``path``.

        Raises:
            OutputError: the path cannot be written.
        """
        try:
            Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        except OSError as exc:
            raise output_error(path, exc) from exc


def measured_fields(cal_gemm, cal_attention, cal_memory, cal_collectives) -> tuple[str, ...]:
    """Names of the cost-model constants the measurements determine (see docs/calibrate.md):
    GEMMs -> the GEMM efficiency curve, attention -> its efficiency, the copy -> HBM efficiency
    and the launch floor, intra/inter collectives -> the intra-node / inter-node link's
    bandwidth and latency (and the collective launch latency)."""
    out = []
    if cal_gemm:
        out += ["CostParams.matmul_efficiency", "CostParams.matmul_half_size"]
    if cal_attention:
        out.append("CostParams.attention_efficiency")
    if cal_memory is not None:
        out += ["CostParams.hbm_efficiency", "CostParams.kernel_launch_s"]
    scopes = {c.scope for c in cal_collectives}
    if "intra" in scopes:
        out += ["CommParams.launch_latency_s", "Cluster.intra_link.bandwidth_Bps",
                "Cluster.intra_link.latency_s"]
    if "inter" in scopes:
        if "intra" not in scopes:
            out.append("CommParams.launch_latency_s")
        out += ["Cluster.inter_link.bandwidth_Bps", "Cluster.inter_link.latency_s"]
    return tuple(out)


# ------------------------------------------------------------------------------------ loading
def _fail(where: str, rule: str) -> InvalidCalibration:
    return InvalidCalibration(f"invalid calibration file: {where} {rule}. {_FIX}")


def _obj(d: Any, where: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(d, dict):
        raise _fail(where, f"must be a JSON object; got {type(d).__name__}")
    unknown = sorted(str(k) for k in d if k not in keys and k not in optional)
    if unknown:
        raise _fail(where, f"has unknown key(s) {unknown} (allowed: {sorted(keys + optional)})")
    missing = [k for k in keys if k not in d]
    if missing:
        raise _fail(where, f"lacks required key(s) {missing}")
    return d


def _int(v: Any, where: str, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise _fail(where, f"must be an int >= {low}; got {v!r:.60}")
    return v


def _pos(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        raise _fail(where, f"must be a positive finite number; got {v!r:.60}")
    return float(v)


def _str(v: Any, where: str, choices: tuple[str, ...] | None = None, null: bool = False):
    if v is None and null:
        return None
    if not isinstance(v, str) or not v:
        raise _fail(where, f"must be a non-empty string{' or null' if null else ''}; got "
                           f"{v!r:.60}")
    if choices is not None and v not in choices:
        raise _fail(where, f"= {v!r} is not one of {list(choices)}")
    return v


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise _fail(where, f"must be a JSON list; got {type(v).__name__}")
    return v


def _record(cls, d: Any, where: str, kinds: dict) -> Any:
    """``cls(**d)`` with each field checked by its kind: "int", "pos", "bool", "str"."""
    d = _obj(d, where, tuple(f.name for f in fields(cls)))
    out = {}
    for key, kind in kinds.items():
        w = f"{where}.{key}"
        if kind == "int":
            out[key] = _int(d[key], w)
        elif kind == "pos":
            out[key] = _pos(d[key], w)
        elif kind == "bool":
            if not isinstance(d[key], bool):
                raise _fail(w, f"must be true or false; got {d[key]!r:.60}")
            out[key] = d[key]
        else:
            out[key] = _str(d[key], w, kind if isinstance(kind, tuple) else None)
    return cls(**out)


_TOP = ("format", "version", "created", "torch", "backend", "device", "world", "model",
        "seq_len", "precision", "measured_fields", "gemm", "attention", "memory", "collectives")


def check_calibration(d: Any) -> Calibration:
    """A :class:`Calibration` from a parsed calibration file, after every rule of the module
    docstring.

    Raises:
        InvalidCalibration: naming the field, the rule it breaks, and the fix.
    """
    if not isinstance(d, dict) or d.get("format") != CALIBRATION_FORMAT:
        got = type(d).__name__ if not isinstance(d, dict) else f"format={d.get('format')!r:.40}"
        raise InvalidCalibration(
            f"not an autopar calibration: expected a JSON object with format="
            f"{CALIBRATION_FORMAT!r}; got {got}. Fix: pass a file written by `autopar calibrate "
            "--out FILE`.")
    v = d.get("version")
    if isinstance(v, bool) or not isinstance(v, int) or v != CALIBRATION_VERSION:
        raise _fail("version", f"= {v!r:.40}: this autopar reads version {CALIBRATION_VERSION} "
                               "(a newer file needs a newer autopar)")
    d = _obj(d, "the calibration", _TOP, optional=("notes",))
    notes = tuple(_str(n, f"notes[{i}]") for i, n in enumerate(_list(d.get("notes", []),
                                                                      "notes")))
    dev = _obj(d["device"], "device", tuple(f.name for f in fields(DeviceInfo)))
    device = DeviceInfo(_str(dev["kind"], "device.kind", ("cuda", "cpu")),
                        _str(dev["name"], "device.name"),
                        _str(dev["catalog"], "device.catalog", null=True),
                        _pos(dev["memory_bytes"], "device.memory_bytes"))
    if device.kind == "cpu" and device.catalog is not None:
        raise _fail("device.catalog", "must be null for a CPU (the catalogue lists GPUs)")
    world = _record(World, d["world"], "world",
                    {"world_size": "int", "local_world_size": "int", "num_nodes": "int"})
    if world.local_world_size * world.num_nodes != world.world_size:
        raise _fail("world", f"has local_world_size*num_nodes = {world.local_world_size}*"
                             f"{world.num_nodes} != world_size {world.world_size}")
    gemm = tuple(_record(GemmSample, g, f"gemm[{i}]", {"m": "int", "k": "int", "n": "int",
                                                        "seconds": "pos"})
                 for i, g in enumerate(_list(d["gemm"], "gemm")))
    attention = tuple(_record(AttentionSample, a, f"attention[{i}]", {
        "batch": "int", "heads": "int", "kv_heads": "int", "seq_len": "int", "head_dim": "int",
        "causal": "bool", "fwd_s": "pos", "fwd_bwd_s": "pos"})
        for i, a in enumerate(_list(d["attention"], "attention")))
    memory = None if d["memory"] is None else _record(
        MemorySample, d["memory"], "memory", {"copy_bytes": "int", "copy_s": "pos",
                                              "launch_s": "pos"})
    coll = tuple(_record(CollectiveSample, c, f"collectives[{i}]", {
        "op": COLLECTIVE_OPS, "scope": SCOPES, "group_size": "int", "nodes": "int",
        "nbytes": "int", "seconds": "pos"})
        for i, c in enumerate(_list(d["collectives"], "collectives")))
    for i, c in enumerate(coll):
        if c.group_size < 2 or c.nodes > world.num_nodes or (c.scope == "intra") != (c.nodes == 1):
            raise _fail(f"collectives[{i}]", f"({c.op}, {c.scope}, group_size={c.group_size}, "
                                             f"nodes={c.nodes}) is not a group the measured "
                                             "world has (intra: one node; inter: several)")
    names = _list(d["measured_fields"], "measured_fields")
    expect = measured_fields(gemm, attention, memory, coll)
    if tuple(names) != expect:
        raise _fail("measured_fields", f"= {names!r:.200} does not match the measurements "
                                       f"present, which determine {list(expect)}")
    model = _str(d["model"], "model", null=True)
    return Calibration(
        created=_str(d["created"], "created"), torch=_str(d["torch"], "torch"),
        backend=_str(d["backend"], "backend"), device=device, world=world, model=model,
        seq_len=_int(d["seq_len"], "seq_len"),
        precision=_str(d["precision"], "precision", PRECISIONS),
        measured_fields=expect, gemm=gemm, attention=attention, memory=memory,
        collectives=coll, notes=notes)


def load_calibration(source: str | Path | dict | Calibration) -> Calibration:
    """A :class:`Calibration` from a file path, a parsed dict, or itself.

    Raises:
        InvalidCalibration: unreadable file, bad JSON, or any rule of :func:`check_calibration`.
    """
    if isinstance(source, Calibration):
        return source
    if isinstance(source, dict):
        return check_calibration(source)
    if not isinstance(source, (str, Path)):
        raise InvalidCalibration(
            f"calibration must be a file path, a dict or an autopar Calibration; got "
            f"{type(source).__name__}. Fix: pass the file `autopar calibrate --out FILE` wrote.")
    try:
        text = Path(source).read_text()
    except OSError as exc:
        raise InvalidCalibration(f"cannot read calibration file {source}: "
                                 f"{exc.strerror or exc}. Fix: check the path.") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidCalibration(f"calibration file {source} is not JSON ({exc}). {_FIX}") \
            from exc
    return check_calibration(data)
