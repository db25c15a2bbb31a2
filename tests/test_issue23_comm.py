"""Issue 23: the communication table books to each link the bytes the timed algorithm puts on
it, so no link's bytes over its seconds exceed its bandwidth (item 7)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autopar
from autopar.hardware import collectives as col

# ---------------------------------------------------------------- one collective


def _fabric(spec: str = "4x8xH100") -> col.Fabric:
    return autopar.Cluster.from_spec(spec).fabric()


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(col.OPS), nbytes=st.floats(1.0, 1e11),
       nodes=st.integers(1, 64), per_node=st.integers(1, 8), fewer=st.integers(0, 7),
       spec=st.sampled_from(["4x8xH100", "4x8xH100+1xib-ndr", "4x8xA100-80GB+2xroce-200g",
                             "4x8xA100-PCIe-80GB"]))
def test_no_link_carries_more_than_its_bandwidth(op, nbytes, nodes, per_node, fewer, spec):
    # uneven groups too: one node holds ``fewer`` members less than the others
    low = max(1, per_node - fewer) if nodes > 1 else per_node
    g = col.GroupLayout((nodes - 1) * per_node + low, nodes, per_node, low, nodes > 1)
    f = _fabric(spec)
    load = col.link_load(op, nbytes, g, f)
    seconds = col.collective_seconds(op, nbytes, g, f)
    if g.size == 1:
        assert load == col.NO_LOAD
        return
    for nb, s, bw in ((load.intra_bytes, load.intra_s, f.intra_Bps),
                      (load.inter_bytes, load.inter_s, f.inter_per_gpu_Bps)):
        assert nb >= 0 and 0 <= s <= seconds * (1 + 1e-12)
        if nb > 0:
            assert nb / s <= bw * (1 + 1e-9)
    if nodes == 1:
        assert load.inter_bytes == 0.0


def test_hierarchical_all_reduce_sends_a_1_over_g_shard_through_the_nics():
    # 16 GPUs on 2 nodes of one NDR NIC each, 1 GB: NVLink reduce-scatter + all-gather inside
    # each node, all-reduce of the 1/8 shard between the nodes' rail peers (NCCL's 2-node tree;
    # only 2 nodes are offered it, issue 25)
    f = _fabric("2x8xH100+1xib-ndr")
    g = col.GroupLayout(16, 2, 8, 8, True)
    M = 1e9
    assert min(col.algorithm_times("all_reduce", M, g, f), key=lambda kv: kv[1])[0] == \
        "hierarchical"
    load = col.link_load("all_reduce", M, g, f)
    assert load.intra_bytes == pytest.approx(2 * 7 / 8 * M)
    assert load.inter_bytes == pytest.approx(2 * 1 / 2 * M / 8)
    # the phases run one after another: they split the collective's time
    assert load.intra_s + load.inter_s == col.collective_seconds("all_reduce", M, g, f)
    # and move the ring's bus bytes in all, 2(n-1)/n x M
    assert load.nbytes == pytest.approx(2 * 15 / 16 * M)


# ---------------------------------------------------------------- whole estimates


def _link_bandwidth(cluster: autopar.Cluster) -> dict[str, float]:
    """Per GPU bytes/s of each link class, datasheet (before efficiency): the intra-node link,
    and the node's NICs shared by its GPUs."""
    intra, inter = cluster.link_classes
    out = {intra: cluster.intra_link.bandwidth_Bps}
    if inter is not None:
        out[inter] = cluster.nics_per_node * cluster.inter_link.bandwidth_Bps \
            / cluster.gpus_per_node
    return out


CASES = [
    # the DP-heavy plans: ZeRO-0 / 1 / 3 over 32 A100 (8 x HDR per node) and 32 H100
    ("llama2-7b", "4x8xA100-80GB", 256, 4096, dict(tp=1, pp=1, dp=32, zero_stage=0)),
    ("llama2-7b", "4x8xA100-80GB", 256, 4096, dict(tp=1, pp=1, dp=32, zero_stage=1)),
    ("llama2-7b", "4x8xA100-80GB", 256, 4096, dict(tp=1, pp=1, dp=32, zero_stage=3)),
    ("llama2-7b", "4x8xH100", 256, 4096, dict(tp=2, pp=1, dp=16, zero_stage=1)),
    # TP across nodes, pipeline, context parallelism
    ("llama2-7b", "4x2xH100", 64, 4096, dict(tp=4, pp=2, dp=1)),
    ("llama2-7b", "2x8xA100-80GB", 64, 4096, dict(tp=4, pp=2, dp=2, zero_stage=1)),
    ("llama2-7b", "4x8xH100", 64, 8192, dict(tp=2, cp=4, pp=1, dp=4, zero_stage=1)),
    # expert parallelism over nodes (a tiny Mixtral, traced from transformers)
    ("hf-tiny-mixtral", "4x2xH100", 64, 256, dict(tp=1, pp=1, dp=8, ep=4, zero_stage=1,
                                                   recompute="full")),
]


