"""Shared fixtures: small graphs and clusters extracted once per session; how pytest-xdist may
split the suite between processes."""

from __future__ import annotations

import pytest
from hypothesis import settings

import autopar
from autopar.api import model_graph

#: Hypothesis defaults for every property test (a test's own ``settings`` override them):
#: the same examples on every run (project rule: deterministic results), no example database
#: written into the checkout (parallel workers would share it), and no per-example deadline
#: (tests assert values, never wall-clock time; a loaded machine made deadlines flaky).
settings.register_profile("autopar", derandomize=True, database=None, deadline=None)
settings.load_profile("autopar")

#: Test files whose tests share nothing (no module-scoped fixture, no module-level state), so
#: pytest-xdist may run each of their tests in any worker. Every other file runs whole in one
#: worker: its module fixtures are built once, and tests such as test_fuzz.py's total count or
#: test_apply_rules.py's "checked varied plans" see every test of their file.
INDEPENDENT_FILES = frozenset({"test_search.py", "test_api.py"})


def xdist_scope(nodeid: str) -> str:
    """The unit of work pytest-xdist hands to one worker for the test ``nodeid``: its file, or
    the test itself in :data:`INDEPENDENT_FILES`."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path.rsplit("/", 1)[-1] in INDEPENDENT_FILES else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``pytest -n N`` (README's test command; xdist's default ``--dist load``), schedule by
    :func:`xdist_scope`: pytest-xdist's ``loadscope`` scheduler (largest units first, more work
    to a worker as it runs dry) with that unit. Written as a scheduler because pytest 9.2 items
    ignore the node-id rename that xdist 3.8's ``--dist loadgroup`` relies on. Other ``--dist``
    modes are left to xdist. Only called when pytest-xdist is installed."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrTestScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return FileOrTestScheduling(config, log)


@pytest.fixture(scope="session")
def graph_7b():
    """llama2-7b at seq 4096, bf16, flash attention."""
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
    return model_graph("llama2-7b", train)[0]


@pytest.fixture(scope="session")
def graph_gpt22b_unfused():
    """Korthikanti's 22B GPT (48 x 6144, 64 heads) at seq 2048 with unfused attention."""
    cfg = {"name": "gpt-22b", "family": "gpt", "num_layers": 48, "hidden_size": 6144,
           "num_heads": 64, "vocab_size": 51200, "seq_len": 2048}
    train = autopar.TrainingConfig(global_batch_size=4, seq_len=2048, flash_attention=False)
    return model_graph(cfg, train)[0]


@pytest.fixture(scope="session")
def preset_cost_model():
    """``make(model, cluster, **train)``: the CostModel of the preset ``model`` on the cluster
    spec ``cluster`` under ``autopar.TrainingConfig(**train)`` (its graph extracted at
    ``train``'s sequence length)."""
    from autopar.cost.model import CostModel

    def make(model: str, cluster: str, **train) -> CostModel:
        config = autopar.TrainingConfig(**train)
        graph = model_graph(model, config)[0]
        return CostModel(graph, autopar.Cluster.from_spec(cluster), config)
    return make


@pytest.fixture(scope="session")
def dense_or_tiny_moe():
    """``make(kind, cfg)``: the CostModel of the dense model dict ``cfg`` (kind "dense") or of
    a tiny DeepSeek-V3 (kind "moe": dense then MoE blocks, expert parallelism) on 16
    A100-40GB, global batch 64 x 4096 tokens: memory binds for part of the space."""
    from autopar.cost.model import CostModel

    def make(kind: str, cfg: dict) -> CostModel:
        train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
        if kind == "dense":
            graph = model_graph(cfg, train)[0]
        else:
            pytest.importorskip("transformers")
            from autopar.graph import extract, hf
            graph = extract(hf.build("hf-tiny-deepseek-v3"), 4096, 1)
        return CostModel(graph, autopar.Cluster.from_spec("2x8xA100-40GB"), train)
    return make


@pytest.fixture(scope="module")
def dev():
    """The development split's raw records by id (locked sources left out)."""
    from benchmarks import validation
    from benchmarks.records import source_key
    locked = validation.locked_sources()
    rows = {r["id"]: r for r in validation.dev_corpus()}
    assert not any(source_key(r) in locked for r in rows.values())
    return rows


@pytest.fixture(scope="session")
def mixed():
    """A small DeepSeek-V3 (one dense block, then three MoE blocks) on 8 A100-40GB, and the
    memory (bytes) of its best plan when memory does not bind: a model of mixed blocks for
    the searches that squeeze it until memory binds (tests/test_issue24_search.py,
    tests/test_issue26_search_speed.py)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from autopar.cost.model import CostModel
    from autopar.graph import extract
    from autopar.search.optimize import search
    cfg = transformers.DeepseekV3Config(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, moe_intermediate_size=512,
        num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=16,
        num_key_value_heads=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, q_lora_rank=256, kv_lora_rank=128, qk_rope_head_dim=32,
        qk_nope_head_dim=64, v_head_dim=64, max_position_embeddings=4096,
        tie_word_embeddings=False, attn_implementation="sdpa")
    with torch.device("meta"):
        model = transformers.DeepseekV3ForCausalLM(cfg)
    graph = extract(model.to(torch.bfloat16), 4096, 1)
    train = autopar.TrainingConfig(global_batch_size=64, seq_len=4096)
    cm = CostModel(graph, autopar.Cluster.from_spec("1x8xA100-40GB"), train)
    return cm, search(cm).best.memory_per_gpu_bytes
