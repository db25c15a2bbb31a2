"""The GPU catalog: one :class:`~autopar.hardware.catalog.GpuRow` per GPU model and one
:class:`~autopar.hardware.catalog.Box` per server build, every fact with its source.

Adding a GPU is one row in :data:`GPUS` (and a row in :data:`BOXES` if it ships in a new box).
Figures are dense (no 2:4 sparsity) datasheet peaks in SI units: FLOP/s, bytes, bytes/s.
Datasheets are decimal (1 GB = 1e9 bytes, 1 TB/s = 1e12 bytes/s); nothing here is in GiB except
the framework-visible capacities, which torch reports in GiB. BF16/FP8/HBM/NVLink figures are the
rows of ``docs/reference/hardware_and_formulas.md`` ("Hardware (per GPU)"); FP32, TF32 and the PCIe
generation come from the same NVIDIA datasheets (A100, H100, H800, H200), where TF32 is quoted
with sparsity and halved here.
"""

from __future__ import annotations

from typing import Mapping

from autopar.hardware.catalog import Box, Catalog, GpuRow
from autopar.hardware.gpu import FORM_FACTORS, PRECISIONS, Device, architecture, picklable

_TERA = 1e12
_GIGA = 1e9
_GIB = 2 ** 30
_REF = "docs/reference/hardware_and_formulas.md, Hardware table"

# ----------------------------------------------------------------------------- boxes
_DGX_A100 = ("DGX A100: NVSwitch + 8 x ConnectX-6 HDR compute ports "
             "(docs/reference/hardware_and_formulas.md: 'DGX A100 has 8 ports')")
_DGX_H100 = ("DGX H100 / H200: NVSwitch + 8 x ConnectX-7 NDR "
             "(docs/reference/hardware_and_formulas.md: 'DGX H100 has 8 ports')")
_PCIE_BOX = ("commodity 8-GPU PCIe server, GPUs peer over PCIe switches and the host; one compute NIC, "
             "as in DeepSeek Fire-Flyer AI-HPC (arXiv 2408.14158: 8 x A100 PCIe + one 200 Gb/s IB NIC); "
             "assumption for other PCIe boxes")

_DGX_1V = ("DGX-1 with V100 (NVIDIA DGX-1 datasheet: 8 x Tesla V100, NVLink hybrid cube-mesh, "
           "'Network: Dual 10 GbE, 4 IB EDR'): 4 x 100 Gb/s EDR compute ports per 8 GPUs. The "
           "cube-mesh is a point-to-point fabric (each GPU linked to some peers, not all); the "
           "node model takes it as each GPU's 6-link aggregate (links.py 'nvlink2-cubemesh')")
_DGX_2 = ("DGX-2 (NVIDIA DGX-2 datasheet: 16 x Tesla V100 32GB on 12 NVSwitches, "
          "'8X 100Gb/sec Infiniband/100GigE'): 8 EDR ports per 16-GPU node, i.e. one per two "
          "GPUs; write the node as 1x16 ('2x16xV100-SXM3-32GB'): a spec of 8-GPU nodes gets 8 NICs each")

#: Server builds a GPU row's ``box`` names (``Cluster.from_spec`` takes the links a spec leaves out
#: from them; ``+NICSxLINK`` in a spec overrides the NICs).
BOXES: tuple[Box, ...] = (
    Box("dgx-a100", "nvlink3", 8, "ib-hdr", _DGX_A100),
    Box("hgx-a800", "nvlink3-a800", 8, "ib-hdr",
        "HGX A800: assumed built like HGX A100 (one HDR port per GPU). The reference's field "
        "report (Megatron-LM #1059) ran 4 x 200G RoCE: write '+4xroce-200g' for that"),
    Box("pcie-gen4-hdr", "pcie-gen4", 1, "ib-hdr", _PCIE_BOX),
    Box("dgx-1v", "nvlink2-cubemesh", 4, "ib-edr", _DGX_1V),
    Box("dgx-2", "nvlink2", 8, "ib-edr", _DGX_2, gpus_per_node=16),
    Box("pcie-gen3-edr", "pcie-gen3", 1, "ib-edr",
        "8-GPU PCIe Gen3 server with one EDR NIC: an assumption by analogy with the Gen4/Gen5 "
        "PCIe boxes (" + _PCIE_BOX.split(", as in")[0] + ")"),
    Box("dgx-h100", "nvlink4", 8, "ib-ndr", _DGX_H100),
    Box("hgx-h800", "nvlink4-h800", 8, "ib-ndr",
        "HGX H800 as in the DeepSeek-V3 report (arXiv 2412.19437, sec. 3.2: 50 GB/s IB per GPU)"),
    Box("pcie-gen5-ndr", "pcie-gen5", 1, "ib-ndr", _PCIE_BOX),
    Box("hgx-h20", "nvlink4", 8, "ib-ndr",
        "HGX H20: assumed built like HGX H100 (NVSwitch, one 400 Gb/s NDR NIC per GPU); no "
        "NVIDIA system datasheet for it was found: write '+NxLINK' for your NICs"),
    Box("hgx-b200", "nvlink5", 8, "ib-ndr",
        "HGX B200 / DGX B200 (NVIDIA HGX spec table: 'Networking bandwidth 0.8 TB/s' per 8 "
        "GPUs; DGX B200 datasheet: 8 x ConnectX-7 400 Gb/s): one NDR port per GPU"),
    Box("hgx-b300", "nvlink5", 8, "ib-xdr",
        "HGX B300 (NVIDIA HGX spec table: 'Networking bandwidth 1.6 TB/s' per 8 GPUs, 8 x "
        "ConnectX-8 SuperNIC): one 800 Gb/s port per GPU"),
    Box("gb200-nvl72", "nvlink5", 72, "ib-ndr",
        "GB200 NVL72 rack: 18 compute trays of 4 GPUs (2 GB200 superchips), all 72 GPUs in one "
        "NVLink Switch domain (9 NVLink switch trays, 130 TB/s); scale-out one ConnectX-7 400 "
        "Gb/s per GPU (4 per tray; NVIDIA GB200 NVL72 and DGX GB200 documentation)",
        gpus_per_node=72, gpus_per_host=4),
    Box("gb300-nvl72", "nvlink5", 72, "ib-xdr",
        "GB300 NVL72 rack (NVIDIA Enterprise Reference Architecture, 'System Hardware & "
        "Components': 9 NVSwitch trays joining all 72 Blackwell Ultra GPUs, 130 TB/s; compute "
        "tray of 4 GPUs and 2 Grace CPUs with 4 ConnectX-8 HCAs): one 800 Gb/s port per GPU",
        gpus_per_node=72, gpus_per_host=4),
    Box("amd-mi300-8", "xgmi-mi300", 8, "ib-ndr",
        "8-GPU AMD Instinct MI300X / MI325X platform (OAM modules on a universal baseboard, "
        "Infinity Fabric fully connected); NICs as in Azure ND MI300X v5 (8 x 400 Gb/s "
        "ConnectX-7 InfiniBand per VM, one per GPU); the MI325X platform is assumed the same"),
    Box("amd-mi355-8", "xgmi-mi355", 8, "roce-400g",
        "8-GPU AMD Instinct MI355X platform (Infinity Fabric fully connected); one 400 Gb/s "
        "Ethernet RDMA NIC per GPU (AMD Pensando Pollara 400 AI NIC, as in AMD's MI350-series "
        "rack designs): an assumption, write '+8xib-ndr' or your NICs"),
)

