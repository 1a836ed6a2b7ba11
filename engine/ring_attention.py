"""Attention over a KV cache sharded by sequence position across context-parallel ranks.

Each rank attends queries over the keys it holds and returns the partial output with the
log-sum-exp of its scores; partial results over disjoint key sets combine exactly into full
attention: lse = logaddexp(lse_a, lse_b), out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse).

- Prefill chunks (ring attention): queries stay on their rank; every rank's K/V of the chunk's
  sequence travel round the ring, each hop overlapped with attention over the shard at hand.
- Decode and verification queries: gathered on every rank, attended over each rank's shard, the
  partial outputs combined by a sum over ranks weighted by exp(lse_rank - lse).

The metadata (which rows, blocks, masks) is engine/context_parallel.py's.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from engine.kv_cache import KVCache


class CPAttentionMetadata(Protocol):
    """What ring and gathered attention read of a rank's step (engine/context_parallel.py's
    CPAttentionMetadata, which imports this module to attend)."""

    group: Any  # the ranks' TPGroup
    slot_mapping: torch.Tensor
    num_gathered: int
    gathered: Any  # GatheredQueries | None
    ring: list  # RingChunk, chunk after chunk
    ring_blocks: torch.Tensor | None

_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def partial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, H, M, D]; k, v: [B, H, K, D] or broadcast to it; mask: bool, 4-D, broadcast to
    [B, H, M, K]. Returns out [B, H, M, D] and lse [B, H, M], float32; a query that sees no key has
    lse -inf and out 0 (it then weighs nothing in a combination)."""
    seen = mask.any(-1)
    if q.device.type == "cpu" and _CPU_FLASH is not None:
        # torch's fused CPU kernel returns the log-sum-exp too: a tenth of the unfused time at
        # prefill sizes. A row masked throughout comes back with out 0 and lse 0, set to -inf below.
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        out, lse = _CPU_FLASH(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
        out, lse = out.float(), lse.float()
    else:
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # no NaN from -inf - -inf
        out = torch.matmul(torch.exp(scores - finite[..., None]), v.float())
    return out, lse.masked_fill(~seen, float("-inf"))


def combine(out: torch.Tensor, lse: torch.Tensor, other_out: torch.Tensor,
            other_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two disjoint key sets from the attention over each."""
    total = torch.logaddexp(lse, other_lse)
    safe = torch.where(torch.isinf(total), torch.zeros_like(total), total)
    weight, other_weight = torch.exp(lse - safe), torch.exp(other_lse - safe)
    return out * weight[..., None] + other_out * other_weight[..., None], total


def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int,
                 meta: CPAttentionMetadata, window: int | None, scale: float) -> torch.Tensor:
    """q: [tokens, heads, head_dim], k, v: [tokens, kv_heads, head_dim] of this rank's tokens.
    Writes k, v to this rank's cache; returns this rank's tokens' attention output."""
    cache.write(layer, meta.slot_mapping, k, v)
    out = torch.empty_like(q)
    if meta.num_gathered:
        gathered_attention(q, cache, layer, meta, window, scale, out)
    if meta.ring:
        ring_attention(q, cache, layer, meta, window, scale, out)
    return out


def gathered_attention(q: torch.Tensor, cache: KVCache, layer: int, meta: CPAttentionMetadata,
                       window: int | None, scale: float, out: torch.Tensor) -> None:
    """Decode and verification queries: every rank attends all of them over its shard."""
    group, g = meta.group, meta.gathered
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = cache.num_kv_heads
    # Each query row lives on one rank: the sum over ranks of zero-padded rows gathers them all.
    queries = q.new_zeros(meta.num_gathered, num_heads, head_dim)
    queries[g.index] = q[g.local]
    queries = group.all_reduce(queries)
    batch = meta.num_gathered
    keys, values = cache.gather(layer, g.blocks)  # [kv_heads, batch * keys, head_dim]
    keys = keys.view(num_kv_heads, batch, -1, head_dim).transpose(0, 1)
    values = values.view(num_kv_heads, batch, -1, head_dim).transpose(0, 1)
    part, lse = partial_attention(queries.view(batch, num_kv_heads, -1, head_dim), keys, values,
                                  g.masks[window], scale)
    # Combined over ranks: sum_r out_r exp(lse_r - lse) with lse the log-sum-exp over ranks.
    every_lse = group.all_gather_first(lse[None])
    total = torch.logsumexp(every_lse, dim=0)
    part = part * torch.exp(lse - total)[..., None]
    full = group.all_reduce(part).view(batch, num_heads, head_dim)
    out[g.local] = full[g.index].to(out.dtype)


def ring_attention(q: torch.Tensor, cache: KVCache, layer: int, meta: CPAttentionMetadata,
                   window: int | None, scale: float, out: torch.Tensor) -> None:
    """Prefill chunks: this rank's queries of each over every rank's K/V of its sequence, the
    shards passed round the ring (all prefill chunks of the step in one buffer per hop)."""
    group, ring = meta.group, meta.ring
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = cache.num_kv_heads
    per_head = num_heads // num_kv_heads
    keys, values = cache.gather(layer, meta.ring_blocks)  # [kv_heads, keys, head_dim]: a scratch buffer
    current = torch.stack([keys, values])  # a copy: the buffer that travels
    incoming = torch.empty_like(current)
    # Queries as [kv_heads, per_head, n, head_dim] per chunk against keys [kv_heads, 1, keys,
    # head_dim]: each KV head's keys serve its query heads by broadcasting, never repeated.
    queries = [q[c.local_begin:c.local_end].view(-1, num_kv_heads, per_head, head_dim).permute(1, 2, 0, 3)
               for c in ring]
    acc: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(ring)
    for hop in range(group.world):
        works = group.start_ring_pass(current, incoming) if hop < group.world - 1 else []
        for i, c in enumerate(ring):
            if c.local_end == c.local_begin:
                continue  # no query of this chunk on this rank; its keys still travel
            k = current[0, :, None, c.key_begin:c.key_end]
            v = current[1, :, None, c.key_begin:c.key_end]
            part = partial_attention(queries[i], k, v, c.masks[window][hop], scale)
            acc[i] = part if acc[i] is None else combine(*acc[i], *part)
        for work in works:
            work.wait()
        current, incoming = incoming, current
    for c, result in zip(ring, acc):
        if result is None:
            continue
        n = c.local_end - c.local_begin
        out[c.local_begin:c.local_end] = result[0].permute(2, 0, 1, 3).reshape(n, num_heads, head_dim).to(out.dtype)