@pytest.mark.parametrize("model, spec, gbs, seq, cfg", CASES)
def test_booked_bytes_over_booked_seconds_stay_under_each_links_bandwidth(
        model, spec, gbs, seq, cfg):
    cluster = autopar.Cluster.from_spec(spec)
    e = autopar.estimate(model, cluster, autopar.TrainingConfig(gbs, seq),
                         autopar.ParallelConfig(**cfg))
    bw = _link_bandwidth(cluster)
    assert e.comm_by_link
    for lc in e.comm_by_link:
        link, nbytes, seconds = lc.link, lc.nbytes, lc.seconds
        assert nbytes > 0 and seconds > 0, link
        assert nbytes / seconds <= bw[link], (link, nbytes / seconds / 1e9, bw[link] / 1e9)
        assert lc.dims, link


def test_dp_over_nodes_books_its_nvlink_traffic_too():
    # ZeRO-0 over 32 A100: the table read "InfiniBand 26.1 GB in 0.15 s" (174 GB/s per GPU
    # through 25 GB/s of HDR per GPU); the ring's NVLink hops carry 7 of each 8 bytes
    cluster = autopar.Cluster.from_spec("4x8xA100-80GB")
    e = autopar.estimate("llama2-7b", cluster, autopar.TrainingConfig(256, 4096),
                         autopar.ParallelConfig(tp=1, pp=1, dp=32, zero_stage=0))
    ib, nv = e.link_comm("infiniband").nbytes, e.link_comm("nvlink").nbytes
    assert ib / (ib + nv) == pytest.approx(1 / 8, rel=1e-9)   # one of 8 ring hops leaves the node
    assert e.link_comm("infiniband").nbytes / e.link_comm("infiniband").seconds <= 25e9
    assert {lc.link: lc.dims for lc in e.comm_by_link} == {"infiniband": ("dp",), "nvlink": ("dp",)}


# ---------------------------------------------------------------- item 9: the default batch


def _run(capsys, *argv) -> tuple[int, str, str]:
    from autopar.cli import main
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_a_huge_cluster_gets_a_capped_default_batch():
    # 100,000 GPUs at 8,192 tokens: 100,000 sequences (819M tokens per step) before; now the
    # largest multiple of a divisor of the GPU count within 16M tokens (Llama 3 405B's batch)
    from autopar.api import MAX_DEFAULT_TOKENS_PER_STEP, default_batch_note, default_training
    cluster = autopar.Cluster.from_spec("100000xH100")
    train = default_training(None, cluster, seq_len=8192)
    assert train.global_batch_size == 2000          # 2000 divides 100,000
    assert train.global_batch_size * 8192 <= MAX_DEFAULT_TOKENS_PER_STEP == 2 ** 24
    note = default_batch_note(train, cluster.world_size)
    assert "2,000 sequences x 8,192 tokens = 16.4M tokens" in note and "capped" in note
    assert "arXiv 2407.21783" in note and "--global-batch" in note
    # small clusters keep ~4M tokens, a multiple of the GPUs
    small = default_training(None, autopar.Cluster.from_spec("4x8xA100-80GB"), seq_len=4096)
    assert small.global_batch_size == 1024
    # a fixed data-parallel degree: a multiple of it, one sequence per replica at least
    fixed = default_training(None, cluster, seq_len=8192, unit=12500)
    assert fixed.global_batch_size == 12500
    assert "one sequence per data-parallel replica" in default_batch_note(fixed, 100000, 12500)


def test_the_cli_states_a_defaulted_batch(capsys):
    code, out, err = _run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                          "1x8xA100-80GB", "--seq-len", "512", "--tp", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    # ~4M tokens at 512 = 8192 sequences, a multiple of dp = 4
    assert [n for n in data["notes"] if n.startswith("no global batch given: using 8,192 "
                                                     "sequences x 512 tokens")]
    code, out, err = _run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                          "1x8xA100-80GB", "--seq-len", "512", "--tp", "2", "--json",
                          "--global-batch", "64")
    assert not [n for n in json.loads(out)["notes"] if "global batch" in n]
    # the sequence length given: no note on it; left out: the model's context, said so
    assert not [n for n in json.loads(out)["notes"] if n.startswith("sequence length")]
    code, out, err = _run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                          "1x8xA100-80GB", "--tp", "2", "--json", "--global-batch", "64")
    assert code == 0, err
    notes = [n for n in json.loads(out)["notes"] if n.startswith("sequence length: ")]
    # tiny-llama's preset context is 32 tokens
    assert notes == ["sequence length: 32 tokens, the model's context length (--seq-len sets it)"]


# ---------------------------------------------------------------- item 9: OOM fixes


@pytest.fixture(scope="module")
def oom_7b():
    # ZeRO-0 over 32 A100: 143.5 GB per GPU, out of memory
    from autopar.cli import main
    import contextlib
    import io
    buf = io.StringIO()
    argv = ["estimate", "--model", "llama2-7b", "--cluster", "4x8xA100-80GB",
            "--global-batch", "256", "--seq-len", "4096", "--tp", "1", "--pp", "1", "--dp", "32",
            "--zero", "0", "--recompute", "full"]
    with contextlib.redirect_stdout(buf):
        assert main([*argv, "--json"]) == 0
    return argv, json.loads(buf.getvalue())