# ----------------------------------------------------------------------------- shared figures
_A100_FLOPS = {"fp32": 19.5 * _TERA, "tf32": 156 * _TERA, "fp16": 312 * _TERA, "bf16": 312 * _TERA}
_H100_SXM_FLOPS = {
    "fp32": 67 * _TERA, "tf32": 494.5 * _TERA, "fp16": 989 * _TERA, "bf16": 989 * _TERA, "fp8": 1979 * _TERA,
}
_H100_PCIE_FLOPS = {
    "fp32": 51 * _TERA, "tf32": 378 * _TERA, "fp16": 756 * _TERA, "bf16": 756 * _TERA, "fp8": 1513 * _TERA,
}
#: Volta has no TF32, BF16 or FP8: the rows list FP32 and the FP16 tensor-core peak only, so
#: ``Device.peak("bf16")`` refuses with the precisions it has. NVIDIA Tesla V100 datasheet
#: (2018, 16/32 GB): "V100 for NVLink" single precision 15.7 TFLOPS, tensor performance 125
#: TFLOPS; "V100 for PCIe" 14 / 112 TFLOPS (tensor = FP16 multiply with FP32 accumulate).
_V100_SXM2_FLOPS = {"fp32": 15.7 * _TERA, "fp16": 125 * _TERA}
_V100_PCIE_FLOPS = {"fp32": 14 * _TERA, "fp16": 112 * _TERA}
_V100_SHEET = ("NVIDIA Tesla V100 GPU Accelerator datasheet (2018): {col}: {fp32} TFLOPS single "
               "precision, {fp16} TFLOPS tensor (FP16), {mem} GB HBM2 (decimal, as the sheet "
               "states it), 900 GB/s, {link}, PCIe Gen3 32 GB/s bidir (16 per direction)")
#: Rated board power ("Max TDP"), per datasheet.
_TDP_SRC = {
    "A100": "NVIDIA A100 datasheet: SXM 400 W, PCIe 40GB 250 W, PCIe 80GB 300 W; A800 is the A100 board",
    "H100": "NVIDIA H100 datasheet: SXM up to 700 W, PCIe 350 W; H800 is the H100 board",
    "H200": "NVIDIA H200 datasheet: SXM up to 700 W",
    "V100": "NVIDIA Tesla V100 datasheet: max power 300 W (V100 for NVLink, SXM2), 250 W (PCIe)",
}
#: Streaming multiprocessors of the shipped part.
_SM_SRC = {
    "A100": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): the A100 product has "
            "108 SMs enabled (of 128 on the full GA100); A800 is the same board",
    "H100": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): H100 SXM5 132 SMs, "
            "H100 PCIe 114 SMs",
    "H800": "DeepSeek-V3 technical report (arXiv 2412.19437, section 3.2.2): 'out of the 132 "
            "SMs available in the H800 GPU'",
    "H200": "NVIDIA H200 datasheet: the GH100 GPU of H100 SXM5 with HBM3e (132 SMs)",
    "V100": "NVIDIA Tesla V100 GPU Architecture whitepaper (2017), Table 1: Tesla V100 80 SMs "
            "(of 84 on the full GV100); every V100 board (SXM2, SXM3, PCIe) ships the same part",
}
#: Memory the framework sees (torch ``total_memory``; torch's out-of-memory message prints it as
#: "GPU 0 has a total capacity of X GiB"), each from a measurement or a quoted message.
_VISIBLE_SRC = {
    "A100 80GB": "torch OOM messages on A100 80GB: 'GPU 0 has a total capacity of 79.25 GiB' "
                 "(github.com/HiDream-ai/VAREdit/issues/6, levihsu/OOTDiffusion/issues/235); "
                 "A800 is the same board with slower NVLink",
    "A100 40GB": "torch OOM message on an A100 40GB: 'total capacity of 39.50 GiB' "
                 "(github.com/TianheWu/CoSeR/issues/10)",
    "H100 80GB": "torch OOM message on 'H100(80GB) x 8' (a vLLM DeepSeek-V3 serving issue): "
                 "'GPU 0 has a total capacity of 79.11 GiB'; H800 is the same board",
    "H200": "measured for autopar (2026-11-30, torch 2.11, CUDA 13.0): "
            "torch.cuda.get_device_properties(0).total_memory = 150109880320 on an NVIDIA H200 "
            "(nvidia-smi memory.total 143771 MiB, of which 616 MiB reserved by the driver)",
    "V100 32GB": "torch OOM messages on V100 32GB: 'GPU 3; 31.74 GiB total capacity' "
                 "(github.com/haotian-liu/LLaVA/issues/812, 'V100*8'), 'GPU 0; 31.74 GiB total "
                 "capacity' (github.com/liucongg/ChatGLM-Finetuning/issues/73, 'V100 32GB'); "
                 "the PCIe 32GB board is assumed the same",
    "V100 16GB": "torch OOM message on 'a 16G V100': 'GPU 0; 15.78 GiB total capacity' "
                 "(github.com/kchengiva/Shift-GCN/issues/34)",
}
_SHEET_FACTS = ("peak_flops", "memory_bytes", "hbm_bandwidth_Bps", "nvlink_bandwidth_Bps",
                "pcie_bandwidth_Bps", "form_factor")


