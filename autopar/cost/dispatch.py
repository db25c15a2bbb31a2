"""MoE token dispatch and combine per dispatcher: seconds and link loads of one MoE layer's
expert-parallel traffic per micro-batch on one GPU (:func:`dispatch_cost`).

Three dispatchers (:data:`autopar.config.DISPATCHERS`):

* ``alltoall``: NCCL all-to-alls of every routed copy of a token (k copies for top-k), timed by
  the EP group's collective model (Lepikhin et al. 2020, GShard; Megatron-Core
  ``MoEAlltoAllTokenDispatcher``).
* ``deepep``: DeepSeek's DeepEP normal kernels (github.com/deepseek-ai/DeepEP, V1 as Megatron-Core's
  flex dispatcher calls it, ``megatron/core/transformer/moe/fused_a2a.py``). A token crosses the
  network once per destination *node* and is forwarded to the ranks of that node over NVLink
  (DeepEP docs/legacy.md: "kernels optimized for asymmetric-domain bandwidth forwarding, such as
  forwarding data from NVLink domain to RDMA domain"); the RDMA send and the NVLink forward
  are pipelined in one kernel, so the slower of the two sets the time. The achieved
  bandwidths are DeepEP's published ones (:class:`DeepEPParams`). Derivation:
  docs/reference/moe_dispatch.md.
* ``allgather``: Megatron-Core's default, ``MoEAllGatherTokenDispatcher``
  (:func:`allgather_time`): every rank of the expert-TP x EP group gathers all of the group's
  tokens, routing map and probabilities, permutes locally the rows routed to its own experts,
  and reduce-scatters the experts' output back.

All-to-all and DeepEP move the same data four times per layer and micro-batch (dispatch and combine forward,
their gradients backward; a full recompute dispatches once more), on the critical path: autopar
overlaps expert-parallel traffic with compute only under a DualPipe schedule
(:meth:`autopar.cost.pipeline.timing.PipelineTimer.pair_overlap`), and charges the compute
beside it no SMs there for either dispatcher yet (:meth:`DeepEPParams.sm_share` gives DeepEP's;
NCCL's would be :meth:`autopar.cost.groups.Groups.comm_share`).

The two transfers along the dispatch direction (the forward dispatch; in backward the combine's
gradient, itself a dispatch) may move fewer bytes than the two combines: a framework that
dispatches FP8 under FP8 training (:attr:`autopar.frameworks.FrameworkProfile.moe_dispatch_dtype`,
:func:`dispatch_bytes_ratio`) scales them by ``dispatch_ratio``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..frameworks.vocabulary import MOE_DISPATCH_DTYPES
from ..hardware.collectives import NO_LOAD, LinkLoad, layout_of

#: Bandwidth DeepEP's table was measured against: H800 NVLink, 400 GB/s bidirectional = 200 GB/s
#: per direction (autopar's ``nvlink4-h800`` link), and one ConnectX-7 400 Gb/s NIC per GPU =
#: 50 GB/s (``ib-ndr``). DeepEP docs/legacy.md "Performance": "H800 (~160 GB/s NVLink maximum
#: bandwidth), with each connected to a CX7 InfiniBand 400 Gb/s RDMA network card (~50 GB/s
#: maximum bandwidth)".
DEEPEP_REF_NVLINK_BPS = 200e9
DEEPEP_REF_NIC_BPS = 50e9

#: Bytes per element of a token dispatched in FP8 with 1x128 tiles: one E4M3 byte plus one fp32
#: scale per 128 elements. DeepSeek-V3 (arXiv 2412.19437v2) section 3.3.2 scales activations
#: per "1x128 tile"; DeepEP's tests count an FP8 dispatch so, against BF16's 2 bytes
#: (deepseek-ai/DeepEP tests/test_internode.py and tests/test_intranode.py,
#: ``fp8_factor = (1 + 4 / 128) / 2``), as its dispatch takes ``x`` as an FP8 tensor with
#: float32 scales of shape [tokens, hidden / 128].
FP8_1X128_BYTES = 1 + 4 / 128


def dispatch_bytes_ratio(dispatch_dtype: str, precision: str, dtype_bytes: float) -> float:
    """Bytes a dispatch-direction transfer moves per byte of the tokens in the activation dtype.

    Args:
        dispatch_dtype: the framework's :attr:`~autopar.frameworks.FrameworkProfile.
            moe_dispatch_dtype` (:data:`autopar.frameworks.profiles.MOE_DISPATCH_DTYPES`).
        precision: the training precision (:data:`autopar.config.PRECISIONS`).
        dtype_bytes: bytes per activation element (2 for bf16).

    Returns:
        :data:`FP8_1X128_BYTES` / ``dtype_bytes`` for ``fp8_1x128`` under precision ``"fp8"``
        (0.515625 against bf16); 1.0 otherwise.

    Raises:
        ValueError: an unknown dispatch dtype, or non-positive ``dtype_bytes``.
    """
    if dispatch_dtype not in MOE_DISPATCH_DTYPES:
        raise ValueError(f"unknown MoE dispatch dtype {dispatch_dtype!r}: use one of "
                         f"{MOE_DISPATCH_DTYPES}")
    if dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes={dtype_bytes} must be positive")
    if dispatch_dtype == "fp8_1x128" and precision == "fp8":
        return FP8_1X128_BYTES / dtype_bytes
    return 1.0


@dataclass(frozen=True)
class DeepEPParams:
    """DeepEP normal-kernel (training / prefill) bandwidths, as published, and its SM count.

    Source: deepseek-ai/DeepEP README.md as corrected in 3b1045d (2025-04-22, "Fix the
    performance data"; the first release's EP 32 / 64 rows read 44-47 GB/s), kept as the V1
    docs/legacy.md from b306af0 (2026-04-30), "Normal kernels with NVLink and RDMA
    forwarding": H800 + CX7 400 Gb/s, 4096 tokens, hidden 7168, top-4 groups, top-8 experts,
    FP8 dispatch and BF16 combine. Its bandwidths are *logical*: tests/test_internode.py
    divides ``num_rdma_token_sent * hidden * bytes`` (one per token and destination node, the
    token's own node included) and tests/test_intranode.py ``recv_x.numel() * bytes`` (one per
    token and destination rank) by the kernel's time; :func:`deepep_time` counts bytes the same
    way, so the table is used as published.

    Attributes:
        nvlink_Bps: (dispatch, combine) bytes/s per GPU over NVLink, EP 8 in one node:
            153 and 158 GB/s.
        rdma_Bps: ((nodes, dispatch bytes/s, combine bytes/s), ...) per GPU over RDMA, by
            nodes the EP group spans: EP 16 (2 nodes) 43 / 43 GB/s, EP 32 (4) 58 / 57 GB/s,
            EP 64 (8) 51 / 50 GB/s. A span between two rows takes the row of fewer nodes;
            beyond the last, the last.
        ref_nvlink_Bps / ref_nic_Bps: the link bandwidths the table was measured on
            (:data:`DEEPEP_REF_NVLINK_BPS`, :data:`DEEPEP_REF_NIC_BPS`). On other links the
            table's share of the link is kept (an assumption: DeepEP's kernels bound by the
            link, as its README's "Bottleneck bandwidth" says; UCCL-EP's DeepEP-interface
            kernels reach 320 GB/s intranode on H200's 450 GB/s NVLink, uccl-project/uccl
            ep/README.md, the same order of share).
        num_sms: SMs the normal kernels run on: 20 (deep_ep/buffer.py ``Buffer.num_sms = 20``
            at 567632d; Megatron-Core transformer_config.py ``moe_deepep_num_sms``, "historical
            default 20").
    """

    nvlink_Bps: tuple[float, float] = (153e9, 158e9)
    rdma_Bps: tuple[tuple[int, float, float], ...] = ((2, 43e9, 43e9), (4, 58e9, 57e9),
                                                      (8, 51e9, 50e9))
    ref_nvlink_Bps: float = DEEPEP_REF_NVLINK_BPS
    ref_nic_Bps: float = DEEPEP_REF_NIC_BPS
    num_sms: int = 20

    def rdma_row(self, nodes: int) -> tuple[float, float]:
        """(dispatch, combine) logical RDMA bytes/s per GPU of the table for an EP group over
        ``nodes`` nodes (>= 2), on the reference NIC."""
        row = self.rdma_Bps[0]
        for r in self.rdma_Bps:
            if r[0] <= nodes:
                row = r
        return row[1], row[2]

    def sm_share(self, sm_count: int) -> float:
        """Share of a GPU's ``sm_count`` SMs the kernels hold while in flight (0 when the SM
        count is unknown)."""
        return min(1.0, self.num_sms / sm_count) if sm_count > 0 else 0.0


DEEPEP = DeepEPParams()


#: DeepEP's recommended normal-kernel configs (deep_ep/buffer.py at 04b06f7,
#: ``get_dispatch_config`` / ``get_combine_config``): EP group size -> for dispatch and for
#: combine, (NVLink receive tokens, RDMA send tokens, RDMA receive tokens) per channel. Sizes
#: between rows take the next larger row; beyond the last, the last.
DEEPEP_BUFFER_CONFIGS: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    2: ((256, 6, 128), (256, 6, 128)), 4: ((256, 6, 128), (256, 6, 128)),
    8: ((256, 6, 128), (256, 6, 128)), 16: ((288, 20, 128), (288, 28, 128)),
    24: ((288, 32, 128), (288, 20, 128)), 32: ((288, 32, 128), (288, 20, 128)),
    64: ((288, 28, 128), (288, 20, 128)), 128: ((560, 32, 128), (560, 12, 128)),
    144: ((720, 12, 128), (720, 8, 128)), 160: ((720, 12, 128), (720, 8, 128))}


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


#: Bytes of the workspace every DeepEP buffer ``cudaMalloc``s beside its NVLink and RDMA buffers:
#: ``LEGACY_NUM_WORKSPACE_BYTES = 32 * 1024 * 1024`` (deepseek-ai/DeepEP
#: csrc/kernels/legacy/compiled.cuh at dd758ca; ``NUM_WORKSPACE_BYTES``, the same since the
#: first release ebfe47e), allocated in csrc/legacy/buffer.hpp's ``Buffer`` constructor.
DEEPEP_WORKSPACE_BYTES = 32 * 2 ** 20
#: Granularity of NVSHMEM's symmetric heap (physical memory is mapped onto it in multiples of
#: it): 2**29 bytes = 512 MiB, NVSHMEM's default ``NVSHMEM_CUMEM_GRANULARITY``
#: (NVIDIA/nvshmem src/include/host/env/env_defs.h at 2d7d25f) and what DeepEP sets before
#: initialising NVSHMEM (deep_ep/buffers/legacy.py: "NVSHMEM initialization requires at least
#: 256 MiB").
NVSHMEM_HEAP_GRANULARITY = 2 ** 29
#: NVSHMEM's own allocations on its heap, beside the user's: ``G_BUF_SIZE`` (8 MiB) and
#: ``G_COALESCING_BUF_SIZE`` (128 x 64 x 32 x 8 = 2 MiB), env_defs.h; the teams' sync arrays
#: (DeepEP sets ``NVSHMEM_MAX_TEAMS=7``) are KiB and not counted.
NVSHMEM_HEAP_INTERNAL_BYTES = 8 * 2 ** 20 + 2 * 2 ** 20
#: Alignment DeepEP asks of its RDMA buffer (``nvshmem_align``;
#: ``LEGACY_NUM_BUFFER_ALIGNMENT_BYTES``, compiled.cuh).
DEEPEP_BUFFER_ALIGNMENT = 128


def nvshmem_heap_bytes(rdma_bytes: int) -> int:
    """Device bytes NVSHMEM's symmetric heap holds per GPU once DeepEP has put an RDMA buffer of
    ``rdma_bytes`` on it; 0 when ``rdma_bytes`` is 0 (a one-node group: DeepEP then does not
    initialise NVSHMEM, deep_ep/buffers/legacy.py, outside low-latency mode).

    NVIDIA/nvshmem src/host/mem/mem_heap.cpp at 2d7d25f (the default heap when CUDA VMM is
    available, ``nvshmemi_symmetric_heap_vidmem_dynamic_vmm``): an allocation the mapped heap
    cannot hold maps a new ``cuMemCreate`` chunk of (size + alignment) rounded up to
    :data:`NVSHMEM_HEAP_GRANULARITY` (``allocate_physical_memory_to_heap``). NVSHMEM's own
    allocations at initialisation (team_internal.cpp, proxy.cpp) map the first 512 MiB chunk;
    DeepEP's buffer fits in its rest if ``rdma_bytes`` + :data:`NVSHMEM_HEAP_INTERNAL_BYTES` +
    128 <= 512 MiB, else a second mapping of ``rdma_bytes + 128`` rounded up to 512 MiB joins
    it. So 512 MiB for a buffer up to ~502 MiB, 1 GiB up to ~512 MiB, 1.5 GiB up to 1 GiB, ...
    (DeepEP caps the buffer below 2**31 bytes in normal mode, buffer.hpp). The static heap
    (``NVSHMEM_DISABLE_CUDA_VMM=1``: ``NVSHMEM_SYMMETRIC_SIZE``, 1 GiB by default, reserved at
    once) is not modelled."""
    if rdma_bytes <= 0:
        return 0
    g = NVSHMEM_HEAP_GRANULARITY
    if rdma_bytes + NVSHMEM_HEAP_INTERNAL_BYTES + DEEPEP_BUFFER_ALIGNMENT <= g:
        return g
    return g + _align(rdma_bytes + DEEPEP_BUFFER_ALIGNMENT, g)


def deepep_buffer_hints(ranks: int, hidden: int, num_sms: int = DEEPEP.num_sms,
                        nvl_peers: int = 8) -> tuple[int, int]:
    """(NVLink, RDMA) buffer bytes Megatron-Core asks DeepEP for, per GPU, for an expert-TP x EP
    group of ``ranks`` GPUs and tokens of ``hidden`` elements: the larger of the dispatch and
    combine configs' size hints (Megatron-Core fused_a2a.py ``get_buffer``: ``num_nvl_bytes``
    and ``num_rdma_bytes``; DeepEP csrc/config.hpp ``get_nvl_buffer_size_hint`` and
    ``get_rdma_buffer_size_hint`` at 030cdf0, with ``hidden_bytes = hidden x max(element
    bytes, 2)``, an 8-byte ``SourceMeta``, 128 top-k slots and 128 scales per token;
    configs :data:`DEEPEP_BUFFER_CONFIGS`). RDMA 0 inside one node (``ranks`` <=
    ``nvl_peers``); (0, 0) for one rank."""
    if ranks <= 1:
        return 0, 0
    row = next((DEEPEP_BUFFER_CONFIGS[k] for k in sorted(DEEPEP_BUFFER_CONFIGS) if k >= ranks),
               DEEPEP_BUFFER_CONFIGS[max(DEEPEP_BUFFER_CONFIGS)])
    channels, hidden_bytes = num_sms // 2, 2 * hidden
    nvl_ranks, rdma_ranks = min(ranks, nvl_peers), max(ranks // nvl_peers, 1)
    # per token: the hidden state, its SourceMeta, 128 int64 top-k indices, 128 fp32 weights
    # and 128 fp32 scales
    token = hidden_bytes + 8 + 128 * 8 + 128 * 4 + 128 * 4
    nvl = rdma = 0
    for nvl_recv, rdma_send, rdma_recv in row:
        n = channels * nvl_ranks * ((2 * rdma_ranks + 3) * 4 + nvl_recv * token)
        nvl = max(nvl, _align(n, 128))
        if ranks > nvl_peers:
            recv = _align(rdma_recv, rdma_send)
            r = channels * rdma_ranks * ((nvl_peers * 2 + 2) * 2 * 4
                                         + recv * 2 * (token + 16)) + 2 ** 20
            rdma = max(rdma, _align(r, 128))
    return nvl, rdma


def deepep_buffer_bytes(ranks: int, hidden: int, num_sms: int = DEEPEP.num_sms,
                        nvl_peers: int = 8) -> int:
    """Device bytes DeepEP holds per GPU outside torch's caching allocator for an expert-TP x EP
    group of ``ranks`` GPUs and tokens of ``hidden`` elements (0 for one rank): its NVLink
    buffer (``cudaMalloc``, shared over CUDA IPC; :func:`deepep_buffer_hints`), its 32 MiB
    workspace (:data:`DEEPEP_WORKSPACE_BYTES`) and, across nodes, NVSHMEM's symmetric heap
    holding its RDMA buffer (:func:`nvshmem_heap_bytes`: the heap's 512 MiB mappings, not the
    buffer alone)."""
    if ranks <= 1:
        return 0
    nvl, rdma = deepep_buffer_hints(ranks, hidden, num_sms, nvl_peers)
    return nvl + DEEPEP_WORKSPACE_BYTES + nvshmem_heap_bytes(rdma)


def expected_distinct(experts: int, top_k: int, bins: int) -> float:
    """Expected number of distinct bins holding a token's ``top_k`` experts when its experts
    are drawn uniformly without replacement from ``experts`` split evenly into ``bins``
    (ranks or nodes): bins * (1 - C(E - E/B, k) / C(E, k)). Balanced routing (Megatron-Core
    ``--moe-router-force-load-balancing``) draws so; a trained router's spread is not modelled.

    Raises:
        ValueError: ``bins`` does not divide ``experts``, or top_k outside [1, experts].
    """
    if bins < 1 or experts % bins:
        raise ValueError(f"{bins} bins do not split {experts} experts evenly")
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} outside [1, {experts}]")
    per = experts // bins
    miss = 1.0   # probability that a given bin holds none of the k experts
    for i in range(top_k):
        miss *= max(0.0, (experts - per - i) / (experts - i))
    return bins * (1.0 - miss)


@dataclass(frozen=True)
class DispatchCost:
    """One MoE layer's dispatch + combine traffic per micro-batch on one GPU.

    Attributes:
        seconds: forward + backward seconds (four transfers), before any recompute.
        load: what they put on each link class (:class:`~autopar.hardware.collectives.LinkLoad`).
    """

    seconds: float
    load: LinkLoad


def deepep_time(token_bytes: float, experts: int, top_k: int, ranks: tuple[int, ...],
                gpus_per_node: int, etp: int, nvlink_Bps: float, nic_per_gpu_Bps: float,
                params: DeepEPParams = DEEPEP, dispatch_ratio: float = 1.0) -> DispatchCost:
    """DeepEP's four transfers (dispatch and combine, forward and backward) of one MoE layer.

    Args:
        token_bytes: bytes of the tokens one rank holds (tokens x hidden x dtype bytes).
        experts, top_k: routed experts and experts per token.
        ranks: the expert-parallel group's ranks (global, one per expert slot); its nodes
            follow from ``gpus_per_node``.
        etp: expert-tensor-parallel degree: each expert's shards live on etp ranks, all of
            which receive the token (Megatron-Core's flex dispatcher runs over the tp x ep
            group with ``router_topk = tp_size * topk``, token_dispatcher.py).
        nvlink_Bps / nic_per_gpu_Bps: the node's link per direction and its NIC bandwidth per
            GPU (bytes/s).
        params: the published table (:class:`DeepEPParams`).
        dispatch_ratio: bytes of the two dispatch-rate transfers per byte of ``token_bytes``
            (:func:`dispatch_bytes_ratio`; the table's rates are per logical byte, FP8 or not).

    Returns:
        :class:`DispatchCost`: per transfer, ``max(rdma_bytes / rdma_Bps, nvl_bytes /
        nvl_Bps)`` across nodes, ``nvl_bytes / nvl_Bps`` inside one; rdma_bytes =
        token_bytes x expected distinct destination nodes, nvl_bytes = token_bytes x etp x
        expected distinct expert-parallel ranks; two transfers at the dispatch rate (their
        bytes x ``dispatch_ratio``), two at the combine rate (a dispatch's gradient is a
        combine, and a combine's a dispatch).
    """
    ep = len(ranks)
    lay = layout_of(tuple(ranks), gpus_per_node)
    nodes = lay.nodes
    k = max(1, min(top_k, experts))
    ranks_hit = etp * expected_distinct(experts, k, ep)
    scale = (dispatch_ratio, 1.0)   # (dispatch, combine) bytes per token byte
    nvl_bytes = [token_bytes * ranks_hit * r for r in scale]
    nvl_share = [b / params.ref_nvlink_Bps for b in params.nvlink_Bps]
    nvl_s = [b / (s * nvlink_Bps) for b, s in zip(nvl_bytes, nvl_share)]
    if nodes <= 1:
        times = nvl_s
        load = LinkLoad(intra_bytes=2 * sum(nvl_bytes), intra_s=2 * sum(times))
        return DispatchCost(2 * sum(times), load)
    nodes_hit = expected_distinct(experts, k, nodes) if experts % nodes == 0 else min(k, nodes)
    rdma_bytes = [token_bytes * nodes_hit * r for r in scale]
    rdma = [b / params.ref_nic_Bps * nic_per_gpu_Bps for b in params.rdma_row(nodes)]
    rdma_s = [b / bw for b, bw in zip(rdma_bytes, rdma)]
    times = [max(a, b) for a, b in zip(rdma_s, nvl_s)]
    # bytes that leave the node: the token's copies to the other nodes it goes to
    off_node = sum(rdma_bytes) * (nodes - 1) / nodes
    load = LinkLoad(intra_bytes=2 * sum(nvl_bytes), intra_s=2 * sum(nvl_s),
                    inter_bytes=2 * off_node, inter_s=2 * sum(rdma_s))
    return DispatchCost(2 * sum(times), load)


def alltoall_time(routed_bytes: float, group, dispatch_ratio: float = 1.0) -> DispatchCost:
    """NCCL's four all-to-alls (two forward, two backward) of ``routed_bytes`` (every routed
    copy of the rank's tokens) over the EP ``group``
    (:class:`~autopar.cost.comm.Collectives`): the two along the dispatch direction of
    ``routed_bytes x dispatch_ratio``, the two combines of ``routed_bytes``."""
    sent = routed_bytes * dispatch_ratio
    return DispatchCost(
        2 * (group.time("all_to_all", sent) + group.time("all_to_all", routed_bytes)),
        group.load("all_to_all", sent).scaled(2) + group.load("all_to_all", routed_bytes).scaled(2))


@dataclass(frozen=True)
class AllGatherTraffic:
    """Bytes of Megatron-Core's all-gather dispatcher for one MoE layer and micro-batch on one
    rank of its expert-TP x EP group (``tp_ep``, ``G`` ranks, each holding ``T`` tokens of
    hidden size ``H``, ``E`` routed experts, ``d`` bytes per activation element).

    Read from megatron-core 0.16.1 ``megatron/core/transformer/moe/token_dispatcher.py``
    ``MoEAllGatherTokenDispatcher`` (the same structure at Megatron-LM ba773259, 2024-04):

    * ``token_dispatch`` (lines 256-278): ``gather_from_sequence_parallel_region`` over
      ``tp_ep_group`` of the routing map ([T, E] bool, no gradient), the probabilities ([T, E]
      in the router's dtype: the activation dtype unless ``moe_router_dtype`` is set,
      ``router.py`` lines 95-100) and the hidden states ([T, H] -> [G T, H]);
    * ``dispatch_postprocess`` (280-308): the local experts' columns of the gathered map and
      probabilities, and ``permute`` of the gathered tokens to the rows routed to this rank's
      experts (G T k / ep on average: the same rows the all-to-all delivers);
    * ``combine_preprocess`` / ``token_combine`` (310-341): ``unpermute`` back to [G T, H] and
      ``reduce_scatter_to_sequence_parallel_region`` over ``tp_ep_group`` in the
      probabilities' dtype to [T, H].

    Backward runs the adjoints (``tensor_parallel/mappings.py``: a gather's gradient is a
    reduce-scatter and a reduce-scatter's an all-gather): reduce-scatters of the tokens' and
    the probabilities' gradients, an all-gather of the output's gradient.

    Attributes (nccl-tests sizes: the gathered / unscattered message, G T x row bytes):
        tokens: G T H d, the hidden states each way (forward gather, forward reduce-scatter,
            and their two adjoints).
        probs: G T E d, the probabilities (forward gather, backward reduce-scatter).
        routing_map: G T E x 1 byte (forward gather only).
    """

    tokens: float
    probs: float
    routing_map: float


def allgather_traffic(token_bytes: float, tokens: float, experts: int, ranks: int,
                      probs_bytes: float) -> AllGatherTraffic:
    """:class:`AllGatherTraffic` of one rank holding ``tokens`` tokens (``token_bytes`` = tokens
    x hidden x dtype bytes) in a ``ranks``-rank expert-TP x EP group, ``experts`` routed
    experts, probabilities of ``probs_bytes`` per element."""
    g = max(1, ranks)
    return AllGatherTraffic(tokens=g * token_bytes, probs=g * tokens * experts * probs_bytes,
                            routing_map=g * tokens * experts * 1.0)


def allgather_time(traffic: AllGatherTraffic, group) -> DispatchCost:
    """Megatron-Core's all-gather dispatcher over the expert-TP x EP ``group``
    (:class:`~autopar.cost.comm.Collectives`): forward all-gathers of the tokens, the
    probabilities and the routing map and a reduce-scatter of the expert output; backward a
    reduce-scatter of the tokens' gradient and of the probabilities', and an all-gather of the
    output's gradient (:class:`AllGatherTraffic`). With ``group.size`` 1 (etp = ep = 1) it
    costs nothing."""
    t = traffic
    fwd = (("all_gather", t.tokens), ("all_gather", t.probs), ("all_gather", t.routing_map),
           ("reduce_scatter", t.tokens))
    bwd = (("reduce_scatter", t.tokens), ("reduce_scatter", t.probs), ("all_gather", t.tokens))
    seconds, load = 0.0, NO_LOAD
    for op, nbytes in fwd + bwd:
        if nbytes > 0:
            seconds += group.time(op, nbytes)
            load = load + group.load(op, nbytes)
    return DispatchCost(seconds, load)


def dispatch_cost(dispatcher: str, token_bytes: float, experts: int, top_k: int, group,
                  etp: int = 1, params: DeepEPParams = DEEPEP,
                  routed_scale: float = 1.0, dispatch_ratio: float = 1.0) -> DispatchCost:
    """One MoE layer's dispatch + combine, forward and backward, per micro-batch on one GPU.

    Args:
        dispatcher: one of :data:`autopar.config.DISPATCHERS`.
        token_bytes: bytes of the tokens the rank holds (tokens x hidden x dtype bytes).
        experts, top_k: routed experts and experts per token.
        group: the expert-parallel :class:`~autopar.cost.comm.Collectives` (its cluster gives
            the node size and links).
        etp: expert-tensor-parallel ranks each token also reaches (DeepEP's flex group).
        params: DeepEP's table.
        routed_scale: routed rows sent over dropless routing's (a capacity factor drops or pads
            them: :func:`autopar.cost.capacity.routed_scale`; Megatron-Core drops in the router,
            before the dispatch); it scales the bytes moved.
        dispatch_ratio: bytes the forward dispatch and the backward dispatch of the combine's
            gradient move per byte the combines move (:func:`dispatch_bytes_ratio`: below 1
            where the framework dispatches FP8).

    The ``allgather`` dispatcher is priced by :func:`allgather_time` over the expert-TP x EP
    group instead (its gathers replace the expert-TP gather, so the caller prices both).

    Raises:
        ValueError: an unknown dispatcher, or ``allgather`` (priced by :func:`allgather_time`).
    """
    if dispatcher == "allgather":
        raise ValueError("the allgather dispatcher runs over the expert-TP x EP group: price it "
                         "with allgather_time(allgather_traffic(...), tp_ep_group)")
    if group.size <= 1 or token_bytes <= 0:
        return DispatchCost(0.0, NO_LOAD)
    token_bytes *= routed_scale
    if dispatcher == "alltoall":
        return alltoall_time(token_bytes * max(1, top_k), group, dispatch_ratio)
    if dispatcher == "deepep":
        cl = group.cluster
        nic = (cl.nics_per_node * cl.inter_link.bandwidth_Bps / cl.gpus_per_node
               if cl.inter_link is not None and cl.nics_per_node else 0.0)
        return deepep_time(token_bytes, experts, top_k, group.ranks, cl.gpus_per_node, etp,
                           cl.intra_link.bandwidth_Bps, nic, params, dispatch_ratio)
    raise ValueError(f"unknown dispatcher {dispatcher!r}")
