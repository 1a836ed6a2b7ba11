"""How the engine batches decodes for attention. Plain Python, no torch (the simulator mirrors it).

Decodes (requests with one query token) are sorted by context length and cut into padded
batches: a new batch starts when padding the current one to the next sequence's length would add
more than DECODE_PAD_TOKENS key positions, about what one more gather + attention call costs on a
CPU. Every sequence of a batch is padded to the batch's longest context, in whole blocks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

DECODE_PAD_TOKENS = 512

T = TypeVar("T")


def decode_groups(items: Sequence[T], context_len, block_size: int) -> Iterator[list[T]]:
    """Consecutive groups of items (already sorted by context_len(item), ascending)."""
    group: list[T] = []
    width = 0
    for item in items:
        new_width = -(-context_len(item) // block_size)
        if group and len(group) * (new_width - width) * block_size > DECODE_PAD_TOKENS:
            yield group
            group = []
        group.append(item)
        width = new_width
    if group:
        yield group


def padded_decode_batches(context_lens: Sequence[int], block_size: int) -> list[tuple[int, int]]:
    """(batch size, padded context length) of each attention call for decodes of these contexts."""
    return [(len(g), -(-g[-1] // block_size) * block_size)
            for g in decode_groups(sorted(context_lens), lambda n: n, block_size)]