def test_an_oom_fix_says_when_it_leaves_less_than_the_search_margin(oom_7b):
    from autopar.search.margin import default_margin
    _, data = oom_7b
    assert data["verdict"] == "out of memory"
    m = default_margin()   # from the measured memory band (0.09 with 97 dense runs)
    assert data["search_memory_margin"] == m and 0.05 < m <= 0.5
    for fix in data["fixes"]:
        free = 1 - fix["memory_per_gpu_bytes"] / data["memory_limit_bytes"]
        assert fix["free_memory_fraction"] == pytest.approx(free)
        assert fix["below_search_margin"] == (fix["fits"] and free < m)
    # recompute selective + pp 2 fits at 76.7 of 85.1 GB: 10% free, below a 12% margin (the
    # default is 9% from 97 dense runs at this writing: test_the_oom_text_names_the_margin...)
    tight = [f for f in data["fixes"] if f["below_search_margin"]]
    assert all(0 < f["free_memory_fraction"] < m for f in tight)
    assert any(0.09 < f["free_memory_fraction"] < 0.12 for f in data["fixes"] if f["fits"])
    assert data["plan_command"] == ("autopar plan --model llama2-7b --cluster 4x8xA100-80GB "
                                    "--global-batch 256 --seq-len 4096")


def test_the_oom_text_names_the_margin_and_the_search(oom_7b, capsys, monkeypatch):
    import autopar.search.margin as margin
    argv, data = oom_7b
    # a margin above the tight fix's 10% free (the default follows the corpus: 9% today)
    monkeypatch.setattr(margin, "default_margin", lambda moe=False: 0.12)
    code, out, _ = _run(capsys, *argv)
    out = " ".join(out.split())                       # the console wraps lines
    assert code == 0
    assert "10% free < 12%" in out   # the tight fix's row
    assert "may find a faster plan that fits: autopar plan --model llama2-7b" in out
    # the fastest fix (ZeRO-1, 38% free) under a 50% margin: the text says it
    monkeypatch.setattr(margin, "default_margin", lambda moe=False: 0.5)
    code, out, _ = _run(capsys, *argv)
    assert "less than the 50% the search keeps" in " ".join(out.split())


# ---------------------------------------------------------------- item 10


def test_a_small_node_gets_one_nic_per_gpu():
    # "2x2xH100" read as 8 NDR NICs per node (400 GB/s for 2 GPUs); DGX H100 has one per GPU
    c = autopar.Cluster.from_spec("2x2xH100")
    assert c.nics_per_node == 2 and c.name.endswith("+2xib-ndr")
    assert autopar.Cluster.from_spec("2x8xH100").nics_per_node == 8
    assert autopar.Cluster.from_spec("2x2xA100-PCIe-80GB").nics_per_node == 1
    assert autopar.Cluster.from_spec("2x2xH100+4xib-ndr").nics_per_node == 4   # as written


def test_json_states_units_and_the_currency(capsys):
    code, out, err = _run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                          "1x8xA100-80GB", "--global-batch", "64", "--seq-len", "512", "--tp", "1",
                          "--json", "--tokens", "1e9", "--price-per-gpu-hour", "2",
                          "--currency", "eur")
    assert code == 0, err
    data = json.loads(out)
    units = data["units"]
    assert units["time_breakdown"] == "s" and units["memory_breakdown"] == "bytes"
    assert units["stage_memory_breakdown"] == "bytes"
    assert units["run_cost"]["cost"] == "EUR"
    cost = data["run_cost"][0]
    assert cost["currency"] == "EUR" and cost["price_per_gpu_hour"] == 2
    assert cost["cost"] == pytest.approx(2 * cost["gpu_hours"])
    code, out, err = _run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                          "1x8xA100-80GB", "--global-batch", "64", "--seq-len", "512", "--tp", "1",
                          "--tokens", "1e9", "--price-per-gpu-hour", "2")
    assert "cost, USD" in out
    code, out, err = _run(capsys, "estimate", "--model", "tiny-llama", "--cluster",
                          "1x8xA100-80GB", "--tp", "1", "--tokens", "1e9", "--currency", "euro")
    assert code == 2 and "ISO 4217" in err


def test_a_gpu_count_beyond_the_limit_is_not_answered_with_a_spec_the_limit_refuses():
    # a new user's pass: '99999999999xH100' was told to write '1x99999999999xh100', which the
    # 2**20-GPU limit then refused
    with pytest.raises(autopar.InvalidClusterSpec) as info:
        autopar.Cluster.from_spec("99999999999xH100")
    assert "1x99999999999" not in str(info.value) and "at most 1048576 GPUs" in str(info.value)
    # 13 H100 fill no whole 8-GPU nodes: the suggestions are whole-node specs that parse (a
    # '1x13xh100' the board's 8-GPU check refuses is not offered)
    with pytest.raises(autopar.InvalidClusterSpec, match="'8xh100' or '16xh100'") as info:
        autopar.Cluster.from_spec("13xH100")
    assert "1x13" not in str(info.value)
