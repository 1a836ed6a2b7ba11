"""Attention metadata: decode grouping and masks."""

from __future__ import annotations

import torch

from engine.attention import DECODE_PAD_TOKENS, build_metadata


def test_decodes_are_grouped_by_length_and_masked_to_their_context() -> None:
    block_size = 4
    lengths = [5, 300, 7, 6, 290, 2000]  # context after this step's token
    chunks = [(n - 1, 1, list(range(-(-n // block_size)))) for n in lengths]
    meta = build_metadata(list(range(len(chunks))), chunks, block_size, {None, 8}, torch.device("cpu"))
    groups = [sorted(lengths[i] for i in d.token_index.tolist()) for d in meta.decodes]
    assert groups == [[5, 6, 7], [290, 300], [2000]]
    for d in meta.decodes:
        padded = d.width * block_size
        # Padding inside a group stays under the budget that justified grouping.
        assert sum(padded - lengths[i] for i in d.token_index.tolist()) <= DECODE_PAD_TOKENS + padded
        for row, i in enumerate(d.token_index.tolist()):
            full, windowed = d.masks[None][row, 0, 0], d.masks[8][row, 0, 0]
            assert full.sum().item() == lengths[i] and full[:lengths[i]].all()
            assert windowed.sum().item() == min(8, lengths[i]) and windowed[lengths[i] - 1]


def test_prefill_chunk_masks_are_causal_from_their_start() -> None:
    meta = build_metadata(list(range(5)), [(3, 5, [0, 1])], 4, {None, 3}, torch.device("cpu"))
    (p,) = meta.prefills
    assert p.context_len == 8
    expected = torch.tensor([[k <= q for k in range(8)] for q in range(3, 8)])
    assert torch.equal(p.masks[None], expected)
    windowed = torch.tensor([[q - 3 < k <= q for k in range(8)] for q in range(3, 8)])
    assert torch.equal(p.masks[3], windowed)
