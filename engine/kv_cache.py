"""The paged KV cache: per layer, K and V pools of shape [num_blocks, block_size, kv_heads, head_dim]."""

from __future__ import annotations

import torch

from engine.config import CacheConfig, ModelConfig


class KVCache:
    def __init__(self, model: ModelConfig, cache: CacheConfig, dtype: torch.dtype, device: torch.device) -> None:
        shape = (cache.num_blocks, cache.block_size, model.num_kv_heads, model.head_dim)
        # Zeroed, not empty: padded attention reads unwritten slots under a mask, and a NaN there
        # would survive a zero attention weight.
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(model.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(model.num_layers)]
        self.block_size = cache.block_size
        self.num_blocks = cache.num_blocks

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V of packed tokens ([tokens, kv_heads, head_dim]) at their slots."""
        self.k[layer].view(-1, *k.shape[1:])[slots] = k
        self.v[layer].view(-1, *v.shape[1:])[slots] = v
