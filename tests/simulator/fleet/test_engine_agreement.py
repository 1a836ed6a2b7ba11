"""The simulator makes the engine's scheduling decisions, and its step times are the cost model's."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from simulator.fleet import fleet as sim_run
from simulator.cost.model import CostModel
from simulator.cost.types import Chunk
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.cost.step_timer import StepTimer
from simulator.workload.load import load_workload

BLOCK, BLOCKS, SEQS, BUDGET = 4, 24, 6, 24


def _decisions(out) -> tuple:
    return (tuple((str(c.request_id), c.start, c.num_tokens) for c in out.chunks), tuple(str(p) for p in out.preempted))


def test_scheduler_decisions_equal_the_engines(monkeypatch) -> None:
    """Same requests (shared prefixes included), all arriving at once, a pool small enough to preempt:
    the engine's and the simulator's schedulers decide the same chunks, step by step."""
    workload = load_workload("synthetic:prefixes=2,prefix_len=12,users=6,input=uniform(3,20),"
                             "output=uniform(10,30),rate=inf", seed=5)
    # The engine needs token ids inside its vocabulary: map the simulator's ids one to one.
    mapping: dict[int, int] = {}
    prompts = [[mapping.setdefault(t, len(mapping) + 1) for t in r.prompt_token_ids()] for r in workload]
    config = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, vocab_size=max(64, len(mapping) + 2),
                  max_position_embeddings=128)
    engine = LLMEngine.from_config(config, EngineConfig(block_size=BLOCK, num_blocks=BLOCKS, max_num_seqs=SEQS,
                                                        max_num_batched_tokens=BUDGET, max_model_len=64))
    engine_steps = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda now=0.0: engine_steps.append(out := schedule(now)) or out
    for r, prompt in zip(workload, prompts):
        engine.add_request(str(r.request_id), prompt, SamplingParams(max_tokens=r.output_tokens, temperature=0.0,
                                                                     ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()

    sim_steps = []

    class Recording(Scheduler):
        def schedule(self, now: float = 0.0):
            out = super().schedule(now)
            sim_steps.append(out)
            return out

    monkeypatch.setattr(sim_run, "Scheduler", Recording)
    sim_config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", block_size=BLOCK, num_gpu_blocks=BLOCKS,
                           max_num_seqs=SEQS, max_num_batched_tokens=BUDGET, max_model_len=64)
    # One scheduler call per step (bulk decode runs skip calls; test_steady_decode shows they change nothing).
    result = simulate(sim_config, workload, bulk_decodes=False)
    engine_decisions = [_decisions(o) for o in engine_steps if not o.is_empty]
    sim_decisions = [_decisions(o) for o in sim_steps if not o.is_empty]
    assert any(d[1] for d in engine_decisions), "the pool should be small enough to preempt"
    assert sim_decisions == engine_decisions
    assert result.summary.prefix_cache_hit_rate > 0


def test_step_timer_equals_the_cost_models_step_time() -> None:
    spec = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", tp=2).model_spec()
    cost_model = CostModel.load("a100-80gb")
    timer = StepTimer(cost_model, spec, tp=2, dtype="bf16", block_size=16)
    from engine.scheduler import ScheduledChunk

    for chunks in ([ScheduledChunk(1, 100, 1, False, True), ScheduledChunk(2, 3000, 1, False, True)],
                   [ScheduledChunk(1, 0, 512, True, True), ScheduledChunk(2, 40, 1, False, True)],
                   [ScheduledChunk(1, 512, 256, True, False)],
                   # speculative verification chunks (not prefill, several tokens) next to a decode
                   [ScheduledChunk(1, 300, 5, False, True), ScheduledChunk(2, 90, 3, False, True),
                    ScheduledChunk(3, 700, 1, False, True)]):
        expected = cost_model.step_time([Chunk(c.num_tokens, c.start + c.num_tokens, c.samples,
                                               verify=c.num_tokens > 1 and not c.is_prefill) for c in chunks],
                                        spec, tp=2, dtype="bf16", block_size=16).total_s
        assert timer.step(chunks) == pytest.approx(expected, rel=1e-9)
        assert timer.step(chunks) == pytest.approx(expected, rel=1e-9)  # again, from the memo
