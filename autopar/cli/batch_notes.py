"""Notes on a global batch that is likely not what the user meant: not a multiple of the GPUs,
or more tokens per step than any published pre-training run."""

from __future__ import annotations

import math


#: How far (relative) the next multiple of the GPU count may lie above a given global batch for
#: :func:`batch_divisibility_note` to suggest it: a change a user may well accept
BATCH_NUDGE = 0.05


def batch_divisibility_note(batch: int, world: int) -> list[str]:
    """A note when the global batch ``batch`` (sequences) is not a multiple of the ``world``
    GPUs but one lies within :data:`BATCH_NUDGE` above it: data parallelism must divide the
    batch, so the plans that use every GPU for it are out of reach (the new-user pass saw 1000
    sequences on 21 GPUs pick a pipeline 27% slower than dp=21 with 1008); and when the batch is
    smaller than the GPU count."""
    if batch % world == 0:
        return []
    nearer = -(-batch // world) * world
    if batch < world:
        return [f"the global batch {batch:,} is smaller than the {world:,} GPUs: at most "
                f"{batch:,} data-parallel rank{'s' if batch != 1 else ''}, so the other GPUs "
                "must split each sequence "
                f"(tp, pp, cp); --global-batch {world} or more lets data parallelism use them all"]
    if nearer > batch * (1 + BATCH_NUDGE):
        return []
    common = math.gcd(batch, world)
    shares = f"shares only the factor {common} with" if common > 1 else "shares no factor with"
    return [f"the global batch {batch:,} {shares} the {world:,} GPUs: data parallelism must "
            "divide it, so some plans that shard it "
            f"over every GPU are out of reach; if the batch may change, {nearer:,} "
            f"(+{(nearer - batch) / batch:.1%}) allows them (--global-batch {nearer})"]


#: The largest pre-training batch autopar knows published, in tokens per step: DeepSeek-V3's
#: 15,360 sequences x 4,096 tokens (arXiv 2412.19437, pre-training hyper-parameters)
LARGEST_PUBLISHED_TOKENS_PER_STEP = 15_360 * 4_096


def huge_batch_note(batch: int, seq_len: int, world: int, default_batch: int) -> list[str]:
    """A note when ``batch`` sequences of ``seq_len`` tokens exceed
    :data:`LARGEST_PUBLISHED_TOKENS_PER_STEP`: when ``batch`` is at least ``seq_len`` x ``world``
    (likely tokens given for sequences), naming as fixes the batch of ``batch`` tokens (a
    multiple of the ``world`` GPUs) and autopar's default ``default_batch`` (sequences);
    otherwise the long sequences are the cause, and the fix is the batch of sequences that
    stays within the largest published batch."""
    tokens = batch * seq_len
    if tokens <= LARGEST_PUBLISHED_TOKENS_PER_STEP:
        return []

    def text(n: float) -> str:
        return f"{n / 1e9:,.1f}B" if n >= 1e9 else f"{n / 1e6:,.1f}M"

    head = (f"the global batch {batch:,} sequences x {seq_len:,} tokens = {text(tokens)} "
            "tokens per step is larger than any published pre-training batch (the largest "
            f"autopar knows: DeepSeek-V3's 15,360 x 4,096 = "
            f"{text(LARGEST_PUBLISHED_TOKENS_PER_STEP)} tokens)")
    if batch >= seq_len * world:
        as_tokens = max(1, round(batch / seq_len / world)) * world
        return [f"{head}; --global-batch counts sequences, not tokens. Fix: for about "
                f"{batch:,} tokens per step, --global-batch {as_tokens}; autopar's default "
                f"here is --global-batch {default_batch} ({text(default_batch * seq_len)} "
                "tokens)"]
    within = max(1, LARGEST_PUBLISHED_TOKENS_PER_STEP // seq_len)
    return [f"{head}, at sequences of {seq_len:,} tokens. Fix: --global-batch {within:,} or "
            f"fewer keeps a step within that batch ({text(within * seq_len)} tokens)"]
