"""The engine stamps arrivals, tokens and finishes with its own clock, and replays follow it."""

from __future__ import annotations

import itertools
import time

from engine import LLMEngine, SamplingParams
from engine.replay import TimedRequest, replay
from tests.device import engine_config
from tests.tiny_models import hf_model

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _engine() -> LLMEngine:
    return LLMEngine.from_hf(hf_model("llama-mha-hd32"),
                             engine_config(block_size=4, num_blocks=32, max_model_len=64, max_num_batched_tokens=32))


def test_request_times_come_from_the_engines_clock() -> None:
    engine = _engine()
    ticks = itertools.count(1000.0, 0.5)
    engine.clock = lambda: next(ticks)
    engine.add_request("a", [1, 2, 3], GREEDY)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    (out,) = finished
    assert out.arrival_time == 1000.0
    stamps = [out.first_scheduled_time, out.first_token_time, *out.token_times, out.finish_time]
    assert all(t >= 1000.0 and (t - 1000.0) % 0.5 == 0 for t in stamps)
    assert out.token_times == sorted(set(out.token_times)) and len(out.token_times) == 4


def test_replay_keeps_time_on_the_engines_clock() -> None:
    engine = _engine()
    offset = 1e6
    engine.clock = lambda: time.perf_counter() + offset
    requests = [TimedRequest(str(i), 0.01 * i, [1, 2, 3 + i], GREEDY) for i in range(3)]
    outputs = replay(engine, requests)
    starts = [o.arrival_time - r.arrival_s for o, r in zip(outputs, requests)]
    # Every arrival is stamped from one start on the engine's clock, not on perf_counter's.
    assert max(starts) - min(starts) < 1e-9 and min(starts) > offset
    assert all(o.finish_time > o.arrival_time > offset for o in outputs)
