"""The simulator makes the engine's scheduling decisions, and its step times are the cost model's."""

from __future__ import annotations


from engine import EngineConfig, LLMEngine
from engine.policy.sampling_params import SamplingParams
from engine.policy.policies import SCHEDULER_POLICIES
from engine.policy.scheduler import Scheduler
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
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

    monkeypatch.setitem(SCHEDULER_POLICIES, "vllm", Recording)  # the policy vllm-v0.15 names
    sim_config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", block_size=BLOCK, num_gpu_blocks=BLOCKS,
                           max_num_seqs=SEQS, max_num_batched_tokens=BUDGET, max_model_len=64)
    # One scheduler call per step (bulk decode runs skip calls; test_steady_decode shows they change nothing).
    result = simulate(sim_config, workload, bulk_decodes=False)
    engine_decisions = [_decisions(o) for o in engine_steps if not o.is_empty]
    sim_decisions = [_decisions(o) for o in sim_steps if not o.is_empty]
    assert any(d[1] for d in engine_decisions), "the pool should be small enough to preempt"
    assert sim_decisions == engine_decisions
    assert result.summary.prefix_cache_hit_rate > 0

