"""Replay timed requests through a real engine in wall-clock time (arrivals honoured, not batched up).

No torch here: it only drives an LLMEngine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.policy.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.engine import LLMEngine
    from engine.outputs import RequestOutput


@dataclass(frozen=True)
class TimedRequest:
    request_id: str
    arrival_s: float  # seconds after the replay starts
    prompt_token_ids: list[int]
    params: SamplingParams


def replay(engine: "LLMEngine", requests: Sequence[TimedRequest],
           on_finish: Callable[["RequestOutput"], None] | None = None) -> list["RequestOutput"]:
    """Add each request when its arrival time comes, step until all finish; outputs in input order.

    Arrival times are stamped as the scheduled arrival (start + arrival_s, on the engine's clock), so
    queueing caused by a busy engine shows up in TTFT.
    """
    pending = sorted(requests, key=lambda r: r.arrival_s)
    finished: dict[str, RequestOutput] = {}
    start = engine.clock()
    i = 0
    while i < len(pending) or engine.has_unfinished_requests():
        now = engine.clock() - start
        while i < len(pending) and pending[i].arrival_s <= now:
            r = pending[i]
            engine.add_request(r.request_id, r.prompt_token_ids, r.params, arrival_time=start + r.arrival_s)
            i += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[i].arrival_s - now))
            continue
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
                if on_finish is not None:
                    on_finish(out)
    return [finished[r.request_id] for r in requests]
