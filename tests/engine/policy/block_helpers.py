"""What the block-manager tests share: admitting a sequence as the scheduler does."""

from __future__ import annotations

from engine.policy.block_manager import BlockManager
from engine.policy.sequence import Sequence


def admit(bm: BlockManager, s: Sequence) -> int:
    """Admit a sequence the way the scheduler does; returns the number of cached tokens."""
    computed = bm.get_computed_blocks(s)
    cached = len(computed) * bm.block_size
    assert bm.allocate_slots(s, s.num_tokens - cached, computed)
    s.num_computed_tokens = s.num_tokens
    bm.cache_full_blocks(s)
    return cached
