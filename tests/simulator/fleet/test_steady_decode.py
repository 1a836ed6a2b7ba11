"""Bulk steady-decode runs change nothing but speed: every request's timings, the summary and the
scheduling decisions equal those of stepping the scheduler one step at a time."""

from __future__ import annotations

from calibrate.fitting.device import load_cost_model

import pandas as pd
import pytest

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload
from tests.simulator.helpers import assert_same_simulation

CASES = [
    ("synthetic:num=300,input=uniform(20,900),output=uniform(1,400),rate=30", {}),
    ("synthetic:num=200,input=uniform(20,900),output=uniform(1,300),rate=inf", dict(num_gpu_blocks=400,
                                                                                    max_model_len=2048)),
    ("synthetic:prefixes=3,prefix_len=200,users=40,input=uniform(5,50),output=uniform(5,200),rate=25",
     dict(replicas=2, router="prefix_affinity")),
    ("synthetic:num=150,input=uniform(20,300),output=uniform(50,200),rate=40", dict(max_num_seqs=8, block_size=4)),
    ("synthetic:num=120,input=uniform(20,300),output=uniform(50,200),rate=20", dict(pp=2, tp=2)),
    # SGLang: its admission reserve moves with every decode step (bulk ones too), its cache full
    ("synthetic:num=150,input=uniform(20,900),output=uniform(50,400),rate=8", dict(
        engine="sglang-0.5", num_gpu_blocks=300, max_model_len=2048)),
]


@pytest.mark.parametrize("spec, knobs", CASES)
def test_bulk_decode_runs_equal_step_by_step(spec, knobs) -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", **knobs)
    bulk = simulate(config, load_workload(spec, seed=2))
    stepwise = simulate(config, load_workload(spec, seed=2), bulk_decodes=False)
    assert_same_simulation(bulk, stepwise, ("ttft_s", "tpot_s", "e2e_s", "throughput", "preemptions", "time_split_s",
                                            "prefix_cache_hit_rate"))
    if "num_gpu_blocks" in knobs:
        assert bulk.summary.preemptions > 0  # the case meant to exercise preemption does


PROFILED_SPEC = "synthetic:num=80,input=uniform(10,200),output=uniform(5,150),rate=200"


def _profiled_config(folder) -> SimConfig:
    """A tiny model profiled on this CPU as cpu-local, whose decodes pad in groups as the engine's do."""
    import json

    from calibrate.profiling.plan import ProfileGrid
    from calibrate.profiling.profiler import Profiler
    from engine.policy.config import ModelConfig

    model = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)
    (folder / "config.json").write_text(json.dumps(model))
    Profiler(ModelConfig.from_hf(model), grid=ProfileGrid.quick()).run(folder / "p.jsonl")
    return SimConfig(model=str(folder / "config.json"), hardware="cpu-local", profile=str(folder / "p.jsonl"),
                     quant="fp32", num_gpu_blocks=256, max_model_len=512)


def test_bulk_decode_runs_equal_step_by_step_on_a_profiled_device(tmp_path) -> None:
    """cpu-local mirrors the engine's padded decode groups: the other bulk path."""
    config, spec = _profiled_config(tmp_path), PROFILED_SPEC
    bulk = simulate(config, load_workload(spec))
    stepwise = simulate(config, load_workload(spec), bulk_decodes=False)
    pd.testing.assert_frame_equal(bulk.requests, stepwise.requests, check_exact=False, rtol=1e-12)


def test_bulk_decode_runs_equal_step_by_step_when_requests_fill_identical_blocks() -> None:
    """Prompts made only of shared segments, decoding the same tokens, fill blocks of equal
    content concurrently and get preempted: the prefix cache keeps the first of equal blocks it is
    told of, and the bulk runs, which register in the step-by-step order, end where stepping does."""
    from simulator.workload.requests import make_workload

    rows = [(0.002 * k, 96 if k % 2 else 64, 60 + 7 * (k % 5), (1, 2, 3, 4, 5, 6)) for k in range(60)]
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", block_size=4, num_gpu_blocks=300,
                       max_model_len=512)
    bulk = simulate(config, make_workload("same", rows, segment_tokens=16))
    stepwise = simulate(config, make_workload("same", rows, segment_tokens=16), bulk_decodes=False)
    pd.testing.assert_frame_equal(bulk.requests, stepwise.requests, check_exact=False, rtol=1e-12)
    assert bulk.summary.prefix_cache_hit_rate == pytest.approx(stepwise.summary.prefix_cache_hit_rate)
    assert bulk.summary.prefix_cache_hit_rate > 0