def _gpu(name, aliases, box, flops, mem_gb, hbm_gbps, nvlink_bidir_gbps, pcie_gbps, form, sheet, *,
         tdp_w, tdp_src, sm_count, sm_src, visible_bytes, visible_src) -> GpuRow:
    """A row from datasheet units: GB, GB/s (HBM), GB/s bidirectional (NVLink, halved to the
    per-direction figure), GB/s (PCIe); ``sheet`` is the source of those six figures."""
    device = Device(name=name, peak_flops=flops, memory_bytes=mem_gb * _GIGA,
                    hbm_bandwidth_Bps=hbm_gbps * _GIGA,
                    nvlink_bandwidth_Bps=nvlink_bidir_gbps * _GIGA / 2,
                    pcie_bandwidth_Bps=pcie_gbps * _GIGA, form_factor=form, source=sheet,
                    tdp_w=tdp_w, capacity_bytes=visible_bytes, sm_count=sm_count)
    sources = {**dict.fromkeys(_SHEET_FACTS, sheet), "tdp_w": tdp_src, "sm_count": sm_src,
               "capacity_bytes": visible_src}
    return GpuRow(device, aliases, box, sources)


# ----------------------------------------------------------------------------- GPUs
#: The GPU rows, in catalog order. NVLink is given bidirectional here and halved by ``_gpu``; on
#: PCIe cards it is the optional 2-GPU bridge, which the cluster model does not assume.
GPUS: tuple[GpuRow, ...] = (
    _gpu("A100-SXM4-40GB", ("a100-40gb",), "dgx-a100", _A100_FLOPS, 40, 1555, 600, 32, "sxm",
         f"{_REF} (A100 SXM 40GB); NVIDIA A100 datasheet (FP32/TF32, PCIe Gen4)",
         tdp_w=400, tdp_src=_TDP_SRC["A100"], sm_count=108, sm_src=_SM_SRC["A100"],
         visible_bytes=39.50 * _GIB, visible_src=_VISIBLE_SRC["A100 40GB"]),
    _gpu("A100-SXM4-80GB", ("a100", "a100-80gb", "a100-sxm"), "dgx-a100", _A100_FLOPS, 80, 2039, 600,
         32, "sxm", f"{_REF} (A100 SXM 80GB); NVIDIA A100 datasheet (FP32/TF32, PCIe Gen4)",
         tdp_w=400, tdp_src=_TDP_SRC["A100"], sm_count=108, sm_src=_SM_SRC["A100"],
         visible_bytes=79.25 * _GIB, visible_src=_VISIBLE_SRC["A100 80GB"]),
    _gpu("A100-PCIe-40GB", (), "pcie-gen4-hdr", _A100_FLOPS, 40, 1555, 600, 32, "pcie",
         f"{_REF} (A100 PCIe 40GB, NVLink = 2-GPU bridge); NVIDIA A100 datasheet",
         tdp_w=250, tdp_src=_TDP_SRC["A100"], sm_count=108, sm_src=_SM_SRC["A100"],
         visible_bytes=39.50 * _GIB, visible_src=_VISIBLE_SRC["A100 40GB"]),
    _gpu("A100-PCIe-80GB", ("a100-pcie",), "pcie-gen4-hdr", _A100_FLOPS, 80, 1935, 600, 32, "pcie",
         f"{_REF} (A100 PCIe 80GB, NVLink = 2-GPU bridge); NVIDIA A100 datasheet",
         tdp_w=300, tdp_src=_TDP_SRC["A100"], sm_count=108, sm_src=_SM_SRC["A100"],
         visible_bytes=79.25 * _GIB, visible_src=_VISIBLE_SRC["A100 80GB"]),
    _gpu("A800-SXM4-80GB", ("a800", "a800-80gb"), "hgx-a800", _A100_FLOPS, 80, 2039, 400, 32, "sxm",
         f"{_REF} (A800 SXM 80GB: NVLink 400 GB/s bidirectional); compute as A100",
         tdp_w=400, tdp_src=_TDP_SRC["A100"], sm_count=108, sm_src=_SM_SRC["A100"],
         visible_bytes=79.25 * _GIB, visible_src=_VISIBLE_SRC["A100 80GB"]),
    _gpu("H100-SXM5-80GB", ("h100", "h100-80gb", "h100-sxm"), "dgx-h100", _H100_SXM_FLOPS, 80, 3350,
         900, 64, "sxm",
         f"{_REF} (H100 SXM5); NVIDIA H100 datasheet (FP32 67 TF, TF32 989/2, PCIe Gen5)",
         tdp_w=700, tdp_src=_TDP_SRC["H100"], sm_count=132, sm_src=_SM_SRC["H100"],
         visible_bytes=79.11 * _GIB, visible_src=_VISIBLE_SRC["H100 80GB"]),
    _gpu("H100-PCIe-80GB", ("h100-pcie",), "pcie-gen5-ndr", _H100_PCIE_FLOPS, 80, 2000, 600, 64,
         "pcie", f"{_REF} (H100 PCIe, NVLink = bridge); NVIDIA H100 datasheet (FP32 51 TF, TF32 756/2)",
         tdp_w=350, tdp_src=_TDP_SRC["H100"], sm_count=114, sm_src=_SM_SRC["H100"],
         visible_bytes=79.11 * _GIB, visible_src=_VISIBLE_SRC["H100 80GB"]),
    _gpu("H800-SXM5-80GB", ("h800", "h800-80gb"), "hgx-h800", _H100_SXM_FLOPS, 80, 3350, 400, 64,
         "sxm", f"{_REF} (H800 SXM5: NVLink 400 GB/s bidirectional); compute as H100 SXM5",
         tdp_w=700, tdp_src=_TDP_SRC["H100"], sm_count=132, sm_src=_SM_SRC["H800"],
         visible_bytes=79.11 * _GIB, visible_src=_VISIBLE_SRC["H100 80GB"]),
    _gpu("H200-SXM-141GB", ("h200", "h200-141gb"), "dgx-h100", _H100_SXM_FLOPS, 141, 4800, 900, 64,
         "sxm",
         f"{_REF} (H200 SXM: 141 GB HBM3e, 4.8 TB/s); compute as H100 SXM5 (NVIDIA H200 datasheet)",
         tdp_w=700, tdp_src=_TDP_SRC["H200"], sm_count=132, sm_src=_SM_SRC["H200"],
         visible_bytes=150_109_880_320.0, visible_src=_VISIBLE_SRC["H200"]),
    _gpu("V100-SXM2-16GB", ("v100-16gb",), "dgx-1v", _V100_SXM2_FLOPS, 16, 900, 300, 16, "sxm",
         _V100_SHEET.format(col="V100 for NVLink (SXM2)", fp32=15.7, fp16=125, mem=16,
                            link="NVLink 300 GB/s bidir"),
         tdp_w=300, tdp_src=_TDP_SRC["V100"], sm_count=80, sm_src=_SM_SRC["V100"],
         visible_bytes=15.78 * _GIB, visible_src=_VISIBLE_SRC["V100 16GB"]),
    _gpu("V100-SXM2-32GB", ("v100", "v100-32gb", "v100-sxm2"), "dgx-1v", _V100_SXM2_FLOPS, 32, 900,
         300, 16, "sxm",
         _V100_SHEET.format(col="V100 for NVLink (SXM2)", fp32=15.7, fp16=125, mem=32,
                            link="NVLink 300 GB/s bidir"),
         tdp_w=300, tdp_src=_TDP_SRC["V100"], sm_count=80, sm_src=_SM_SRC["V100"],
         visible_bytes=31.74 * _GIB, visible_src=_VISIBLE_SRC["V100 32GB"]),
    _gpu("V100-PCIe-32GB", ("v100-pcie",), "pcie-gen3-edr", _V100_PCIE_FLOPS, 32, 900, 0, 16,
         "pcie",
         _V100_SHEET.format(col="V100 for PCIe", fp32=14, fp16=112, mem=32, link="no NVLink"),
         tdp_w=250, tdp_src=_TDP_SRC["V100"], sm_count=80, sm_src=_SM_SRC["V100"],
         visible_bytes=31.74 * _GIB, visible_src=_VISIBLE_SRC["V100 32GB"]),
    # the DGX-2 board (nvidia-smi names it 'Tesla V100-SXM3-32GB'): the V100 32GB at the SXM2
    # figures (DGX-2 datasheet: 16 GPUs, '2 petaFLOPS' tensor = 16 x 125 TF), on NVSwitch; its
    # TDP is not on the datasheet and is left unknown
    _gpu("V100-SXM3-32GB", ("v100-sxm3",), "dgx-2", _V100_SXM2_FLOPS, 32, 900, 300, 16, "sxm",
         _V100_SHEET.format(col="V100 for NVLink (SXM2)", fp32=15.7, fp16=125, mem=32,
                            link="NVLink 300 GB/s bidir")
         + "; NVIDIA DGX-2 datasheet: 16 x Tesla V100 32GB, 2 petaFLOPS tensor, 512 GB HBM2 total",
         tdp_w=0, tdp_src="not on the NVIDIA DGX-2 datasheet: left unknown (0)", sm_count=80, sm_src=_SM_SRC["V100"],
         visible_bytes=31.74 * _GIB, visible_src=_VISIBLE_SRC["V100 32GB"]),
)

