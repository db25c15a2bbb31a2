"""Read a torchtitan job TOML into autopar's terms (:func:`from_torchtitan_toml`);
:func:`from_torchtitan_doc` maps its keys, for the TOML and for a torchtitan >= 0.3 Python config
(:mod:`autopar.io.titan_config`).

It returns an :class:`~autopar.io.imported.Imported`: the :class:`~autopar.config.ParallelConfig`
fields, the :class:`~autopar.config.TrainingConfig` fields they set, and notes on what was
approximated or ignored. Nothing is executed; unknown keys are listed in ``notes``, never an
error.

Mappings (torchtitan's own ``config/job_config.py``):

torchtitan: ``parallelism.tensor_parallel_degree`` -> tp, ``pipeline_parallel_degree`` -> pp,
``context_parallel_degree`` -> cp, ``data_parallel_shard_degree`` x ``data_parallel_replicate_degree``
-> dp (a shard degree > 1 is FSDP2, i.e. ZeRO-3; replicate only is DDP, ZeRO-0),
``activation_checkpoint.mode`` -> recompute, ``training.local_batch_size`` (or ``batch_size``),
``training.global_batch_size``, ``training.seq_len``, ``parallelism.pipeline_parallel_microbatch_size``,
``expert_parallel_degree`` -> ep, ``expert_tensor_parallel_degree`` -> expert_tp (torchtitan's
default 1 when ep > 1 and the key is absent: job_config.py).
TP in torchtitan always shards the sequence between blocks (sequence parallelism on).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidParallelConfig
from ..models.presets import PRESETS
from .imported import Imported


#: torchtitan's "selective" mode is op-level SAC (selective_ac_option "op", its default).
_TT_RECOMPUTE = {"none": "none", "selective": "selective-op", "full": "full"}


def from_torchtitan_toml(source: str | Path) -> Imported:
    """Read a torchtitan job TOML (a file path, or the TOML text itself).

    Returns:
        :class:`Imported`; ``model`` is a preset name guessed from ``model.name`` and
        ``model.flavor`` (e.g. ``llama3`` + ``70B`` -> ``llama3-70b``) when both are given.

    Raises:
        InvalidParallelConfig: the file cannot be read, is not TOML, or has a mistyped value.
    """
    text = str(source)
    if "\n" not in text and "=" not in text:
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise InvalidParallelConfig(f"cannot read torchtitan TOML {source}: "
                                        f"{exc.strerror or exc}. Fix: pass the path of an "
                                        "existing job TOML (or its text).") from exc
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError as exc:
            raise InvalidParallelConfig("reading TOML needs Python >= 3.11 or the tomli "
                                        "package. Fix: pip install tomli.") from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidParallelConfig(f"torchtitan TOML is not valid TOML: {exc}. Fix: the file "
                                    "must be a torchtitan job TOML ([parallelism], [training], "
                                    "...) as torchtitan's --job.config_file takes.") from exc
    return from_torchtitan_doc(doc, "0.2")


def from_torchtitan_doc(doc: dict, series: str, what: str = "torchtitan") -> Imported:
    """A torchtitan job as sections of keys (the TOML's tables; a 0.3 Python config's
    ``config.<section>.<key>`` values, :mod:`autopar.io.titan_config`), into autopar's terms.
    ``series`` "0.2" or "0.3" decides what absent keys mean (0.3 has no expert tensor
    parallelism and all-gathers K/V under CP); ``what`` names the source in errors.

    Raises:
        InvalidParallelConfig: a mistyped value.
    """
    para = doc.get("parallelism", {})
    training = doc.get("training", {})
    ac = doc.get("activation_checkpoint", {})
    model = doc.get("model", {})
    notes: list[str] = []

    def integer(table: dict, key: str, where: str):
        v = table.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidParallelConfig(f"{what} {where}.{key} must be an integer; got {v!r}. "
                                        f"Fix: write it as a whole number, e.g. {key} = 1.")
        return v

    par: dict = {}
    train: dict = {}
    for key, dst in (("tensor_parallel_degree", "tp"), ("pipeline_parallel_degree", "pp"),
                     ("context_parallel_degree", "cp")):
        v = integer(para, key, "parallelism")
        if v is not None:
            par[dst] = v
    ep = integer(para, "expert_parallel_degree", "parallelism")
    if ep is not None:
        par["ep"] = ep
        if ep > 1:   # job_config.py: expert_tensor_parallel_degree defaults to 1 (0.3: none)
            etp = integer(para, "expert_tensor_parallel_degree", "parallelism")
            par["expert_tp"] = 1 if etp is None or series != "0.2" else etp
        if "deepep" in (para.get("expert_parallel_comm_backend"), model.get("moe_comm_backend")):
            par["dispatcher"] = "deepep"
    if series != "0.2" and par.get("cp", 1) > 1:
        # 0.3: llama3's flex attention all-gathers K/V (distributed/context_parallel/api.py)
        par["cp_mode"] = "allgather"
    elif par.get("cp", 1) > 1 and para.get("context_parallel_rotate_method") == "allgather":
        par["cp_mode"] = "allgather"
    shard = integer(para, "data_parallel_shard_degree", "parallelism")
    replicate = integer(para, "data_parallel_replicate_degree", "parallelism") or 1
    if shard is not None and shard > 0:
        par["dp"] = shard * replicate
    elif shard is None and replicate > 1:
        par["dp"] = replicate
    if shard == -1 or shard is None and replicate == 1:
        notes.append("data_parallel_shard_degree -1 (or unset): dp takes the GPUs left over.")
    if shard is None or shard == -1 or shard > 1 or par.get("cp", 1) > 1:
        # FSDP2 over the shard group, which torchtitan flattens with CP (ParallelDims:
        # fsdp_enabled = dp_shard or cp enabled; the mesh "dp_shard_cp"), so CP alone shards
        # too; without resharding after forward the parameters stay gathered from forward to
        # backward (ZeRO-2 memory, as autopar's torchtitan export writes)
        par["zero_stage"] = 2 if para.get("fsdp_reshard_after_forward") == "never" else 3
        if replicate > 1:
            notes.append(f"HSDP (replicate {replicate}) is modelled as ZeRO-3 over all of dp, "
                         "which undercounts model-state memory.")
    else:
        par["zero_stage"] = 0
    if par.get("tp", 1) > 1:
        par["sequence_parallel"] = para.get("enable_sequence_parallel", True) is not False
    mode = ac.get("mode")
    if mode is not None:
        if mode not in _TT_RECOMPUTE:
            raise InvalidParallelConfig(
                f"{what} activation_checkpoint.mode {mode!r} is not none/selective/full.")
        par["recompute"] = _TT_RECOMPUTE[mode]
        if mode == "selective" and str(ac.get("selective_ac_option", "op")) != "op":
            notes.append(f"selective_ac_option {ac.get('selective_ac_option')!r} (every n-th "
                         "block fully) is modelled as op-level selective checkpointing of every block.")
    schedule = str(para.get("pipeline_parallel_schedule", "")).lower()
    if schedule:
        # torch's names for the split-backward schedules (get_schedule_class); torchtitan runs
        # 2 stages per rank for a multi-stage schedule unless told otherwise
        # (distributed/pipeline_parallel.py pipeline_llm), which the V-shaped ones require
        split = {"interleavedzerobubble": "interleaved-zero-bubble",
                 "zbvzerobubble": "zbv-zero-bubble", "dualpipev": "dualpipev"}
        if schedule in split:
            par["schedule"] = split[schedule]
            par["virtual_stages"] = 2
        elif "interleaved" in schedule or "looped" in schedule:
            par["schedule"] = "interleaved-1f1b"
            par["virtual_stages"] = 2
            if not para.get("module_fqns_per_model_part"):
                notes.append(f"pipeline schedule {schedule!r}: modelled as interleaved 1F1B with "
                             "2 stages per rank (torchtitan's default split).")
        elif schedule == "gpipe":
            par["schedule"] = "gpipe"
        elif schedule != "1f1b":
            notes.append(f"pipeline schedule {schedule!r} is modelled as 1F1B.")
    parts = para.get("module_fqns_per_model_part")
    if isinstance(parts, list) and parts and all(isinstance(p, list) for p in parts):
        # the exact chunks (torchtitan's pipeline_module_split; autopar's export writes them):
        # one model part per pipeline chunk, its decoder blocks the "layers.N" entries
        par["stage_blocks"] = tuple(sum(1 for fqn in p if str(fqn).startswith("layers."))
                                    for p in parts)
        pp = par.get("pp", 1)
        if pp > 1 and len(parts) % pp == 0:
            par["virtual_stages"] = len(parts) // pp
    local = integer(training, "local_batch_size", "training")
    if local is None:
        local = integer(training, "batch_size", "training")
    gbs = integer(training, "global_batch_size", "training")
    seq = integer(training, "seq_len", "training")
    if seq is not None:
        train["seq_len"] = seq
    pp_mbs = integer(para, "pipeline_parallel_microbatch_size", "parallelism")
    if par.get("pp", 1) > 1:
        mbs = pp_mbs or 1
    else:
        mbs = local
    if mbs is not None:
        par["micro_batch_size"] = mbs
        train["micro_batch_size"] = mbs
    if gbs is not None and gbs > 0:
        train["global_batch_size"] = gbs
    prec = str(training.get("mixed_precision_param", "bfloat16"))
    train["precision"] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(prec, "bf16")
    if doc.get("float8") or doc.get("quantize", {}).get("linear", {}).get("float8"):
        train["precision"] = "fp8"
    preset = None
    if model.get("name") and model.get("flavor"):
        flavor = str(model["flavor"]).lower().replace("_", "-")
        # a flavor that is itself a preset name is one autopar's export wrote for a model
        # torchtitan has no flavor of ("llama2-7b" under "llama3"): read back as that preset
        preset = flavor if flavor in PRESETS else f"{model['name']}-{flavor}".replace("_", "-")
    return Imported(parallel=par, train=train, model=preset, notes=tuple(notes),
                    local_batch_size=None if gbs else local)
