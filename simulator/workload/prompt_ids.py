"""The concrete token ids of a workload request's prompt, for whatever sends a workload to a real
engine or server (`servecast replay`, the validation's engine replays). No torch.

A request's prompt (simulator/workload/requests.py) is its shared segments in order, each
segment_tokens long (the last cut short by the prompt's end), then a tail unique to the request.
Here segment s is segment_tokens ids drawn by a generator seeded with (seed, s) alone, so requests
that open with the same segments open with the same ids, and a real engine's prefix cache hits
where the simulator's does; the tail is drawn by a generator seeded with (seed, request id), so
requests differ from where their segments end (a whole KV block's worth of tail ids equal in two
requests by chance only, 1 in vocab_size^block_size). Request.prompt_token_ids lays out the same
structure with marker ids that are not tokens of any vocabulary; these are.

Ids are uniform over [0, vocab_size): ids below 256 are valid tokens of any real model's vocabulary.
Under one seed, equal request ids get equal tails in any workload (as equal segment ids get equal
ids): give workloads that must not hit each other's cache different seeds.
"""

from __future__ import annotations

import numpy as np

from simulator.workload.requests import Request

# The first word of a generator's seed: which kind of run of ids it draws.
_SEGMENT, _TAIL = 0, 1


def prompt_ids(request: Request, vocab_size: int, seed: int = 0) -> list[int]:
    """The request's prompt_tokens token ids (see the module docstring); seed >= 0."""
    if vocab_size < 1:
        raise ValueError(f"vocab size must be at least 1, got {vocab_size}")
    if seed < 0:
        raise ValueError(f"the token ids' seed must be >= 0, got {seed}")
    ids: list[int] = []
    for segment in request.segments:
        if len(ids) >= request.prompt_tokens:
            break
        ids.extend(_draw((seed, _SEGMENT, segment), request.segment_tokens, vocab_size))
    del ids[request.prompt_tokens:]
    ids.extend(_draw((seed, _TAIL, request.request_id), request.prompt_tokens - len(ids), vocab_size))
    return ids


def _draw(key: tuple[int, int, int], num: int, vocab_size: int) -> list[int]:
    return np.random.default_rng(key).integers(0, vocab_size, num).tolist() if num > 0 else []
