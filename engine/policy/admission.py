"""Whether a request can ever be served, decided before it reaches the scheduler. No torch: the
engine checks with it, and so does a server process that holds no model (app/serve)."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import Scheduler
from engine.policy.sequence import Sequence


def checked_sequence(scheduler: Scheduler, vocab_size: int, request_id: str, prompt_token_ids: Seq[int],
                     params: SamplingParams, now: float) -> Sequence:
    """The request as the engine would hold it, or ValueError naming why it can never be served
    (token ids outside the vocabulary, longer than max_model_len or the KV pool). Reads only the
    scheduler's configuration, so other threads may call it while one thread steps the engine."""
    prompt = [int(t) for t in prompt_token_ids]
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"request {request_id!r} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    seq = Sequence(str(request_id), prompt, params, now)
    scheduler.check_request(seq)
    return seq
