"""Per-request rows and the summary of a set of engine outputs (DESIGN.md summary JSON names)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.outputs import RequestOutput


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {k: None for k in ("mean", "p50", "p90", "p95", "p99")}
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), **{f"p{q}": float(np.percentile(arr, q)) for q in (50, 90, 95, 99)}}


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
    start = min(o.arrival_time for o in outputs)
    end = max(o.finish_time for o in outputs if o.finish_time is not None)
    duration = end - start
    out_tokens = sum(len(o.output_token_ids) for o in outputs)
    total_tokens = out_tokens + sum(len(o.prompt_token_ids) for o in outputs)
    itl = [b - a for o in outputs for a, b in zip(o.token_times, o.token_times[1:])]
    return {
        "num_requests": len(outputs),
        "duration_s": duration,
        "throughput": {
            "requests_per_s": len(outputs) / duration,
            "output_tokens_per_s": out_tokens / duration,
            "total_tokens_per_s": total_tokens / duration,
        },
        "ttft_s": distribution([o.ttft_s for o in outputs if o.ttft_s is not None]),
        "tpot_s": distribution([o.tpot_s for o in outputs if o.tpot_s is not None]),
        "itl_s": distribution(itl),
        "e2e_s": distribution([o.e2e_s for o in outputs if o.e2e_s is not None]),
        "queue_s": distribution([o.queue_s for o in outputs if o.queue_s is not None]),
        "preemptions": sum(o.num_preemptions for o in outputs),
        "cached_prompt_tokens": sum(o.num_cached_prompt_tokens for o in outputs),
    }
