"""The paged KV cache: per layer, K and V pools of shape [kv_heads, num_blocks, block_size, head_dim].

Head-major, so that gathering a sequence's blocks yields, per KV head, one contiguous
[context, head_dim] matrix that attention reads without a transpose copy.
"""

from __future__ import annotations

import torch

from engine.policy.config import CacheConfig, ModelConfig


# Quantized KV: stored values, and the largest magnitude each represents (one scale per token and head).
KV_QUANT = {"int8": (torch.int8, 127.0), "fp8": (torch.float8_e4m3fn, 448.0)}


class KVCache:
    def __init__(self, model: ModelConfig, cache: CacheConfig, dtype: torch.dtype, device: torch.device,
                 kv_dtype: str | None = None) -> None:
        """kv_dtype: None stores K/V in the model's dtype; "int8" or "fp8" stores them quantized with a
        scale per token and KV head (dequantized to the model's dtype when gathered)."""
        shape = (model.num_kv_heads, cache.num_blocks, cache.block_size, model.head_dim)
        if kv_dtype is not None and kv_dtype not in KV_QUANT:
            raise ValueError(f"KV cache dtype {kv_dtype!r} is not supported; use int8, fp8 or none")
        self.kv_dtype = kv_dtype
        stored = KV_QUANT[kv_dtype][0] if kv_dtype else dtype
        # Zeroed, not empty: padded attention reads unwritten slots under a mask, and a NaN there
        # would survive a zero attention weight.
        self.k = [torch.zeros(shape, dtype=stored, device=device) for _ in range(model.num_layers)]
        self.v = [torch.zeros(shape, dtype=stored, device=device) for _ in range(model.num_layers)]
        scale_shape = shape[:3] + (1,)
        self.k_scale = [torch.zeros(scale_shape, dtype=dtype, device=device) for _ in range(model.num_layers)] \
            if kv_dtype else []
        self.v_scale = [torch.zeros(scale_shape, dtype=dtype, device=device) for _ in range(model.num_layers)] \
            if kv_dtype else []
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
        return sum(t.numel() * t.element_size() for t in self.k + self.v + self.k_scale + self.v_scale)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V of packed tokens ([tokens, kv_heads, head_dim]) at their slots."""
        if self.kv_dtype is None:
            self.k[layer].view(self.num_kv_heads, -1, self.head_dim)[:, slots] = k.transpose(0, 1)
            self.v[layer].view(self.num_kv_heads, -1, self.head_dim)[:, slots] = v.transpose(0, 1)
            return
        stored, top = KV_QUANT[self.kv_dtype]
        for values, pool, scales in ((k, self.k[layer], self.k_scale[layer]), (v, self.v[layer], self.v_scale[layer])):
            x = values.transpose(0, 1)  # [kv_heads, tokens, head_dim]
            scale = (x.abs().amax(dim=-1, keepdim=True) / top).clamp(min=1e-12)
            q = x / scale
            q = q.round().clamp(-top, top).to(stored) if stored == torch.int8 else q.to(stored)
            pool.view(self.num_kv_heads, -1, self.head_dim)[:, slots] = q
            scales.view(self.num_kv_heads, -1, 1)[:, slots] = scale

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
        if self.kv_dtype is None:
            torch.index_select(self.k[layer], 1, blocks, out=k)
            torch.index_select(self.v[layer], 1, blocks, out=v)
        else:  # dequantize the gathered blocks: stored value x its token's and head's scale
            for pool, scales, out in ((self.k[layer], self.k_scale[layer], k), (self.v[layer], self.v_scale[layer], v)):
                torch.mul(pool.index_select(1, blocks).to(out.dtype), scales.index_select(1, blocks), out=out)
        return k.view(shape[0], -1, shape[3]), v.view(shape[0], -1, shape[3])
