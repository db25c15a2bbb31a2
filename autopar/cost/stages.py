"""How decoder blocks are cut into pipeline chunks, and which layers each chunk holds.

With p pipeline ranks and v virtual stages there are p * v chunks; chunk c runs on rank c mod p
(Megatron-LM's interleaved assignment). The embedding rides on chunk 0, the head on the last chunk.
"""

from __future__ import annotations

from ..errors import InvalidParallelConfig


def balanced_stage_blocks(num_blocks: int, chunks: int) -> tuple[int, ...]:
    """Blocks per chunk, as even as possible; extra blocks go to the middle chunks, away from the
    first and last, which also hold the embedding and the head.

    Raises:
        InvalidParallelConfig: more chunks than blocks.
    """
    if chunks > num_blocks:
        raise InvalidParallelConfig(
            f"{chunks} pipeline chunks (pp x virtual stages) but only {num_blocks} decoder "
            f"blocks. Fix: use pp x virtual_stages <= {num_blocks}.")
    base, extra = divmod(num_blocks, chunks)
    counts = [base] * chunks
    order = sorted(range(chunks), key=lambda c: (abs(c - (chunks - 1) / 2), c))
    for c in order[:extra]:
        counts[c] += 1
    return tuple(counts)


def chunk_layers(num_layers_total: int, block_indices: list[int],
                 stage_blocks: tuple[int, ...]) -> list[list[int]]:
    """Layer indices of each chunk: chunk 0 gets the layers before the first block (embedding),
    the last chunk the layers after the last block (head).

    Args:
        num_layers_total: number of layers in the graph.
        block_indices: graph indices of the decoder blocks, in order.
        stage_blocks: blocks per chunk, summing to ``len(block_indices)``.

    Raises:
        InvalidParallelConfig: the counts do not sum to the number of blocks.
    """
    if sum(stage_blocks) != len(block_indices):
        raise InvalidParallelConfig(
            f"stage_blocks {list(stage_blocks)} sum to {sum(stage_blocks)} but the model has "
            f"{len(block_indices)} blocks. Fix: make the counts sum to {len(block_indices)}.")
    chunks: list[list[int]] = []
    pos = 0
    for n in stage_blocks:
        chunks.append(block_indices[pos:pos + n])
        pos += n
    first = block_indices[0] if block_indices else num_layers_total
    last = block_indices[-1] if block_indices else num_layers_total - 1
    chunks[0] = list(range(0, first)) + chunks[0]
    chunks[-1] = chunks[-1] + list(range(last + 1, num_layers_total))
    return chunks
