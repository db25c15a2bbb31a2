"""Issue 24, item 5: one row per GPU with every fact and its source, the architecture derived in
one place, one preset registry that every reader uses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autopar.errors import InvalidClusterSpec
from autopar.hardware import Cluster, Device, get_device
from autopar.hardware.boxes import NODE_TEMPLATES, node_template
from autopar.hardware.catalog import FACTS, Box, Catalog, GpuRow
from autopar.hardware.devices import ALIASES, BOXES, CATALOG, DEVICES, GPUS, valid_device_names
from autopar.hardware.gpu import architecture
from autopar.hardware.nccl import compute_share_taken
from autopar.cost.regime import gpu_generation

ROOT = Path(__file__).resolve().parents[1] / "autopar"


@pytest.mark.parametrize("row", GPUS, ids=lambda r: r.name)
def test_every_fact_of_every_row_has_a_source(row):
    for fact in FACTS:
        assert row.source_of(fact), (row.name, fact)
    assert "ARCH_PREFIXES" in row.source_of("architecture")
    assert row.device.source == row.source_of("peak_flops")


@pytest.mark.parametrize("row", GPUS, ids=lambda r: r.name)
def test_every_reader_takes_its_facts_from_the_row(row):
    assert get_device(row.name) is row.device is DEVICES[row.name]
    for alias in row.aliases:
        assert get_device(alias) is row.device and ALIASES[alias] == row.name
    box = {b.name: b for b in BOXES}[row.box]
    assert NODE_TEMPLATES[row.name] is box is node_template(row.device)
    c = Cluster.from_spec(f"2x8x{row.name}")
    assert c.device is row.device
    assert (c.intra_link.name, c.inter_link.name, c.nics_per_node) == \
        (box.intra_link, box.nic_link, box.nics(8))
    assert row.architecture == row.device.architecture == architecture(row.name)


_KNOWN_ALIASES = (
    "a100", "a100-80gb", "a100-sxm", "a100-40gb", "a100-pcie", "a800", "a800-80gb", "h100",
    "h100-80gb", "h100-sxm", "h100-pcie", "h800", "h800-80gb", "h200", "h200-141gb")


def test_the_alias_listing_keeps_its_order():
    # the cluster-spec error lists these (docs/errors.md): the bare family name's part first
    # (a row added later lists its own aliases too: the known ones keep their relative order)
    aliases = [n for n in valid_device_names()[len(CATALOG.gpus):] if n in _KNOWN_ALIASES]
    assert aliases == list(_KNOWN_ALIASES)


@pytest.mark.parametrize("name, arch", [
    ("A100-SXM4-80GB", "ampere"), ("A40", "ampere"), ("H20", "hopper"), ("H200-SXM-141GB", "hopper"),
    ("B200", "blackwell"), ("GB200", "blackwell"), ("V100-SXM2-32GB", "volta"),
    ("A100-SXM4-80GB[memory_gib=40]", "ampere"), ("MI250X", "unknown"), ("MyCloud-GPU", "unknown"),
])
def test_architecture_is_derived_in_one_place(name, arch):
    # a B200 was "unknown" to Device.architecture and "blackwell" to the error-band regimes
    dev = dataclasses.replace(get_device("H100"), name=name)
    assert architecture(name) == dev.architecture == arch
    # the H20 is banded apart from Hopper (autopar.hardware.gpu.BAND_GENERATIONS, issue 27)
    own = {"H20": "hopper-h20"}.get(name)
    assert gpu_generation(name) == (own or (name.lower() if arch == "unknown" else arch))


def test_no_other_module_maps_names_to_architectures():
    owners = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                    if '"blackwell"' in p.read_text())
    # cost/params.py keys its GEMM ceilings by architecture (issue 27: Blackwell's from the
    # public MAMF table): a constant per architecture, not a name -> architecture mapping
    assert owners == ["config.py", "cost/params.py", "hardware/gpu.py"], owners


def _row(name="H999-TEST-96GB", aliases=("h999",), box="test-box", **sources):
    h100 = get_device("H100-SXM5-80GB")
    dev = dataclasses.replace(h100, name=name, memory_bytes=96e9, capacity_bytes=None,
                              peak_flops={"bf16": 1.5e15, "fp8": 3e15}, sm_count=144)
    facts = {f: "test datasheet" for f in FACTS if f != "capacity_bytes"}
    return GpuRow(dev, aliases, box, {**facts, **sources})


_BOX = Box("test-box", "nvlink4", 4, "roce-400g", "test: a box with 4 RoCE NICs")


def test_a_new_gpu_is_one_row_and_every_reader_serves_it():
    before = len(CATALOG.gpus)
    cat = CATALOG.extended(gpus=(_row(),), boxes=(_BOX,))
    c = Cluster.from_spec("2x8xH999", catalog=cat)
    assert c.device is cat.row("h999").device and c.device.architecture == "hopper"
    assert c.device.peak("bf16") == 1.5e15 and c.device.visible_memory_bytes == 96e9
    assert (c.intra_link.name, c.inter_link.name, c.nics_per_node) == ("nvlink4", "roce-400g", 4)
    assert Cluster.from_spec("1x2xh999-test-96gb", catalog=cat).nics_per_node == 2
    assert compute_share_taken(c.device, "roce", 4) == pytest.approx(8 / 144)
    assert cat.valid_names()[-1] == "h999" and cat.memory_ambiguity("h999") is None
    # the default registry is untouched
    assert "H999-TEST-96GB" not in DEVICES and len(CATALOG.gpus) == before
    with pytest.raises(InvalidClusterSpec, match="GPU part 'h999': unknown GPU 'h999'"):
        Cluster.from_spec("2x8xH999")


@pytest.mark.parametrize("build, match", [
    (lambda: _row(peak_flops=""), r"facts without a source \['peak_flops'\]"),
    (lambda: _row(colour="x"), r"sources of unknown facts \['colour'\]"),
    (lambda: _row(aliases=("H999",)), "must be lower case"),
    (lambda: CATALOG.extended(gpus=(_row(),)), "box 'test-box' is not in the catalog"),
    (lambda: CATALOG.extended(gpus=(_row(aliases=("h100",)),), boxes=(_BOX,)),
     "'h100' is given by both 'H100-SXM5-80GB' and 'H999-TEST-96GB'"),
    (lambda: Box("b", "ib-ndr", 8, "ib-ndr", "x"), "intra_link 'ib-ndr' is not a link of kind"),
    (lambda: Box("b", "nvlink4", 8, "nvlink4", "x"), "nic_link 'nvlink4' is not a link of kind"),
    (lambda: Box("b", "nvlink4", -1, "ib-ndr", "x"), "nics_per_node must be an int >= 0"),
])
def test_bad_rows_are_refused_with_a_fix(build, match):
    with pytest.raises(InvalidClusterSpec, match=match):
        build()


def test_a_hand_built_device_still_needs_its_links():
    own = Device("X1", {"bf16": 1e15}, 96e9, 4e12, 0.0, 64e9, "pcie", "test")
    assert CATALOG.box(own) is None
    with pytest.raises(InvalidClusterSpec, match="has no default node"):
        Cluster.custom(2, 8, own)
    assert isinstance(Catalog(GPUS, BOXES).device("a100"), Device)


def test_every_architecture_the_names_give_is_a_known_one():
    from autopar.config import ARCHITECTURES
    from autopar.hardware.gpu import ARCH_PREFIXES
    assert {a for _, a in ARCH_PREFIXES} | {"unknown"} <= set(ARCHITECTURES)
