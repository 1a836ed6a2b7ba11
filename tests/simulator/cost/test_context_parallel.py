"""Context parallelism's step times (simulator/cost/context_parallel.py): a rank's share of the
tokens and queries, ring attention's exposed wait, the decode queries' collectives."""

from __future__ import annotations

import pytest

from engine.policy.scheduler import ScheduledChunk
from simulator.catalog.models import load_model
from simulator.cost.context_parallel import ContextParallel
from simulator.cost.model import CostModel
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import StepTimer

MODEL = load_model("llama-3.1-8b")


def timers(hardware: str = "h100-sxm", cp: int = 2, cost_model: CostModel | None = None):
    cost_model = cost_model or CostModel.load(hardware)
    return StepTimer(cost_model, ReplicaShape(MODEL)), StepTimer(cost_model, ReplicaShape(MODEL, cp=cp))


def prefill(start: int, n: int) -> list[ScheduledChunk]:
    return [ScheduledChunk(0, start, n, True, True)]


def test_cp1_is_the_plain_step_timer() -> None:
    plain = StepTimer(CostModel.load("h100-sxm"), ReplicaShape(MODEL, cp=1))
    assert plain.context_parallel is None
    with pytest.raises(ValueError, match="cp >= 2"):
        ContextParallel(CostModel.load("h100-sxm"), ReplicaShape(MODEL, cp=1))
    with pytest.raises(ValueError, match="without pipeline parallelism"):
        ReplicaShape(MODEL, pp=2, cp=2)


def test_a_long_prompts_chunk_takes_about_half_as_long_at_cp2_on_nvlink() -> None:
    one, two = timers()
    chunk = prefill(32768 - 8192, 8192)
    t1, t2 = one.step(chunk), two.step(chunk)
    assert t2 < 0.6 * t1
    # Each rank attends its half of the queries over the whole context, and the ring hides behind it.
    assert two.prefill_attention(8192, 32768) == one.prefill_attention(4096, 32768)
    assert two.context_parallel.ring_s(16384) < one.prefill_attention(4096, 32768)
    assert two.split.communication_s == pytest.approx(two.context_parallel.collectives_s(0, 1))


def test_the_ring_shows_when_the_link_is_slower_than_attention() -> None:
    fast = CostModel.load("h100-sxm")
    slow = fast.with_collective({**fast.collective, "link_efficiency": fast.collective["link_efficiency"] / 200})
    _, nvlink = timers(cost_model=fast)
    _, crawl = timers(cost_model=slow)
    chunk = prefill(65536 - 8192, 8192)
    ring = crawl.context_parallel.ring_s
    assert ring(32768) > 10 * nvlink.context_parallel.ring_s(32768)
    attention = crawl.prefill_attention(8192, 65536)
    assert ring(32768) > attention  # then the step waits for the ring, not for attention
    assert crawl.step(chunk) - nvlink.step(chunk) > 0.5 * (ring(32768) - attention)
    assert crawl.split.communication_s == pytest.approx(crawl.context_parallel.collectives_s(0, 1) + ring(32768)
                                                        - attention)
    # A PCIe accelerator's ring is slower than an NVLink one's for the same bytes.
    assert timers("l40s")[1].context_parallel.ring_s(32768) > nvlink.context_parallel.ring_s(32768)


def test_decodes_attend_their_rank_shard_and_gather_their_queries() -> None:
    one, two = timers()
    assert two.decode_attention(64, 64 * 20000) == one.decode_attention(64, 32 * 20000)
    assert two.verify_attention(8, 4, 8 * 30001 + 1) == one.verify_attention(8, 4, 4 * 30001 + 1)  # the busier rank
    decodes = [ScheduledChunk(i, 20000, 1, False, True) for i in range(64)]
    two.step(decodes)
    collectives = two.context_parallel.collectives_s(64, 64)
    assert two.split.communication_s == pytest.approx(collectives) and collectives > 0
    # Token operators run on a rank's half of the step's tokens.
    assert two.token_ops(64) == one.token_ops(32) and two.token_ops(8193) == one.token_ops(4097)


def test_a_steady_decode_run_times_its_steps_as_single_steps() -> None:
    _, two = timers()

    class Seq:
        def __init__(self, computed: int) -> None:
            self.num_computed_tokens, self.request_id = computed, computed

    running = [Seq(30000 + i) for i in range(16)]
    run = two.plan_steady_run(running, 4, 0.0)
    run.plan(4)
    _, single = timers()
    now = 0.0
    for k in range(4):
        now += single.step([ScheduledChunk(s.request_id, s.num_computed_tokens + k, 1, False, True)
                            for s in running])
        assert run.end_times[k] == pytest.approx(now, rel=1e-12)
