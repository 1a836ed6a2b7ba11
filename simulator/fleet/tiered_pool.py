"""The simulator's KV block pool where KV can also come from elsewhere than this replica's own
prefills: a host-memory tier (vLLM's CPU offloading, LMCache's local CPU backend), and a prefill
replica that computed the prompt (prefill/decode disaggregation, simulator/fleet/disaggregated.py).
No torch.

The GPU pool is the simulator's (block_pool.ExactKeyBlockPool: the engine's decisions); this one
adds to it through the engine pool's hooks:
- the host tier: an evicted entry (BlockManager._evicted) is kept there, up to host_blocks blocks
  (least recently used dropped first); only entries leave, so a request's private tail, which
  gets none, never does (block_pool.py). host_blocks=0: no tier;
- arrived prompts: a sequence whose prompt KV another replica sent (KeyedSequence.arrived_blocks,
  its first full blocks) has them all; their transfer was paid on the way (the link's time);
- while the scheduler schedules (`loading`), the lookup goes on past the GPU's hits: over the
  sequence's arrived blocks (ARRIVED_BLOCK each), then into the tier (HOST_BLOCK each). The
  scheduler counts them as cached tokens, and allocate_slots gives them fresh GPU blocks
  (evicting, as any allocation does) and registers them under their keys. A tier's copy stays
  there. Outside schedule() (only_decodes_next and other reads) the lookup sees the GPU alone;
- each block loaded from the tier costs load_s_per_block on the step that scheduled it
  (take_load_s): its bytes on one GPU over that GPU's host link (each tensor-parallel rank loads
  its own share at once). Copies to the tier are taken as overlapped with compute.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq
from itertools import islice

from simulator.fleet.block_pool import ExactKeyBlockPool, KeyedSequence

HOST_BLOCK = -1  # a block of the lookup's result that is in the host tier, not (yet) on the GPU
ARRIVED_BLOCK = -2  # one that another replica computed and sent (disaggregation)
# Of a host link's nominal rate, what a large pinned copy reaches (PCIe's encoding and packet
# overheads: 128b/130b, TLP headers): an assumption, not a measurement.
HOST_LINK_EFFICIENCY = 0.8


class TieredBlockPool(ExactKeyBlockPool):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, *,
                 host_blocks: int = 0, load_s_per_block: float = 0.0) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        if host_blocks < 0:
            raise ValueError(f"a host tier holds 0 or more blocks, got {host_blocks}")
        self.host_blocks, self.load_s_per_block = host_blocks, load_s_per_block
        self._host: OrderedDict[int, None] = OrderedDict()  # keys, least recently used first
        self.loading = False  # set by the replica around Scheduler.schedule
        self._pending = 0  # blocks loaded from the tier since take_load_s last ran
        self.loaded_blocks = 0
        self.offloaded_blocks = 0

    def take_load_s(self) -> float:
        """The load time of the blocks loaded from the tier since the last call (the step's share)."""
        pending, self._pending = self._pending, 0
        return pending * self.load_s_per_block

    @property
    def num_host_blocks(self) -> int:
        return len(self._host)

    # -- the hooks ----------------------------------------------------------------------------
    def _evicted(self, entry) -> None:
        if not self.host_blocks:
            return
        key, host = entry[0], self._host
        if key in host:
            host.move_to_end(key)
            return
        host[key] = None
        self.offloaded_blocks += 1
        if len(host) > self.host_blocks:
            host.popitem(last=False)

    def get_computed_blocks(self, seq: KeyedSequence) -> list[int]:
        found = super().get_computed_blocks(seq)
        if not self.loading or seq.sampling.return_prompt_logits:
            return found
        num_full = (seq.num_tokens - 1) // self.block_size  # the last token is always computed
        arrived = max(0, min(seq.arrived_blocks, num_full) - len(found))
        hits = 0
        if self._host and self.enable_prefix_caching:
            host = self._host
            for key in islice(seq.block_hashes, len(found) + arrived, num_full):
                if key not in host:
                    break
                hits += 1
        if not arrived and not hits:
            return found
        return found + [ARRIVED_BLOCK] * arrived + [HOST_BLOCK] * hits

    def allocate_slots(self, seq: KeyedSequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> bool:
        real, num_arrived, num_host = _split(computed_blocks)
        if not num_arrived and not num_host:
            return super().allocate_slots(seq, num_new_tokens, computed_blocks)
        first, loaded = len(real), num_arrived + num_host
        for key in seq.block_hashes[first + num_arrived:first + loaded]:  # used now: the last the tier drops
            self._host.move_to_end(key)
        # The loaded blocks take fresh GPU blocks as new tokens do, all or nothing.
        if not super().allocate_slots(seq, num_new_tokens + loaded * self.block_size, real):
            return False
        if self.enable_prefix_caching:
            self._register_blocks(seq, first, first + loaded)
            seq.num_registered_blocks = first + loaded
        self._pending += num_host
        self.loaded_blocks += num_host
        return True

    def free_blocks_needed(self, seq: KeyedSequence, num_new_tokens: int, computed_blocks: Seq[int] = ()) -> int:
        real, num_arrived, num_host = _split(computed_blocks)
        return super().free_blocks_needed(seq, num_new_tokens + (num_arrived + num_host) * self.block_size, real)


def _split(computed_blocks: Seq[int]) -> tuple[Seq[int], int, int]:
    """(the GPU blocks, the ARRIVED_BLOCKs, the HOST_BLOCKs) of a lookup's result, in that order."""
    num_host = num_arrived = 0
    for block_id in reversed(computed_blocks):
        if block_id == HOST_BLOCK and not num_arrived:
            num_host += 1
        elif block_id == ARRIVED_BLOCK:
            num_arrived += 1
        else:
            break
    end = len(computed_blocks) - num_arrived - num_host
    return (computed_blocks[:end] if num_arrived or num_host else computed_blocks), num_arrived, num_host