# ----------------------------------------------------------------------------- 2025 GPUs
# Blackwell (NVIDIA) and CDNA 3/4 (AMD) and the H20. Tensor peaks are DENSE: NVIDIA's HGX and
# NVL72 tables quote FP8/FP16/BF16/TF32 "with sparsity" (footnote), halved here; AMD's spec
# pages quote dense and sparse separately. Per-GPU figures of multi-GPU tables are the table's
# total over its GPUs (8 for HGX, 72 for NVL72). Memory is the datasheet's decimal GB (1 GB =
# 1e9 bytes, as the vendors state it); what the framework sees (``capacity_bytes``) is not
# measured for these rows, so the datasheet figure stands in, and only the B200 row gives
# ``sm_count`` (a device query, :data:`_B200_QUERY`; the others charge no collective-SM
# slowdown: optimistic, see autopar/hardware/nccl.py).
# FP4 (NVFP4 / MXFP4) has no slot in :data:`PRECISIONS` and is left out.
_HGX_B200 = ("NVIDIA HGX B200 spec table (per 8 GPUs, tensor rows with sparsity): FP8 72 PF, "
             "FP16/BF16 36 PF, TF32 18 PF, FP32 600 TF, total memory 1.4 TB (DGX B200 datasheet: "
             "1,440 GB, 64 TB/s HBM3e), NVLink 1.8 TB/s per GPU; halved for dense and divided by 8")
