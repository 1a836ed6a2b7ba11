"""The paged KV cache: per layer, K and V pools of shape [kv_heads, num_blocks, block_size, head_dim].

Head-major, so that gathering a sequence's blocks yields, per KV head, one contiguous
[context, head_dim] matrix that attention reads without a transpose copy.
"""

from __future__ import annotations

import torch

from engine.config import CacheConfig, ModelConfig


class KVCache:
    def __init__(self, model: ModelConfig, cache: CacheConfig, dtype: torch.dtype, device: torch.device) -> None:
        shape = (model.num_kv_heads, cache.num_blocks, cache.block_size, model.head_dim)
        # Zeroed, not empty: padded attention reads unwritten slots under a mask, and a NaN there
        # would survive a zero attention weight.
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(model.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(model.num_layers)]
        self.block_size = cache.block_size
        self.num_blocks = cache.num_blocks
        self.num_kv_heads = model.num_kv_heads
        self.head_dim = model.head_dim
        # Reused gather buffers: a fresh multi-megabyte allocation per layer and step costs more
        # (page faults) than the copy itself.
        self._scratch_k = torch.empty(0, dtype=dtype, device=device)
        self._scratch_v = torch.empty(0, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V of packed tokens ([tokens, kv_heads, head_dim]) at their slots."""
        self.k[layer].view(self.num_kv_heads, -1, self.head_dim)[:, slots] = k.transpose(0, 1)
        self.v[layer].view(self.num_kv_heads, -1, self.head_dim)[:, slots] = v.transpose(0, 1)

    def gather(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the given blocks, [kv_heads, len(blocks) * block_size, head_dim] each.

        The result lives in a scratch buffer that the next gather overwrites.
        """
        shape = (self.num_kv_heads, blocks.numel(), self.block_size, self.head_dim)
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        if self._scratch_k.numel() < numel:
            self._scratch_k = torch.empty(int(numel * 1.25), dtype=self._scratch_k.dtype, device=self._scratch_k.device)
            self._scratch_v = torch.empty_like(self._scratch_k)
        k = self._scratch_k[:numel].view(shape)
        v = self._scratch_v[:numel].view(shape)
        torch.index_select(self.k[layer], 1, blocks, out=k)
        torch.index_select(self.v[layer], 1, blocks, out=v)
        return k.view(shape[0], -1, shape[3]), v.view(shape[0], -1, shape[3])
