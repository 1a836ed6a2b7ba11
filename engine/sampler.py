"""Next-token sampling: greedy, temperature, top-k, top-p, with per-request seeded generators."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.policy.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None]) -> list[int]:
    """logits: [rows, vocab] float32, one row per request; returns one token id per row."""
    tokens = logits.argmax(dim=-1).tolist()
    random_rows = [i for i, p in enumerate(params) if not p.greedy]
    if not random_rows:
        return tokens
    for i in random_rows:
        probs = probabilities(logits[i], params[i])
        tokens[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    return tokens


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy request samples from: temperature, then top-k, then top-p."""
    scaled = logits / params.temperature
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p; the first always stays.
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        scaled = scaled.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return scaled.softmax(-1)