_HGX_B300 = ("NVIDIA HGX B300 spec table (per 8 GPUs, tensor rows with sparsity): FP8 72 PF, "
             "FP16/BF16 36 PF, TF32 18 PF, FP32 600 TF, NVLink 1.8 TB/s per GPU; 288 GB HBM3e "
             "and 8 TB/s per GPU from NVIDIA's 'Inside NVIDIA Blackwell Ultra' technical blog "
             "(2025); halved for dense and divided by 8")
_NVL72_GB200 = ("NVIDIA GB200 NVL72 spec table (per rack of 72 GPUs, tensor rows with "
                "sparsity): FP8 720 PF, FP16/BF16 360 PF, TF32 180 PF, FP32 5,760 TF; up to "
                "13.4 TB HBM3e at 576 TB/s; NVLink 130 TB/s; halved for dense and divided by 72")
_NVL72_GB300 = ("NVIDIA GB300 NVL72 spec table (per rack of 72 GPUs): FP8 720 PF and "
                "FP16/BF16 360 PF with sparsity (360 / 180 PF dense), TF32 180 PF sparse, "
                "576 TB/s HBM3e, NVLink 130 TB/s; 288 GB HBM3e per GPU from 'Inside NVIDIA "
                "Blackwell Ultra' (the rack table's 'up to 20 TB' is 278 GB per GPU: the usable "
                "capacity is not measured); divided by 72")
_H20 = ("NVIDIA H20 product brief (China-market Hopper; no NVIDIA-hosted datasheet found, figures "
        "as reproduced by e.g. willitrunai.com/gpus/h20-96gb and the H20 Geekbench reports): 96 "
        "GB HBM3, 4.0 TB/s, FP16/BF16 148 TF, FP8 296 TF, TF32 74 TF, FP32 44 TF (dense), "
        "NVLink 900 GB/s, PCIe Gen5 128 GB/s bidir, 400 W")
_MI300X = ("AMD Instinct MI300X datasheet / spec page: peak dense FP16 and BF16 1307.4 TF, FP8 "
           "2614.9 TF, TF32 653.7 TF, FP32 (matrix) 163.4 TF; 192 GB HBM3, 5.3 TB/s; 7 Infinity "
           "Fabric links, 128 GB/s peak each; PCIe Gen5 x16 128 GB/s bidir; OAM module (modelled "
           "as 'sxm'); 750 W")
_MI325X = ("AMD Instinct MI325X datasheet / spec page: 256 GB HBM3E at 6 TB/s; compute as "
           "MI300X (same CDNA 3 die, gfx942): dense FP16/BF16 1307.4 TF, FP8 2614.9 TF, TF32 "
           "653.7 TF, FP32 163.4 TF; 7 Infinity Fabric links, 128 GB/s each; PCIe Gen5 x16; "
           "OAM; 1000 W")
_MI355X = ("AMD Instinct MI355X datasheet / spec page: peak dense FP16/BF16 2.5 PF (2516.6 TF), "
           "FP8 5.0 PF (5033.2 TF; AMD's ISSCC 2026 MI355X paper: 'five petaflops' FP8), FP32 "
           "(matrix) 157.3 TF, no TF32 matrix rate (CDNA 4 drops XF32); 288 GB HBM3E, 8 TB/s; 7 "
           "Infinity Fabric links, 153.6 GB/s peak each; PCIe Gen5 x16; OAM; 1400 W")
_PCIE6 = ("PCIe Gen6 x16 = 128 GB/s per direction: Blackwell Ultra's host interface ('Inside "
          "NVIDIA Blackwell Ultra') and ConnectX-8's; lets an 800 Gb/s NIC run at line rate")
_NO_SM = ("not sourced for the shipped part: 0 (unknown), so no SM share is charged to "
          "collectives overlapped with compute (optimistic; the estimate warns)")
_NO_CAPACITY = ("not measured: the datasheet's decimal memory stands in for what the framework "
                "sees (torch total_memory); measure it with autopar calibrate")
_PCIE5 = "PCIe Gen5 x16 = 64 GB/s per direction (the NIC path: ConnectX-7 is a Gen5 x16 card)"


