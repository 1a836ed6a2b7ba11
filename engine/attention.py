"""Paged attention over a packed (varlen) batch: K/V are read from the cache through block tables.

Tokens of all requests in a step are packed into one [tokens, heads, head_dim] tensor. Requests
with one query token (decodes, and one-token prefill chunks) are attended together in one padded
batch; longer chunks (prefills) one by one, each over its full cached context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.kv_cache import KVCache


@dataclass
class PrefillSlice:
    token_begin: int  # in the packed batch
    token_end: int
    start_position: int  # position of the first query token in its sequence
    block_table: torch.Tensor  # [num_blocks_of_this_sequence]
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)  # window -> [q, ctx]

    @property
    def context_len(self) -> int:
        return self.start_position + self.token_end - self.token_begin


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens]
    decode_token_index: torch.Tensor | None  # [decodes] positions in the packed batch
    decode_block_tables: torch.Tensor | None  # [decodes, max_blocks], padded with block 0
    decode_masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # window -> [D,1,1,L]
    prefills: list[PrefillSlice] = field(default_factory=list)


def build_metadata(positions: list[int], slots: list[int], chunks: list[tuple[int, int, list[int]]],
                   block_size: int, windows: set[int | None], device: torch.device) -> AttentionMetadata:
    """chunks: (start_position, num_tokens, block_table) in packed order."""
    decode_index, decode_tables, decode_lens = [], [], []
    prefills: list[PrefillSlice] = []
    begin = 0
    for start, num_tokens, block_table in chunks:
        if num_tokens == 1:
            decode_index.append(begin)
            decode_tables.append(block_table)
            decode_lens.append(start + 1)
        else:
            prefills.append(PrefillSlice(begin, begin + num_tokens, start,
                                         torch.tensor(block_table, dtype=torch.long, device=device)))
        begin += num_tokens
    meta = AttentionMetadata(torch.tensor(slots, dtype=torch.long, device=device), None, None, prefills=prefills)
    if decode_index:
        width = max(len(t) for t in decode_tables)
        padded = [t + [0] * (width - len(t)) for t in decode_tables]
        meta.decode_token_index = torch.tensor(decode_index, dtype=torch.long, device=device)
        meta.decode_block_tables = torch.tensor(padded, dtype=torch.long, device=device)
        lens = torch.tensor(decode_lens, dtype=torch.long, device=device)[:, None]
        keys = torch.arange(width * block_size, device=device)[None, :]
        for window in windows:
            valid = keys < lens
            if window is not None:
                valid &= keys > lens - 1 - window
            meta.decode_masks[window] = valid[:, None, None, :]
    for p in prefills:
        q_pos = torch.arange(p.start_position, p.start_position + p.token_end - p.token_begin, device=device)[:, None]
        keys = torch.arange(p.context_len, device=device)[None, :]
        for window in windows:
            if window is None and p.start_position == 0:
                p.masks[window] = None  # plain causal
                continue
            valid = keys <= q_pos
            if window is not None:
                valid &= keys > q_pos - window
            p.masks[window] = valid
    return meta


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int,
                    meta: AttentionMetadata, window: int | None, scale: float) -> torch.Tensor:
    """q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim] of this step's tokens.

    Writes k, v to the cache, then returns attention output [tokens, heads, head_dim].
    """
    cache.write(layer, meta.slot_mapping, k, v)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    k_pool, v_pool = cache.k[layer], cache.v[layer]

    if meta.decode_token_index is not None:
        tables = meta.decode_block_tables
        batch = tables.shape[0]
        keys = k_pool[tables].view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
        values = v_pool[tables].view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)
        # One query token per sequence: the query heads of a KV group act as that group's
        # "query length", so K/V are read once per group instead of being repeated.
        queries = q[meta.decode_token_index].view(batch, num_kv_heads, group, head_dim)
        attn = F.scaled_dot_product_attention(queries, keys, values, attn_mask=meta.decode_masks[window],
                                              scale=scale)
        out[meta.decode_token_index] = attn.reshape(batch, num_heads, head_dim)

    for p in meta.prefills:
        queries = q[p.token_begin:p.token_end].transpose(0, 1)  # [heads, n, d]
        if p.start_position == 0:
            keys, values = k[p.token_begin:p.token_end], v[p.token_begin:p.token_end]
        else:
            keys = k_pool[p.block_table].view(-1, num_kv_heads, head_dim)[:p.context_len]
            values = v_pool[p.block_table].view(-1, num_kv_heads, head_dim)[:p.context_len]
        keys = keys.transpose(0, 1).repeat_interleave(group, dim=0)
        values = values.transpose(0, 1).repeat_interleave(group, dim=0)
        mask = p.masks[window]
        attn = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, is_causal=mask is None,
                                              scale=scale)
        out[p.token_begin:p.token_end] = attn.transpose(0, 1)
    return out