def test_a_run_timed_piecewise_has_the_step_by_step_end_times() -> None:
    """A steady run is timed as far as the next arrival, then further as asked: its end times are
    those of one step() after another, to the bit, however it is asked for them."""
    from engine.policy.sampling_params import SamplingParams
    from engine.policy.scheduler import ScheduledChunk
    from engine.policy.sequence import Sequence
    from simulator.catalog.models import load_model
    from simulator.cost.model import CostModel
    from simulator.cost.shape import ReplicaShape
    from simulator.cost.step_timer import StepTimer

    def timer() -> StepTimer:
        return StepTimer(CostModel.load("a100-80gb"), ReplicaShape(load_model("llama-3.1-8b"), block_size=16))

    running = []
    for i, context in enumerate([37, 500, 1201, 64]):
        s = Sequence(f"r{i}", [0] * context, SamplingParams(max_tokens=100), 0.0)
        s.num_computed_tokens = context - 1
        running.append(s)
    stepper, now, expected = timer(), 1.5, []
    for k in range(60):
        now += stepper.step([ScheduledChunk(s.request_id, s.num_computed_tokens + k, 1, False, True)
                             for s in running])
        expected.append(now)
    whole = timer().plan_steady_run(running, 60, 1.5)
    whole.plan(60)
    assert whole.end_times == expected
    piecewise = timer().plan_steady_run(running, 60, 1.5)
    assert len(piecewise.end_times) == 1
    piecewise.plan_until(expected[9])  # an arrival at the instant step 10 ends: step 11 begins then
    assert piecewise.end_times == expected[:11]
    piecewise.plan(13)
    piecewise.plan_until(expected[30] + 1e-9)
    assert piecewise.end_times == expected[:32]
    piecewise.plan_until(float("inf"))
    assert piecewise.end_times == expected
    split_stepper, split_run = stepper.split, timer()
    run = split_run.plan_steady_run(running, 60, 1.5)
    run.plan(60)
    run.commit(60)
    assert split_run.split.steps == split_stepper.steps == 60
    assert split_run.split.decode_s == pytest.approx(split_stepper.decode_s, rel=1e-12)


@pytest.mark.parametrize("profiled", [False, True])
def test_bulk_decode_runs_equal_step_by_step_when_shape_changes_cost(profiled, tmp_path) -> None:
    """A calibrated cost model charges a step whose token count changed (StepTimer.shape_change):
    a bulk run's first step carries it after a prefill or a finish, as stepping does."""
    from simulator.cost.host import FRAMEWORK_TERMS
    from simulator.cost.model import CostModel

    if profiled:  # the padded path
        config, spec = _profiled_config(tmp_path), PROFILED_SPEC
    else:
        config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb")
        spec = "synthetic:num=200,input=uniform(20,900),output=uniform(1,300),rate=30"

    def charged() -> CostModel:
        cost_model = load_cost_model(config.hardware, profile=config.profile)
        return cost_model.with_framework({**{term: 0.0 for term in FRAMEWORK_TERMS}, "operator_scale": 1.0,
                                          **cost_model.framework,
                                          "step_per_halving_s": 2e-3, "step_per_doubling_s": 1e-3})

    bulk = simulate(config, load_workload(spec, seed=3), cost_model=charged())
    stepwise = simulate(config, load_workload(spec, seed=3), cost_model=charged(), bulk_decodes=False)
    pd.testing.assert_frame_equal(bulk.requests, stepwise.requests, check_exact=False, rtol=1e-12)
    plain = simulate(config, load_workload(spec, seed=3))
    assert bulk.requests["e2e_s"].mean() > plain.requests["e2e_s"].mean()  # the charge is there


def test_admissions_beside_bulk_decodes_equal_step_by_step(monkeypatch) -> None:
    """Arrivals that cut steady runs short are admitted beside the running requests' decodes in
    bulk (Scheduler.admit_beside_decodes, with the run before them) as well as after a finish:
    the same requests and summary as stepping, through a pool tight enough to preempt."""
    from engine.policy.scheduler import Scheduler

    calls = []
    admit = Scheduler.admit_beside_decodes
    monkeypatch.setattr(Scheduler, "admit_beside_decodes", lambda self, now: calls.append(now) or admit(self, now))
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", num_gpu_blocks=900, block_size=8)
    spec = "synthetic:num=400,input=uniform(20,600),output=uniform(1,300),rate=12"
    bulk = simulate(config, load_workload(spec, seed=5))
    assert len(calls) > 200
    stepwise = simulate(config, load_workload(spec, seed=5), bulk_decodes=False)
    assert_same_simulation(bulk, stepwise, ("ttft_s", "tpot_s", "e2e_s", "throughput", "preemptions", "time_split_s",
                                            "prefix_cache_hit_rate"))
    assert bulk.summary.preemptions > 0