def _row(name, aliases, box, flops_tf, mem_gb, hbm_tbps, link_bidir_gbps, pcie_gbps, sheet, *,
         tdp_w, pcie_src=_PCIE5, link_src=None, hbm_src=None, sm_count=0, sm_src=_NO_SM,
         visible_bytes=None, visible_src=_NO_CAPACITY) -> GpuRow:
    """A 2025 row from datasheet units: TFLOP/s (dense) per precision, GB, TB/s (HBM), GB/s
    bidirectional (NVLink or Infinity Fabric aggregate, halved to per direction), GB/s per
    direction (PCIe); ``sheet`` sources every fact but PCIe (``pcie_src``) and, when given,
    the scale-up link (``link_src``), the HBM bandwidth (``hbm_src``), the SM count
    (``sm_src``) and the memory the framework sees (``visible_bytes``, ``visible_src``)."""
    device = Device(name=name, peak_flops={k: v * _TERA for k, v in flops_tf.items()},
                    memory_bytes=mem_gb * _GIGA, hbm_bandwidth_Bps=hbm_tbps * _TERA,
                    nvlink_bandwidth_Bps=link_bidir_gbps * _GIGA / 2,
                    pcie_bandwidth_Bps=pcie_gbps * _GIGA, form_factor="sxm", source=sheet,
                    tdp_w=tdp_w, capacity_bytes=visible_bytes, sm_count=sm_count)
    sources = {**dict.fromkeys(_SHEET_FACTS, sheet), "pcie_bandwidth_Bps": pcie_src,
               "tdp_w": sheet, "nvlink_bandwidth_Bps": link_src or sheet,
               "hbm_bandwidth_Bps": hbm_src or sheet,
               "sm_count": sm_src, "capacity_bytes": visible_src}
    return GpuRow(device, aliases, box, sources)


#: What a B200's driver reports (pytorch/ao PR #4002, 2026-03-05, a CUDA device query on an
#: NVIDIA B200): 148 SMs, a 7,680-bit memory bus at 3,996 MHz (double data rate: 7.67 TB/s, where
#: the HGX table rounds to 8 TB/s) and 178.35 GB of global memory, GiB by the independent
#: torchtitan log of NousResearch/torchtitan's DeepEP README (167.93 GiB shown as 94.15% of the
#: device: 178.4 GiB).
_B200_QUERY = ("CUDA device query on an NVIDIA B200 (pytorch/ao PR #4002, 2026-03-05): "
               "'Number of SMs: 148', 'Memory Bus Width: 7680 bits', memory clock 3996 MHz, "
               "'Total Global Memory: 178.35 GB'")


