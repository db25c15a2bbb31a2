"""The ``autopar calibrate`` and ``autopar measure`` arguments, apart from the commands
(:mod:`autopar.cli.measure_cmds`) so that building the parser, and ``--help``, loads no
torch."""

from __future__ import annotations


def add_parsers(sub, positive_float, int_at_least) -> None:
    """Add the ``calibrate`` and ``measure`` subcommands to ``sub`` (argparse subparsers)."""
    c = sub.add_parser("calibrate", help="measure this cluster (run under torchrun) and write a "
                       "calibration file for --calibration")
    c.add_argument("--model", default=None,
                   help="preset name or JSON model dict whose GEMM and attention shapes to time "
                        "(required without --check; with --check: the model whose best plan on "
                        "--cluster is re-estimated)")
    c.add_argument("--out", default=None, help="calibration file to write (JSON; required "
                   "without --check)")
    c.add_argument("--check", action="store_true",
                   help="measure the collectives only and flag links whose bus bandwidth falls "
                        "short of the catalogue and published nccl-tests runs, with what it "
                        "costs a plan (docs/calibrate.md)")
    c.add_argument("--calibration", metavar="FILE", default=None,
                   help="with --check: check this calibration file's collectives instead of "
                        "measuring")
    c.add_argument("--cluster", metavar="SPEC", default=None,
                   help="with --check: the cluster the links should match (default: the plan's, "
                        "else the measured GPU's catalogue node)")
    c.add_argument("--plan", metavar="FILE", default=None,
                   help="with --check: plan file re-estimated with the measured links")
    c.add_argument("--threshold", type=positive_float, default=None,
                   help="with --check: ratio to the catalogue's bus bandwidth below which a link "
                        "is short, in (0, 1] (default: the lowest ratio of a healthy published "
                        "nccl-tests run at that size)")
    c.add_argument("--seq-len", type=int, default=None,
                   help="sequence length of the attention and GEMM shapes (default: the model's)")
    c.add_argument("--precision", default=None, choices=["fp32", "tf32", "bf16", "fp16"],
                   help="precision of GEMMs and attention (default bf16 on a GPU, fp32 on CPU)")
    c.add_argument("--budget", type=positive_float, default=300.0,
                   help="seconds for all benchmarks together (default 300)")
    c.add_argument("--min-bytes", type=int, default=None,
                   help="smallest collective message (default 4096 on GPU, 1024 on CPU)")
    c.add_argument("--max-bytes", type=int, default=None,
                   help="largest collective message (default 256 MiB on GPU, 1 MiB on CPU)")
    c.add_argument("--copy-bytes", type=int, default=None,
                   help="bytes of the memory-bandwidth copy (default 1 GiB on GPU, 64 MiB on CPU)")
    c.add_argument("--device", default=None, metavar="GPU",
                   help="catalogue GPU these GPUs are, when the automatic match from the device "
                        "name is wrong (e.g. H100-SXM5-80GB)")
    c.add_argument("--json", action="store_true", help="print the calibration JSON")
    what = ("run a plan's training steps on synthetic data (under torchrun) and record step "
            "time, memory and the prediction error")
    m = sub.add_parser("measure", help=what, description=what[0].upper() + what[1:] + ".")
    m.add_argument("--plan", required=True, help="plan file (autopar plan --out)")
    m.add_argument("--out", required=True, help="record file to write (published-run JSON)")
    m.add_argument("--steps", type=int_at_least(1), default=10,
                   help="measured steps (default 10)")
    m.add_argument("--warmup", type=int_at_least(0), default=3,
                   help="warm-up steps before measuring (default 3)")
    m.add_argument("--calibration", metavar="FILE", default=None,
                   help="the calibration file the plan was priced with (autopar plan "
                        "--calibration, or measured_cluster in Python): the prediction is "
                        "re-estimated with its fits; needed for a plan priced on a CPU's or "
                        "unlisted GPU's measured cluster (e.g. 1x2xmeasured-cpu)")
    m.add_argument("--cluster", metavar="SPEC", default=None,
                   help="cluster spec to re-estimate the plan on, when its cluster is a custom "
                        "name (Cluster.custom(..., name=...)); e.g. 1x8xH100-80GB")
    m.add_argument("--json", action="store_true", help="print the record JSON")
