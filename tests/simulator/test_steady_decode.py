"""Bulk steady-decode runs change nothing but speed: every request's timings, the summary and the
scheduling decisions equal those of stepping the scheduler one step at a time."""

from __future__ import annotations

import pandas as pd
import pytest

from simulator.run import simulate
from simulator.sim_config import SimConfig
from simulator.synthetic import load_workload
from tests.simulator.helpers import assert_same_simulation

CASES = [
    ("synthetic:num=300,input=uniform(20,900),output=uniform(1,400),rate=30", {}),
    ("synthetic:num=200,input=uniform(20,900),output=uniform(1,300),rate=inf", dict(num_gpu_blocks=400,
                                                                                    max_model_len=2048)),
    ("synthetic:prefixes=3,prefix_len=200,users=40,input=uniform(5,50),output=uniform(5,200),rate=25",
     dict(replicas=2, router="prefix_affinity")),
    ("synthetic:num=150,input=uniform(20,300),output=uniform(50,200),rate=40", dict(max_num_seqs=8, block_size=4)),
    ("synthetic:num=120,input=uniform(20,300),output=uniform(50,200),rate=20", dict(pp=2, tp=2)),
]


@pytest.mark.parametrize("spec, knobs", CASES)
def test_bulk_decode_runs_equal_step_by_step(spec, knobs) -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", **knobs)
    bulk = simulate(config, load_workload(spec, seed=2))
    stepwise = simulate(config, load_workload(spec, seed=2), bulk_decodes=False)
    assert_same_simulation(bulk, stepwise, ("ttft_s", "tpot_s", "e2e_s", "throughput", "preemptions", "time_split_s",
                                            "prefix_cache_hit_rate"))
    if "num_gpu_blocks" in knobs:
        assert bulk.summary["preemptions"] > 0  # the case meant to exercise preemption does


def test_bulk_decode_runs_equal_step_by_step_on_a_profiled_device(tmp_path) -> None:
    """cpu-local mirrors the engine's padded decode groups: the other bulk path."""
    from calibrate.profile import Profiler, ProfileGrid
    from engine.config import ModelConfig
    import json

    model = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)
    (tmp_path / "config.json").write_text(json.dumps(model))
    Profiler(ModelConfig.from_hf(model), grid=ProfileGrid.quick()).run(tmp_path / "p.jsonl")
    config = SimConfig(model=str(tmp_path / "config.json"), hardware="cpu-local", profile=str(tmp_path / "p.jsonl"),
                       quant="fp32", num_gpu_blocks=256, max_model_len=512)
    spec = "synthetic:num=80,input=uniform(10,200),output=uniform(5,150),rate=200"
    bulk = simulate(config, load_workload(spec))
    stepwise = simulate(config, load_workload(spec), bulk_decodes=False)
    pd.testing.assert_frame_equal(bulk.requests, stepwise.requests, check_exact=False, rtol=1e-12)


def test_bulk_decode_runs_equal_step_by_step_when_requests_fill_identical_blocks() -> None:
    """Prompts made only of shared segments, decoding the same tokens, fill blocks of equal
    content concurrently and get preempted: the prefix cache keeps the first of equal blocks it is
    told of, and the bulk runs, which register in the step-by-step order, end where stepping does."""
    from simulator.workload import make_workload

    rows = [(0.002 * k, 96 if k % 2 else 64, 60 + 7 * (k % 5), (1, 2, 3, 4, 5, 6)) for k in range(60)]
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", block_size=4, num_gpu_blocks=300,
                       max_model_len=512)
    bulk = simulate(config, make_workload("same", rows, segment_tokens=16))
    stepwise = simulate(config, make_workload("same", rows, segment_tokens=16), bulk_decodes=False)
    pd.testing.assert_frame_equal(bulk.requests, stepwise.requests, check_exact=False, rtol=1e-12)
    assert bulk.summary["prefix_cache_hit_rate"] == pytest.approx(stepwise.summary["prefix_cache_hit_rate"])
    assert bulk.summary["prefix_cache_hit_rate"] > 0
