"""A KV block pool with a host-memory tier (vLLM's CPU offloading, LMCache's local CPU backend):
prefix-cache entries the GPU pool evicts are kept in host memory instead of vanishing, up to the
tier's capacity (least recently used dropped first), and a prompt whose prefix continues in host
memory loads those blocks back instead of recomputing them. No torch.

The GPU pool is the simulator's (block_pool.ExactKeyBlockPool: the engine's decisions); the tier
adds to it through the engine pool's hooks:
- an evicted entry (BlockManager._evicted) goes to the tier: only entries leave, so a request's
  private tail, which gets none, never does (block_pool.py);
- while the scheduler schedules (`loading`), the lookup goes on past the GPU's hits into the tier
  and returns a HOST_BLOCK for each block found there; the scheduler counts them as cached tokens,
  and allocate_slots gives them fresh GPU blocks (evicting, as any allocation does) and registers
  them under their keys. Their copy stays in the tier. Outside schedule() (only_decodes_next and
  other reads) the lookup sees the GPU alone;
- each block loaded costs load_s_per_block on the step that scheduled it (take_load_s): its bytes
  on one GPU over that GPU's host link (each tensor-parallel rank loads its own share at once).
  Copies to the tier are taken as overlapped with compute (they leave a block the pool frees).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq
from itertools import islice

from engine.sequence import Sequence
from simulator.fleet.block_pool import ExactKeyBlockPool

HOST_BLOCK = -1  # a block of the lookup's result that is in the host tier, not (yet) on the GPU
# Of a host link's nominal rate, what a large pinned copy reaches (PCIe's encoding and packet
# overheads: 128b/130b, TLP headers): an assumption, not a measurement.
HOST_LINK_EFFICIENCY = 0.8


class HostTierPool(ExactKeyBlockPool):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, *,
                 host_blocks: int, load_s_per_block: float) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        if host_blocks < 1:
            raise ValueError(f"a host tier needs room for at least one block, got {host_blocks}")
        self.host_blocks, self.load_s_per_block = host_blocks, load_s_per_block
        self._host: OrderedDict[int, None] = OrderedDict()  # keys, least recently used first
        self.loading = False  # set by the replica around Scheduler.schedule
        self._pending = 0  # blocks loaded since take_load_s last ran
        self.loaded_blocks = 0
        self.offloaded_blocks = 0

    def take_load_s(self) -> float:
        """The load time of the blocks loaded since the last call (the step's share)."""
        pending, self._pending = self._pending, 0
        return pending * self.load_s_per_block

    @property
    def num_host_blocks(self) -> int:
        return len(self._host)

    # -- the hooks ----------------------------------------------------------------------------
    def _evicted(self, entry) -> None:
        key, host = entry[0], self._host
        if key in host:
            host.move_to_end(key)
            return
        host[key] = None
        self.offloaded_blocks += 1
        if len(host) > self.host_blocks:
            host.popitem(last=False)

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        found = super().get_computed_blocks(seq)
        if not self.loading or not self._host or not self.enable_prefix_caching or seq.sampling.return_prompt_logits:
            return found
        host = self._host
        num_full = (seq.num_tokens - 1) // self.block_size  # the last token is always computed
        hits = 0
        for key in islice(seq.block_hashes, len(found), num_full):
            if key not in host:
                break
            hits += 1
        return found + [HOST_BLOCK] * hits if hits else found

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> bool:
        real, num_host = _split(computed_blocks)
        if not num_host:
            return super().allocate_slots(seq, num_new_tokens, computed_blocks)
        first = len(real)
        for key in seq.block_hashes[first:first + num_host]:  # used now: the last the tier drops
            self._host.move_to_end(key)
        # The host blocks take fresh GPU blocks like new tokens do, all or nothing.
        if not super().allocate_slots(seq, num_new_tokens + num_host * self.block_size, real):
            return False
        self._register_blocks(seq, first, first + num_host)
        seq.num_registered_blocks = first + num_host
        self._pending += num_host
        self.loaded_blocks += num_host
        return True

    def free_blocks_needed(self, seq: Sequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> int:
        real, num_host = _split(computed_blocks)
        return super().free_blocks_needed(seq, num_new_tokens + num_host * self.block_size, real)


def _split(computed_blocks: Seq[int]) -> tuple[Seq[int], int]:
    """(the GPU blocks, how many HOST_BLOCKs follow them) of a lookup's result."""
    num_host = 0
    for block_id in reversed(computed_blocks):
        if block_id != HOST_BLOCK:
            break
        num_host += 1
    return (computed_blocks[:len(computed_blocks) - num_host] if num_host else computed_blocks), num_host