_B200_TF = {"fp32": 75, "tf32": 1125, "fp16": 2250, "bf16": 2250, "fp8": 4500}
_GB_TF = {"fp32": 80, "tf32": 1250, "fp16": 2500, "bf16": 2500, "fp8": 5000}
_CDNA3_TF = {"fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9}
#: The 2025 rows, appended to :data:`GPUS` (catalog order is listing order).
GPUS_2025: tuple[GpuRow, ...] = (
    _row("H20-96GB", ("h20",), "hgx-h20",
         {"fp32": 44, "tf32": 74, "fp16": 148, "bf16": 148, "fp8": 296}, 96, 4.0, 900, 64, _H20,
         tdp_w=400),
    _row("B200-SXM-180GB", ("b200", "b200-180gb"), "hgx-b200", _B200_TF, 180,
         7680 / 8 * 3996e6 * 2 / _TERA, 1800, 64,
         _HGX_B200 + "; 1000 W per GPU (HGX B200)", tdp_w=1000,
         hbm_src=_B200_QUERY + ": 7680 / 8 bytes x 3996 MHz x 2 (DDR) = 7.67 TB/s (the HGX "
                 "table's 8 TB/s is rounded)",
         sm_count=148, sm_src=_B200_QUERY,
         visible_bytes=178.35 * 2 ** 30,
         visible_src=_B200_QUERY + " (GiB: NousResearch/torchtitan deepep/README.md logs "
                     "167.93 GiB as 94.15% of the device, 178.4 GiB)"),
    _row("B300-SXM-288GB", ("b300", "b300-288gb"), "hgx-b300", _B200_TF, 288, 8.0, 1800, 128,
         _HGX_B300 + "; 1100 W per GPU (HGX B300)", tdp_w=1100, pcie_src=_PCIE6),
    _row("GB200-NVL72", ("gb200", "gb200-186gb"), "gb200-nvl72", _GB_TF, 186,
         8.0, 1800, 64, _NVL72_GB200 + "; 1200 W per GPU (GB200 superchip configuration)",
         tdp_w=1200),
    _row("GB300-NVL72", ("gb300", "gb300-288gb"), "gb300-nvl72", _GB_TF, 288,
         8.0, 1800, 128, _NVL72_GB300 + "; FP32 80 TF per GPU; 1400 W per GPU", tdp_w=1400,
         pcie_src=_PCIE6),
    _row("MI300X-192GB", ("mi300x",), "amd-mi300-8", _CDNA3_TF, 192, 5.3, 896,
         64, _MI300X, tdp_w=750,
         link_src="AMD MI300X datasheet: 7 Infinity Fabric links x 128 GB/s = 896 GB/s bidir "
                  "to the 7 peers of an 8-GPU platform (no switch; links.py 'xgmi-mi300')"),
    _row("MI325X-256GB", ("mi325x",), "amd-mi300-8", _CDNA3_TF, 256, 6.0, 896,
         64, _MI325X, tdp_w=1000,
         link_src="AMD MI325X datasheet: 7 Infinity Fabric links x 128 GB/s = 896 GB/s bidir "
                  "(links.py 'xgmi-mi300')"),
    _row("MI355X-288GB", ("mi355x",), "amd-mi355-8",
         {"fp32": 157.3, "fp16": 2516.6, "bf16": 2516.6, "fp8": 5033.2}, 288, 8.0, 1075.2, 64,
         _MI355X, tdp_w=1400,
         link_src="AMD MI355X datasheet: 7 Infinity Fabric links x 153.6 GB/s = 1075.2 GB/s "
                  "bidir (links.py 'xgmi-mi355')"),
)

# ----------------------------------------------------------------------------- PCIe cards users train on
# GA102 (GeForce RTX 3090, RTX A6000, A10) and Ada (GeForce RTX 4090, L40S, L4) boards: PCIe
# Gen4 x16 cards with GDDR6/6X memory, no NVSwitch. Tensor peaks are DENSE, with FP32
# accumulate (what mixed-precision training's GEMMs run: cuBLAS accumulates bf16/fp16 GEMMs in
# fp32). GeForce cards run FP16/BF16 (and Ada's FP8) with FP32 accumulate at half the rate of
# FP16 accumulate; the professional boards (RTX A6000, A10, L40S, L4) at the full rate. NVIDIA
# datasheets quote tensor figures "with sparsity" (halved here for dense). Memory is the
# datasheet's GB, kept decimal as every row keeps it, though GDDR capacities are binary (a
# "24 GB" card has 24 GiB: nvidia-smi's 24576 MiB), so what torch sees (``capacity_bytes``,
# measured where an out-of-memory message quotes it) can exceed it. A node of these cards
# talks over PCIe ('pcie-gen4'); the 2-GPU NVLink bridge of the RTX 3090 / RTX A6000 is given as
# the row's NVLink figure and, as on every PCIe row, not assumed by the cluster model. GeForce
# boards do not enable PCIe peer-to-peer, so NCCL goes through host memory there: the
# 'pcie-gen4' figure is an upper bound for them (unvalidated).
_GA102_WP = ("NVIDIA Ampere GA102 GPU Architecture whitepaper v2.0 (2021, 'Updated with RTX A6000 "
             "and NVIDIA A40'), GPU comparison tables")
_ADA_WP = "NVIDIA Ada GPU Architecture whitepaper v2.1 (2023), appendix tables"
_RTX3090 = (f"{_GA102_WP}, GeForce RTX 3090: 82 SMs, boost 1695 MHz, peak FP32 35.6 TF, FP16 "
            "tensor with FP32 accumulate 71/142 TF (dense/sparse; FP16 accumulate 142/284), "
            "BF16 71/142, TF32 35.6/71; 24 GB GDDR6X, 19.5 Gbps on 384 bits = 936 GB/s; "
            "350 W TGP; PCIe Gen4 x16 (32 GB/s per direction); NVLink 2-way bridge, 4 x4 "
            "third-generation links, 112.5 GB/s bidirectional")
_A6000 = (f"{_GA102_WP}, RTX A6000 (and NVIDIA RTX A6000 datasheet): 84 SMs, boost 1800 MHz, "
          "peak FP32 38.7 TF, FP16 and BF16 tensor with FP32 accumulate 154.8/309.7 TF "
          "(dense/sparse, full rate on the professional board), TF32 77.4/154.8; 48 GB GDDR6 "
          "(ECC), 768 GB/s; 300 W; PCIe Gen4 x16; NVLink 2-way bridge 112.5 GB/s bidirectional")
_A10 = ("NVIDIA A10 Tensor Core GPU datasheet: FP32 31.2 TF, TF32 tensor 62.5/125 TF, BF16 and "
        "FP16 tensor 125/250 TF (dense/sparse); 24 GB GDDR6, 600 GB/s; PCIe Gen4 64 GB/s "
        "(bidirectional); 150 W; no NVLink; 72 SMs (GA102, 9,216 CUDA cores / 128 per SM)")
_RTX4090 = (f"{_ADA_WP}, GeForce RTX 4090: 128 SMs, boost 2520 MHz, peak FP32 82.6 TF, FP16 "
            "and BF16 tensor with FP32 accumulate 165.2/330.4 TF (dense/sparse; FP16 "
            "accumulate 330.3/660.6), TF32 82.6/165.2, FP8 with FP32 accumulate 330.3/660.6; 24 "
            "GB GDDR6X, 21 Gbps on 384 bits = 1008 GB/s; 450 W TGP; PCIe Gen4 x16; no NVLink")
_L40S = ("NVIDIA L40S datasheet: FP32 91.6 TF, TF32 tensor 183/366 TF, BF16 and FP16 tensor "
         "362.05/733 TF, FP8 733/1,466 TF (dense/sparse); 48 GB GDDR6 (ECC), 864 GB/s; PCIe "
         "Gen4 x16 64 GB/s bidirectional; 350 W; NVLink: no; 142 SMs (AD102, 18,176 CUDA "
         "cores / 128 per SM)")
_L4 = ("NVIDIA L4 datasheet: FP32 30.3 TF, TF32 tensor 60/120 TF, BF16 and FP16 tensor "
       "121/242 TF, FP8 242.5/485 TF (dense/sparse); 24 GB GDDR6, 300 GB/s; PCIe Gen4 x16 64 "
       "GB/s bidirectional; 72 W; no NVLink; 58 SMs (AD104, 7,424 CUDA cores / 128 per SM)")
_PCIE4 = "PCIe Gen4 x16 = 32 GB/s per direction (the card's host interface, per its sheet)"
_VISIBLE_24 = {
    "RTX 3090": "torch OOM messages on RTX 3090s: '(GPU 0; 23.70 GiB total capacity' "
                "(github.com/GaoLii/DSP/issues/10, 'I have two 3090 GPU'; "
                "github.com/xiaoxiangAQ/GAS-Net/issues/7, '用3090跑')",
    "RTX 4090": "torch OOM messages on RTX 4090s: '(GPU 0; 23.64 GiB total capacity' "
                "(github.com/TMElyralab/MuseTalk/issues/76, 'NVIDIA GeForce RTX 4090 24G'); "
                "'total capacty of 23.64 GiB' (github.com/3DTopia/Phidias-Diffusion/issues/8, "
                "'The 4090 GPU')",
}


def _pcie_card(name, aliases, flops_tf, mem_gb, mem_gbps, link_bidir_gbps, sheet, *, tdp_w,
               sm_count, visible_gib=None, visible_src=_NO_CAPACITY) -> GpuRow:
    """A PCIe Gen4 card from datasheet units: TFLOP/s (dense, FP32 accumulate) per precision,
    GB, GB/s (memory), GB/s bidirectional (the NVLink bridge, 0 for none, halved to per
    direction); ``sheet`` sources every fact but PCIe (:data:`_PCIE4`) and the visible
    capacity (``visible_src``: a quoted torch message, else the datasheet stands in)."""
    device = Device(name=name, peak_flops={k: v * _TERA for k, v in flops_tf.items()},
                    memory_bytes=mem_gb * _GIGA, hbm_bandwidth_Bps=mem_gbps * _GIGA,
                    nvlink_bandwidth_Bps=link_bidir_gbps * _GIGA / 2,
                    pcie_bandwidth_Bps=32 * _GIGA, form_factor="pcie", source=sheet,
                    tdp_w=tdp_w, sm_count=sm_count,
                    capacity_bytes=visible_gib * _GIB if visible_gib else None)
    sources = {**dict.fromkeys(_SHEET_FACTS, sheet), "pcie_bandwidth_Bps": _PCIE4,
               "tdp_w": sheet, "sm_count": sheet, "capacity_bytes": visible_src}
    return GpuRow(device, aliases, "pcie-gen4-hdr", sources)


#: The PCIe cards, appended to :data:`GPUS` after the 2025 rows.
GPUS_PCIE_CARDS: tuple[GpuRow, ...] = (
    _pcie_card("RTX-3090-24GB", ("rtx3090", "rtx-3090", "geforce-rtx-3090"),
               {"fp32": 35.6, "tf32": 35.6, "fp16": 71, "bf16": 71}, 24, 936, 112.5, _RTX3090,
               tdp_w=350, sm_count=82, visible_gib=23.70,
               visible_src=_VISIBLE_24["RTX 3090"]),
    _pcie_card("RTX-A6000-48GB", ("a6000", "rtx-a6000", "rtxa6000"),
               {"fp32": 38.7, "tf32": 77.4, "fp16": 154.8, "bf16": 154.8}, 48, 768, 112.5,
               _A6000, tdp_w=300, sm_count=84),
    _pcie_card("A10-24GB", ("a10",), {"fp32": 31.2, "tf32": 62.5, "fp16": 125, "bf16": 125}, 24,
               600, 0, _A10, tdp_w=150, sm_count=72),
    _pcie_card("RTX-4090-24GB", ("rtx4090", "rtx-4090", "geforce-rtx-4090"),
               {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3}, 24,
               1008, 0, _RTX4090, tdp_w=450, sm_count=128, visible_gib=23.64,
               visible_src=_VISIBLE_24["RTX 4090"]),
    _pcie_card("L40S-48GB", ("l40s",),
               {"fp32": 91.6, "tf32": 183, "fp16": 362.05, "bf16": 362.05, "fp8": 733}, 48, 864,
               0, _L40S, tdp_w=350, sm_count=142),
    _pcie_card("L4-24GB", ("l4",),
               {"fp32": 30.3, "tf32": 60, "fp16": 121, "bf16": 121, "fp8": 242.5}, 24, 300, 0,
               _L4, tdp_w=72, sm_count=58),
)

#: The default preset registry: every reader (``get_device``, ``Cluster.from_spec``,
#: ``Cluster.custom``, ``boxes.node_template``) takes its facts from it.
GPUS = GPUS + GPUS_2025 + GPUS_PCIE_CARDS
CATALOG = Catalog(GPUS, BOXES)

#: Canonical name -> Device (a view of :data:`GPUS`).
DEVICES: Mapping[str, Device] = CATALOG.devices
#: Lower-case alias -> canonical name (a view of the rows' aliases). Canonical names match
#: case-insensitively as well.
ALIASES: Mapping[str, str] = CATALOG.aliases


def list_devices() -> tuple[str, ...]:
    """Canonical names of every GPU in the catalog, in catalog order."""
    return CATALOG.names()


def valid_device_names() -> tuple[str, ...]:
    """Every accepted GPU name: canonical names, then aliases (lower case)."""
    return CATALOG.valid_names()


def get_device(name: str | Device) -> Device:
    """The catalog :class:`Device` for ``name`` (canonical name or alias, case-insensitive).

    A :class:`Device` passed in is returned unchanged.

    Raises:
        InvalidClusterSpec: if the name is unknown; the message lists the valid names and the
            closest match.
    """
    return CATALOG.device(name)


def memory_ambiguity(name: str) -> str | None:
    """A note when ``name`` leaves the memory size open (:meth:`Catalog.memory_ambiguity`)."""
    return CATALOG.memory_ambiguity(name)


__all__ = ["ALIASES", "BOXES", "CATALOG", "DEVICES", "FORM_FACTORS", "GPUS", "PRECISIONS", "Device",
           "architecture", "get_device", "list_devices", "memory_ambiguity", "picklable",
           "valid_device_names"]
