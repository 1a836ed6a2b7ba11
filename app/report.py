"""Per-request rows and the summary of a set of engine outputs (docs/summary.md names): the
figures a simulation's summary has too (simulator.fleet.metrics served), and the engine's own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from engine.outputs import RequestOutput
from simulator.fleet.metrics import TokenGaps, served


def request_rows(outputs: Sequence[RequestOutput]) -> list[dict[str, Any]]:
    start = min(o.arrival_time for o in outputs)
    return [{
        "request_id": o.request_id,
        "arrival_s": o.arrival_time - start,
        "prompt_tokens": len(o.prompt_token_ids),
        "output_tokens": len(o.output_token_ids),
        "queue_s": o.queue_s,
        "ttft_s": o.ttft_s,
        "tpot_s": o.tpot_s,
        "e2e_s": o.e2e_s,
        "preemptions": o.num_preemptions,
        "cached_prompt_tokens": o.num_cached_prompt_tokens,
        "finish_reason": o.finish_reason,
    } for o in outputs]


def summarize(outputs: Sequence[RequestOutput]) -> dict[str, Any]:
    """The outputs' summary: their per-request figures as a simulation's, ITL over the tokens' exact
    gaps; an empty distribution's figures are NaN (null in JSON: app.common.dumps)."""
    frame = pd.DataFrame({
        "status": "finished", "reason": "", "arrival_s": [o.arrival_time for o in outputs],
        "finish_s": pd.Series([o.finish_time for o in outputs], dtype=float),
        "prompt_tokens": [len(o.prompt_token_ids) for o in outputs],
        "output_tokens": [len(o.output_token_ids) for o in outputs],
        **{key: pd.Series([getattr(o, key) for o in outputs], dtype=float)
           for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s")}})
    figures = served(frame, {}, TokenGaps(o.token_times for o in outputs))
    return {
        "num_requests": figures.num_requests,
        "duration_s": figures.duration_s,
        "throughput": figures.throughput.to_dict(),
        **{key: getattr(figures, key).to_dict() for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s")},
        "preemptions": sum(o.num_preemptions for o in outputs),
        "cached_prompt_tokens": sum(o.num_cached_prompt_tokens for o in outputs),
    }
