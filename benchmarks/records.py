"""Read records in the format of benchmarks/data/published_plans.json into autopar inputs.

A record's ``cluster.inter_node`` is prose ("8x InfiniBand HDR 200 Gb/s per node (one per GPU)",
"RoCE 400 Gb/s per GPU, 3-tier Clos"); the link and NIC count are read from it here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

import autopar
from autopar.config import CP_MODES
from autopar.frameworks.layersplit import MegatronLayerSplit
from autopar.hardware import get_device
from autopar.hardware.boxes import node_template
from autopar.models import ModelConfig
from autopar.models.config import MOE_FIELDS, ROUTER_DEFAULTS

#: The published runs the benchmarks and tests use, carried in the repository (each record keeps
#: its ``source``; the format is described in benchmarks/data/README.md).
DEFAULT_PLANS = Path(__file__).resolve().parent / "data" / "published_plans.json"
#: GPU names records use -> catalog names.
_GPU_ALIASES = {"H800": "H800-SXM5-80GB", "H200": "H200-SXM-141GB",
                "NVIDIA A800": "A800-SXM4-80GB", "NVIDIA A800-SXM4-80GB": "A800-SXM4-80GB",
                "Tesla V100-SXM2-32GB": "V100-SXM2-32GB", "Tesla V100-SXM2-16GB": "V100-SXM2-16GB",
                "NVIDIA V100": "V100-SXM2-32GB", "V100 32GB": "V100-SXM2-32GB",
                "V100 16GB": "V100-SXM2-16GB"}

_PLAN_KEYS = ("tp", "pp", "dp", "cp", "virtual_stages", "sequence_parallel", "recompute",
              "zero_stage", "schedule")
#: What a record's ``plan.pipeline_split`` may name: the parts Megatron-LM counts as a layer
#: of the pipeline split (--account-for-embedding-in-pipeline-split, --account-for-loss-in-
#: pipeline-split; autopar.frameworks.layersplit.MegatronLayerSplit)
_SPLIT_PARTS = ("embedding", "loss")


@dataclass(frozen=True)
class Record:
    """One published run as autopar inputs."""

    id: str
    model: ModelConfig
    cluster: autopar.Cluster
    train: autopar.TrainingConfig
    fixed: dict          # the plan's published (non-null) choices
    open_fields: tuple   # fields the source does not give (the evaluator chooses them)
    measured_step_s: float | None
    measured_note: str
    raw: dict
    framework: str = ""
    source_key: str = ""
    assumed: tuple = ()
    measured_memory_gib: float | None = None
    oom: bool = False
    memory_kind: str | None = None
    memory_kind_text: str = ""
    memory_rank: str = "peak"
    memory_at_oom_gib: float | None = None
    oom_phase: str = ""
    fp8_recipe: str = ""
    torch_compile: bool | None = None
    #: the attention kernel the run names when it is not its framework's own: "fa3"
    #: (FlashAttention-3 called directly); "" = the framework's
    attention_kernel: str = ""
    grad_reduce_dtype: str | None = None
    loss_compiled: bool = False

    @property
    def ran(self) -> bool:
        """Whether the run is published as having run (a step time or a peak memory), not as
        out of memory."""
        return not self.oom and bool(self.measured_step_s or self.measured_memory_gib)


#: What a published peak-memory figure counts (``measured.memory_kind``), normalised: the word
#: that names a torch.cuda counter or a device-wide reading, first match in this order.
#: "reserved": torch.cuda.max_memory_reserved (reserved_bytes.all.peak, torchtitan's logged
#: "memory"); "allocated": max_memory_allocated (allocated_bytes.all.peak, Megatron's
#: mem-max-allocated-bytes); "active": active_bytes.all.peak (torchtune's "Peak Memory Active");
#: "device": the whole device's used memory (nvidia-smi, torch.cuda.mem_get_info). None: not
#: stated (compared with autopar's whole-device figure).
MEMORY_KINDS = (("reserved", "reserved"), ("allocated", "allocated"), ("active", "active"),
                ("nvidia-smi", "device"), ("mem_get_info", "device"), ("device", "device"))


def memory_kind(text: str | None) -> str | None:
    """The normalised kind (:data:`MEMORY_KINDS`) of a record's ``measured.memory_kind``
    text, None when it is not stated or names none of them."""
    t = (text or "").lower()
    for word, kind in MEMORY_KINDS:
        if word in t:
            return kind
    return None


def memory_rank(text: str | None) -> str:
    """Which rank a published peak was read on: "last" when the ``measured.memory_kind``
    text says the last rank (Megatron-LM logs its memory from the last rank, the TensorBoard
    writer), else "peak" (the largest rank, or a single-rank run)."""
    return "last" if "last rank" in (text or "").lower() else "peak"


def source_key(rec: dict) -> str:
    """The independent source a record comes from: one document x software stack x year (the
    document's name without its table/figure/section pointer, and the framework)."""
    doc = re.split(r",\s*(?:table|tables|fig|figure|section|appendix|§)", rec.get("source", ""),
                   flags=re.I)[0].strip()
    return f"{doc} | {rec.get('training', {}).get('framework') or 'framework not stated'}"


#: Training stacks that are not PyTorch (JAX/Paxml/praxis, OneFlow): refused, never priced
#: under a borrowed PyTorch profile.
_NOT_TORCH = re.compile(r"\b(jax|pax(ml)?|praxis|oneflow)\b", re.I)


class RecordError(ValueError):
    """A record autopar cannot turn into inputs (unknown GPU or interconnect, unsupported model);
    the evaluator lists it as skipped with this reason, never guesses."""


#: Standard HGX/DGX board: 8 GPUs per node (NVIDIA HGX A100/H100 datasheets); the evaluator's
#: choice when a record does not publish its node size (reported in ``Record.assumed``).
DEFAULT_GPUS_PER_NODE = 8


def _inter_link(text: str | None, gpus_per_node: int, num_nodes: int,
                assumed: dict) -> tuple[str | None, int | None]:
    """(catalog link, NICs per node) from a record's prose; (None, None) = the GPU's default node.

    Reads "8x InfiniBand HDR", "1x InfiniBand EDR", "RoCE 400 Gb/s per GPU", "4 * 100Gb RoCE", "RoCE, 1600 Gbps ...
    per node", "3.2 Tbps ... per node", "4x200Gbps RDMA", "32x 100 Gbps EFA per node (AWS p5.48xlarge)"
    (AWS EFA: the catalog's EFA row of that instance, :func:`_efa_link`). A per-node total, or a NIC count and
    rate, of an unnamed fabric is modelled as RoCE NICs (said in ``assumed``); anything else
    unreadable is a :class:`RecordError`, never a guess.
    """
    if num_nodes == 1:
        return None, None
    if not text:
        assumed["inter_node"] = "not published: the GPU's default node NICs"
        return None, None
    t = text.lower()
    count = re.match(r"\s*(\d+)\s*[x*]", t)
    nics = int(count.group(1)) if count else gpus_per_node
    if "ndr" in t:
        return "ib-ndr", nics
    if "hdr" in t:
        return "ib-hdr", nics
    if "edr" in t:
        return "ib-edr", nics
    # link rates in Gb/s ("400 Gbps", "3.2 Tbps": 3200)
    speeds = [round(float(x) * (1000 if unit == "tb" else 1))
              for x, unit in re.findall(r"(\d+(?:\.\d+)?)\s*(gb|tb)", t)]
    if re.search(r"\befa\b", t):
        return _efa_link(t, speeds, count, nics, assumed, text)
    kind = "roce" if "roce" in t else None
    if kind and count and speeds and speeds[0] in (100, 200, 400):
        return f"roce-{speeds[0]}g", nics
    if kind and "per gpu" in t and speeds and speeds[0] in (100, 200, 400):
        return f"roce-{speeds[0]}g", gpus_per_node
    if not kind and count and speeds and speeds[0] in (100, 200, 400) \
            and "infiniband" not in t:
        # "4x200Gbps RDMA", "4x 200 Gbps Slingshot-11": N NICs of that rate, fabric unnamed
        # or not in the catalog: modelled as RoCE NICs of the rate (said in ``assumed``)
        assumed["inter_node"] = (f"{text!r}: {nics} x {speeds[0]} Gb/s NICs per node, "
                                 "modelled as RoCE")
        return f"roce-{speeds[0]}g", nics
    if speeds and "per node" in t or (speeds and not count and "per gpu" not in t):
        total = speeds[0]
        for nic in (400, 200, 100):
            if total % nic == 0:
                assumed["inter_node"] = (f"{text!r}: {total // nic} x {nic} Gb/s RoCE NICs per "
                                         "node (the published per-node total)")
                return f"roce-{nic}g", total // nic
    if "ethernet" in t or "eth" in t:
        return ("eth-100g" if "100" in t else "eth-25g"), nics
    raise RecordError(f"inter-node link {text!r} is not one autopar's catalog has (InfiniBand "
                      "EDR/HDR/NDR, RoCE 100/200/400G, AWS EFA, Ethernet 25/100G); not guessed")


#: AWS instance families -> the catalog's EFA row (autopar/hardware/links.py): p4d/p4de carry
#: EFA v1, p5/p5e EFA v2 (both 100 Gb/s adapters), p5en EFA v3 (200 Gb/s adapters)
_EFA_BY_INSTANCE = (("p5en", "efa-v3-200g"), ("p4d", "efa-v1-100g"), ("p5", "efa-v2-100g"))


def _efa_link(t: str, speeds: list[int], count, nics: int, assumed: dict,
              text: str) -> tuple[str, int]:
    """(catalog EFA row, adapters per node) of an inter-node text naming EFA: the row of the
    instance named ("p4d", "p5", "p5en"), else of the adapter rate (200 Gb/s: v3; 100 Gb/s: v2,
    said in ``assumed``); the adapter count as written ("32x"), else the per-node total over
    the adapter rate.

    Raises:
        RecordError: EFA without an instance, or at a rate the catalog has no row for.
    """
    link = next((row for name, row in _EFA_BY_INSTANCE if name in t), None)
    rate = 200 if link == "efa-v3-200g" else 100
    if link is None:
        if not speeds or speeds[0] not in (100, 200):
            raise RecordError(f"inter-node link {text!r}: EFA without an instance type or a "
                              "100/200 Gb/s adapter rate; not guessed")
        rate = speeds[0]
        link = "efa-v3-200g" if rate == 200 else "efa-v2-100g"
        assumed["inter_node"] = f"{text!r}: EFA adapters of {rate} Gb/s read as {link}"
    if not count:
        total = next((s for s in speeds if s > rate and s % rate == 0), None)
        if total is None:
            raise RecordError(f"inter-node link {text!r}: EFA without an adapter count or a "
                              "per-node total; not guessed")
        nics = total // rate
    return link, nics


def _source_year(source: str) -> int:
    """Year a source was published: a 4-digit year, an arXiv id (YYMM.NNNNN) or a release
    tag (vYY.MM); 0 when none is found."""
    years = [int(y) for y in re.findall(r"\b(20\d\d)\b", source)]
    years += [2000 + int(y) for y in re.findall(r"\b(\d\d)\d\d\.\d{4,5}\b", source)]
    years += [2000 + int(y) for y in re.findall(r"\bv(\d\d)\.\d\d", source)]
    return max(years, default=0)


def load(path: str | Path | None = None) -> list[dict]:
    """The raw records of a published_plans.json-format file."""
    return json.loads(Path(path or DEFAULT_PLANS).read_text())


def _optimizer(text: str | None) -> str:
    """"adamw (decoupled_adamw, composer)" -> "adamw"; unpublished -> "adam" (every record so
    far trained with an Adam variant)."""
    word = re.match(r"[a-z]+", (text or "adam").lower())
    return word.group(0) if word else "adam"


def _device(name: str, overrides: dict | None):
    """The catalog GPU, with a record's ``gpu_overrides`` applied (``memory_gib``: HBM in GiB,
    ``hbm_bandwidth_tbps``: TB/s, ``tdp_w``: the power cap in watts). Other override keys are refused, not ignored."""
    dev = get_device(_GPU_ALIASES.get(name, name))
    if not overrides:
        return dev
    known = {"memory_gib": ("memory_bytes", 2 ** 30), "hbm_bandwidth_tbps": ("hbm_bandwidth_Bps", 1e12),
             "tdp_w": ("power_limit_w", 1)}
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise RecordError(f"gpu_overrides keys {unknown} are not modelled (known: {sorted(known)})")
    changes = {known[k][0]: v * known[k][1] for k, v in overrides.items() if known[k][0]}
    if "memory_bytes" in changes:  # another memory size: the catalog's visible capacity is not it
        changes["capacity_bytes"] = None
    # a power cap lowers the sustained clock (Device.clock_scale); the name says what changed
    name = dev.name + "".join(f"[{k}={v}]" for k, v in sorted(overrides.items()))
    return dataclasses.replace(dev, name=name, **changes)


#: MoE plan keys of a record -> ParallelConfig fields, fixed when published (never open: a
#: dense model has no experts to map, and the frameworks' default is ep 1, etp = tp)
_MOE_PLAN_KEYS = {"ep": "ep", "etp": "expert_tp"}
#: A record's ``plan.dispatcher`` -> the ParallelConfig dispatcher autopar prices it with
#: (autopar.cost.dispatch): "alltoall" (Megatron-Core MoEAlltoAllTokenDispatcher, torchtitan's
#: EP), "allgather" (Megatron-Core MoEAllGatherTokenDispatcher) and "flex/deepep" (Megatron-
#: Core's flex dispatcher with the DeepEP backend). null = an open field (``Record.
#: open_fields`` "dispatcher"), which takes the framework's default
#: (benchmarks.validation.framework_defaults)
_DISPATCHERS = {"alltoall": "alltoall", None: None, "flex/deepep": "deepep",
                "allgather": "allgather"}


def _model_fields(model: dict) -> dict:
    """The record's ``model`` as ModelConfig keys: ``family: "moe"`` (the corpus's first MoE
    records) is a llama-style MoE; a MoE size left null takes ModelConfig's default (0: none;
    expert widths derived). ``head_dim`` is read by ModelConfig.from_dict. Router settings
    (``router_score_function``, ``router_load_balancing``, ``router_aux_loss_coeff``,
    ``router_expert_bias``, ``router_z_loss_coeff``) are optional: absent or null, a record
    takes Megatron-Core's defaults (:data:`autopar.models.config.ROUTER_DEFAULTS`)."""
    fields_ = dict(model)
    if fields_.get("family") == "moe":
        fields_["family"] = "llama"
    return {k: v for k, v in fields_.items()
            if v is not None or k not in (*MOE_FIELDS, *ROUTER_DEFAULTS, "head_dim")}


def _moe_plan(plan: dict) -> dict:
    """{ParallelConfig field: value} of a record's published expert mapping and dispatcher
    (DeepEP across EFA nodes is refused by the library's rule, autopar.frameworks.rules.
    deepep_fabric, when the record is estimated).

    Raises:
        RecordError: a dispatcher autopar does not price.
    """
    if plan.get("dispatcher") not in _DISPATCHERS:
        raise RecordError(f"not modelled: the {plan['dispatcher']!r} token dispatcher (autopar "
                          f"prices {sorted(k for k in _DISPATCHERS if k)})")
    dispatcher = _DISPATCHERS[plan.get("dispatcher")]
    out = {field: plan[key] for key, field in _MOE_PLAN_KEYS.items()
           if plan.get(key) is not None}
    if dispatcher is not None:
        out["dispatcher"] = dispatcher
    return out


def parse(rec: dict) -> Record:
    """Turn one raw record into autopar inputs (model config, cluster, training, fixed plan).

    A run published as out of memory (``measured.oom: true``) parses with ``Record.oom`` set
    (its step time and memory are null); its ``memory_at_oom_gib`` and ``oom_phase`` are kept.

    Raises:
        RecordError: the record names hardware or a model autopar cannot represent, says in its
            ``unmodelled`` what it ran that autopar does not model (e.g. CPU offload), was trained
            with a stack that is not PyTorch-based (JAX/Paxml, OneFlow), or gives a
            ``plan.cp_mode`` that is not one of :data:`autopar.config.CP_MODES` (e.g. a 2-D
            Ulysses x ring hybrid).
    """
    if rec.get("unmodelled"):
        raise RecordError(f"not modelled: {rec['unmodelled']}")
    stack = _NOT_TORCH.search((rec.get("training") or {}).get("framework") or "")
    if stack:
        raise RecordError(f"framework not modelled: {stack.group(0)} is not a PyTorch stack; "
                          "autopar prices PyTorch-based frameworks, and a borrowed profile "
                          "would price another stack's kernels, allocator and runtime")
    assumed: dict = {}
    model_fields = _model_fields(rec["model"])
    for key, (value, why) in model_defaults((rec.get("training") or {}).get("framework")
                                            or "").items():
        if model_fields.get(key) is None:
            model_fields[key] = value
            assumed[key] = f"not published: {value}, {why}"
    try:
        model = ModelConfig.from_dict(model_fields)
    except autopar.AutoparError as exc:
        raise RecordError(f"model: {exc}") from exc
    c = rec["cluster"]
    if not c.get("num_gpus"):
        raise RecordError("the GPU count is not published")
    gpn = c.get("gpus_per_node")
    if not gpn:
        gpn = min(DEFAULT_GPUS_PER_NODE, c["num_gpus"])
        assumed["gpus_per_node"] = f"not published: {gpn} (HGX/DGX board)"
    try:
        base = get_device(_GPU_ALIASES.get(c["gpu"], c["gpu"]))
    except autopar.AutoparError as exc:
        raise RecordError(str(exc)) from exc
    box = node_template(base)
    if box is not None and box.rack_scale and gpn == box.gpus_per_host:
        # a record giving the tray (4 GPUs of an NVL72 rack) describes hosts, not the NVLink
        # domain autopar's node is (autopar/hardware/spec.py): the node is the rack's domain
        if c["num_gpus"] % box.gpus_per_node:
            raise RecordError(
                f"{c['num_gpus']} GPUs on {base.name}: trays of {gpn} in {box.gpus_per_node}-GPU "
                f"NVLink domains, but {c['num_gpus']} is not a whole number of domains and how "
                "the run's GPUs sit in racks is not published")
        assumed["gpus_per_node"] = (f"published {gpn} per tray; the node is the rack's "
                                    f"{box.gpus_per_node}-GPU NVLink domain")
        gpn = box.gpus_per_node
    if c["num_gpus"] % gpn:
        raise RecordError(f"{c['num_gpus']} GPUs do not fill nodes of {gpn}")
    link, nics = _inter_link(c.get("inter_node"), gpn, c["num_gpus"] // gpn, assumed)
    try:
        device = _device(c["gpu"], c.get("gpu_overrides"))
        tmpl = node_template(base)  # an overridden GPU keeps its board's links
        intra = tmpl.intra_link if tmpl else None
        if tmpl and link is None and c["num_gpus"] > gpn:
            # the library's default node of gpn GPUs (Cluster.from_spec): the board's NICs,
            # no more than one per GPU (catalog.Box.nics)
            link, nics = tmpl.nic_link, tmpl.nics(gpn)
        cluster = autopar.Cluster.custom(c["num_gpus"] // gpn, gpn, device, intra=intra,
                                         inter=link, nics_per_node=nics if link else 0)
    except autopar.AutoparError as exc:
        raise RecordError(str(exc)) from exc
    t = rec["training"]
    flash = t.get("flash_attention")
    if flash is None:
        # FlashAttention (Dao et al., May 2022) reached Megatron-LM and NeMo in 2023: runs
        # published before 2023 used the unfused attention path
        flash = _source_year(rec.get("source", "")) >= 2023
    precision = t.get("precision")
    if precision is None:
        precision, why = precision_default(t.get("framework") or "")
        if precision is None:
            raise RecordError(f"precision not published: {why}")
        assumed["precision"] = f"not published: {precision}, {why}"
    if t.get("global_batch_size") is None:
        # no framework defaults the global batch: a run without one has no step to estimate
        raise RecordError("global batch not published: no framework default stands in for it")
    plan = rec["plan"]
    train = autopar.TrainingConfig(global_batch_size=t["global_batch_size"],
                                   seq_len=rec["model"]["seq_len"],
                                   micro_batch_size=t.get("micro_batch_size"),
                                   precision=precision,
                                   optimizer=_optimizer(t.get("optimizer")),
                                   flash_attention=flash,
                                   # CPU offload the source states (null: none, each
                                   # framework's default; autopar.cost.offload)
                                   optimizer_offload=t.get("optimizer_offload") is True,
                                   param_offload=t.get("param_offload") is True,
                                   activation_offload=t.get("activation_offload") is True,
                                   # the optimizer's moment dtype (null: fp32, Adam's own)
                                   optimizer_state_dtype=t.get("optimizer_state_dtype")
                                   or "fp32",
                                   # token dropping (null: dropless); padding only where the
                                   # record says so (Megatron-Core's default is off)
                                   moe_capacity_factor=plan.get("capacity_factor"),
                                   moe_pad_to_capacity=plan.get("pad_to_capacity") is True,
                                   # per-expert loads where published (null: balanced)
                                   moe_expert_load=t.get("moe_expert_load"))
    fixed = {k: plan[k] for k in _PLAN_KEYS if plan.get(k) is not None}
    fixed.update(_moe_plan(plan))
    if plan.get("recompute_modules") is not None:
        # Megatron-Core --recompute-modules of a "selective" plan (autopar.cost.selective)
        fixed["recompute_modules"] = tuple(plan["recompute_modules"])
    if plan.get("vp_group") is not None:
        # Megatron-LM --microbatch-group-size-per-virtual-pipeline-stage (never open: absent,
        # the schedule groups by its default)
        fixed["vp_group"] = plan["vp_group"]
    split = plan.get("pipeline_split")
    if split:
        if not set(split) <= set(_SPLIT_PARTS):
            raise RecordError(f"plan.pipeline_split {split!r}: only {_SPLIT_PARTS} (Megatron-"
                              "LM's --account-for-*-in-pipeline-split) are read")
        try:
            fixed["stage_blocks"] = MegatronLayerSplit(
                embedding="embedding" in split, loss="loss" in split).chunks(
                model.num_layers, plan.get("pp") or 1, plan.get("virtual_stages"))
        except autopar.AutoparError as exc:
            raise RecordError(f"plan.pipeline_split: {exc}") from exc
    if (fixed.get("ep", 1) > 1 and "expert_tp" not in fixed
            and "torchtitan" in (t.get("framework") or "").lower()):
        # torchtitan job_config.py: expert_tensor_parallel_degree defaults to 1 (Megatron-Core's
        # default, null here, is tp); the importer reads its TOML the same way
        fixed["expert_tp"] = 1
        assumed["etp"] = "not published: 1, torchtitan's default expert_tensor_parallel_degree"
    if plan.get("cp_mode") is not None:
        # how context parallelism exchanges attention inputs; absent = the evaluator's default
        if plan["cp_mode"] not in CP_MODES:
            raise RecordError(f"cp_mode {plan['cp_mode']!r} is not one autopar models "
                              f"{CP_MODES}: {plan.get('cp_mode_note', 'not guessed')}")
        fixed["cp_mode"] = plan["cp_mode"]
    if fixed.get("pp", 1) == 1:
        fixed.pop("schedule", None)
        fixed.pop("virtual_stages", None)
    open_fields = tuple(k for k in _PLAN_KEYS if plan.get(k) is None)
    if t.get("micro_batch_size") is None:
        open_fields += ("micro_batch_size",)
    if "dispatcher" not in fixed and (plan.get("ep") or 1) > 1:
        open_fields += ("dispatcher",)   # an MoE run with EP that names no dispatcher
    meas = rec["measured"]
    step = meas.get("step_time_s")
    note = meas.get("step_time_note", "published")
    if step is None and meas.get("tflops_per_gpu"):
        # derived here: 6 N tokens + causal attention 6 L h s tokens (an assumption: the source
        # does not state its FLOPs convention beyond "BF16 MFU")
        step = _derived_step(model, train, meas["tflops_per_gpu"] * 1e12, c["num_gpus"])
        note = "derived: (6N + 6Lhs) tokens / (tflops_per_gpu * GPUs)"
    return Record(rec["id"], model, cluster, train, fixed, open_fields, step, note, rec,
                  framework=t.get("framework") or "", source_key=source_key(rec),
                  measured_memory_gib=meas.get("memory_gib"),
                  oom=meas.get("oom") is True,
                  memory_kind=memory_kind(meas.get("memory_kind")),
                  memory_kind_text=meas.get("memory_kind") or "",
                  memory_rank=memory_rank(meas.get("memory_kind")),
                  memory_at_oom_gib=meas.get("memory_at_oom_gib"),
                  oom_phase=meas.get("oom_phase") or "",
                  fp8_recipe=t.get("fp8_recipe") or "",
                  torch_compile=t.get("torch_compile"),
                  attention_kernel=_attention_kernel(rec["id"], t.get("attention_kernel")),
                  grad_reduce_dtype=_reduce_dtype(rec["id"], t.get("grad_reduce_dtype")),
                  loss_compiled=t.get("loss_compiled") is True,
                  assumed=tuple(sorted(assumed.items())))


#: ``training.attention_kernel`` values a record may name (the framework's own kernel otherwise).
ATTENTION_KERNEL_NAMES = ("fa3",)


def _attention_kernel(rid: str, value) -> str:
    """A record's ``training.attention_kernel`` ("fa3" or null: the framework's own).

    Raises:
        RecordError: another value.
    """
    if value is None:
        return ""
    if value not in ATTENTION_KERNEL_NAMES:
        raise RecordError(f"{rid}: training.attention_kernel {value!r} is not one a record can "
                          f"name; use one of {ATTENTION_KERNEL_NAMES} or null (the framework's "
                          "own kernel)")
    return value


def _reduce_dtype(rid: str, value) -> str | None:
    """A record's ``training.grad_reduce_dtype`` ("fp32" or null).

    Raises:
        RecordError: any other value, naming the record and the values read.
    """
    if value not in (None, "fp32"):
        raise RecordError(f"{rid}: training.grad_reduce_dtype {value!r} is not read; fix: "
                          "\"fp32\" (gradients reduced in fp32) or null (the framework's "
                          "default)")
    return value


#: The training precision a framework family (:func:`benchmarks.validation.framework_kind` of
#: the record's ``training.framework``) runs when the user does not choose one: (precision,
#: where it is documented), or (None, why no default is taken). A record whose
#: ``training.precision`` is null takes the precision here, or is refused with the reason.
PRECISION_DEFAULTS: dict[str, tuple[str | None, str]] = {
    "torchtitan": ("bf16", "torchtitan's documented default (job_config.py "
                           "mixed_precision_param = 'bfloat16')"),
    "nemo": ("bf16", "NeMo 2.0's documented default (llm/recipes/*.py: "
                     "plugins=bf16_mixed())"),
    "megatron": (None, "Megatron-LM's documented default is fp32 (no --bf16/--fp16 in "
                       "arguments.py), which no published run of this size used: not taken"),
    "deepspeed": (None, "DeepSpeed's documented default is fp32 (fp16/bf16 'enabled': false), "
                        "which no published run of this size used: not taken"),
    "fsdp": (None, "PyTorch FSDP's default MixedPrecision is None (fp32), which no published "
                   "run of this size used: not taken"),
}


#: Model fields a framework family's own model sets when its config does not (the record's
#: ``model`` leaves them null): {field: (value, where documented)}. autopar's ``gpt`` family
#: otherwise takes Megatron-LM's dropout 0.1 (:mod:`autopar.models.config`), whose masks
#: (one byte per element, two per block plus the embedding's) count in activation memory.
_MPT_DROPOUT = ("llm-foundry's MPT: llmfoundry/models/mpt/configuration_mpt.py (at 3ece05954, "
                "2023-05-04) MPTConfig.__init__ 'resid_pdrop: float = 0.0, emb_pdrop: float = "
                "0.0' and attn_config_defaults 'attn_pdrop': 0.0; the benchmark yamls "
                "(scripts/train/yamls/mpt/*.yaml) set none of them. A p = 0 dropout saves no "
                "mask: ATen Dropout.cpp _dropout_impl returns its input 'if (p == 0 || !train "
                "...)'")
MODEL_DEFAULTS: dict[str, dict[str, tuple[float, str]]] = {
    "llm-foundry": {"hidden_dropout": (0.0, _MPT_DROPOUT),
                    "attention_dropout": (0.0, _MPT_DROPOUT)},
}


def model_defaults(framework: str) -> dict[str, tuple[float, str]]:
    """{model field: (value, where documented)} a record of ``framework`` (its
    ``training.framework`` text) takes for model fields it leaves null
    (:data:`MODEL_DEFAULTS`; empty for a family with none recorded)."""
    from .validation import framework_kind   # validation imports this module
    return MODEL_DEFAULTS.get(framework_kind(framework), {})


def precision_default(framework: str) -> tuple[str | None, str]:
    """(precision, where documented) a record of ``framework`` (its ``training.framework``
    text) takes when its precision is not published, or (None, why none is taken)
    (:data:`PRECISION_DEFAULTS`)."""
    from .validation import framework_kind   # validation imports this module
    kind = framework_kind(framework)
    return PRECISION_DEFAULTS.get(
        kind, (None, f"no documented default recorded for the stack {framework or 'not named'!r} "
                   "(benchmarks.records.PRECISION_DEFAULTS)"))


def _derived_step(model: ModelConfig, train, flops_per_gpu: float, gpus: int) -> float:
    h, L, f, V = model.hidden_size, model.num_layers, model.ffn_hidden_size, model.vocab_size
    kv = model.num_kv_heads / model.num_heads
    params = L * (2 * h * h + 2 * h * h * kv + 3 * h * f) + 2 * V * h
    tokens = train.global_batch_size * train.seq_len
    flops = (6 * params + 6 * L * h * train.seq_len) * tokens
    return flops / (flops_per_gpu * gpus)
