"""The simulator: queueing theory, conservation, determinism, memory planning, routing, batching."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload
from simulator.workload.requests import make_workload
from simulator.workload.synthetic import arrival_times
from tests.simulator.helpers import FixedStepTimer, workload

# servecast: the step times alone, none of a serving engine's request latency or output delay
SMALL = dict(model="llama-3.1-8b", hardware="h100-sxm", engine="servecast")


def test_md1_queueing_delay_matches_pollaczek_khinchine() -> None:
    """Batch size 1, one step per request of fixed length, Poisson arrivals: an M/D/1 queue, whose
    mean wait is rho * D / (2 (1 - rho))."""
    service, rho, n = 1.0, 0.6, 60_000
    arrivals = arrival_times(n, rho / service, "poisson", 1.0, np.random.default_rng(7))
    w = make_workload("md1", [(float(a), 1, 1, ()) for a in arrivals])
    config = SimConfig(**SMALL, max_num_seqs=1, enable_prefix_caching=False)
    result = simulate(config, w, timer=FixedStepTimer(config, service))
    measured = result.requests["queue_s"].mean()
    expected = rho * service / (2 * (1 - rho))
    assert measured == pytest.approx(expected, rel=0.03)
    # Each request's TTFT is its wait plus one service time.
    assert np.allclose(result.requests["ttft_s"], result.requests["queue_s"] + service)


def test_every_request_finishes_or_is_rejected_with_a_reason() -> None:
    rows = [(0.1 * i, 200, 50) for i in range(40)] + [(1.0, 9000, 10), (2.0, 100, 9000)]
    config = SimConfig(**SMALL, max_model_len=4096)
    result = simulate(config, workload(rows))
    df = result.requests
    assert len(df) == len(rows) and df["request_id"].is_unique
    assert set(df["status"]) == {"finished", "rejected"}
    rejected = df[df["status"] == "rejected"]
    assert len(rejected) == 2 and rejected["reason"].str.contains("max_model_len").all()
    finished = df[df["status"] == "finished"]
    assert (finished["output_tokens"] == 50).all()
    assert (finished["finish_s"] >= finished["first_token_s"]).all()
    assert (finished["first_token_s"] > finished["arrival_s"]).all()
    assert result.summary.num_finished + result.summary.num_rejected == len(rows)


def test_same_seed_same_results() -> None:
    spec = "synthetic:num=300,input=uniform(50,800),output=lognormal(100,0.6),rate=40"
    config = SimConfig(**SMALL, replicas=2, router="least_outstanding_tokens", seed=3)
    a = simulate(config, load_workload(spec, seed=3))
    b = simulate(config, load_workload(spec, seed=3))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.summary == b.summary or pd.Series(a.summary.to_dict()).equals(pd.Series(b.summary.to_dict()))


def test_more_load_means_longer_queues_and_tokens_are_conserved() -> None:
    spec = "synthetic:num=400,input=512,output=128,rate={}"
    config = SimConfig(model="llama-2-7b", hardware="a100-80gb")
    light = simulate(config, load_workload(spec.format(2)))
    heavy = simulate(config, load_workload(spec.format(200)))
    assert heavy.summary.ttft_s.p90 > light.summary.ttft_s.p90
    assert heavy.summary.throughput.output_tokens_per_s > light.summary.throughput.output_tokens_per_s
    for r in (light, heavy):
        assert r.requests["output_tokens"].sum() == 400 * 128


def test_replicas_share_the_load_under_each_router() -> None:
    spec = "synthetic:num=200,input=256,output=64,rate=50"
    for router in ("round_robin", "least_outstanding_tokens", "prefix_affinity"):
        result = simulate(SimConfig(**SMALL, replicas=4, router=router), load_workload(spec))
        counts = result.requests["replica"].value_counts()
        assert len(counts) == 4 and counts.min() >= 20, (router, counts.to_dict())


def test_prefix_affinity_keeps_system_prompts_together_and_hits_the_cache() -> None:
    spec = "synthetic:prefixes=4,prefix_len=1024,users=50,input=64,output=16,rate=20"
    affinity = simulate(SimConfig(**SMALL, replicas=4, router="prefix_affinity"), load_workload(spec))
    spread = simulate(SimConfig(**SMALL, replicas=4, router="round_robin"), load_workload(spec))
    assert affinity.summary.prefix_cache_hit_rate > spread.summary.prefix_cache_hit_rate > 0.5
    off = simulate(SimConfig(**SMALL, replicas=4, enable_prefix_caching=False), load_workload(spec))
    assert off.summary.prefix_cache_hit_rate == 0.0


def test_a_small_kv_cache_preempts_and_still_finishes_everything() -> None:
    config = SimConfig(**SMALL, num_gpu_blocks=200, max_model_len=2048)
    result = simulate(config, load_workload("synthetic:num=60,input=400,output=600,rate=inf"))
    assert result.summary.preemptions > 0
    assert result.summary.num_finished == 60
    assert result.summary.kv_utilization.max > 0.9


def test_static_batching_is_slower_than_continuous_batching() -> None:
    spec = "synthetic:num=200,input=uniform(50,500),output=uniform(10,400),rate=20"
    continuous = simulate(SimConfig(**SMALL, max_num_seqs=32), load_workload(spec))
    static = simulate(SimConfig(**SMALL, max_num_seqs=32, scheduler="static"), load_workload(spec))
    assert static.summary.num_finished == continuous.summary.num_finished == 200
    assert static.summary.e2e_s.mean > continuous.summary.e2e_s.mean
    assert static.summary.throughput.output_tokens_per_s <= continuous.summary.throughput.output_tokens_per_s * 1.0001


def test_tensor_and_pipeline_parallelism_and_quantization_change_the_fleet() -> None:
    spec = "synthetic:num=100,input=1000,output=200,rate=inf"
    base = simulate(SimConfig(model="llama-3.1-70b", hardware="h100-sxm", tp=4), load_workload(spec))
    tp8 = simulate(SimConfig(model="llama-3.1-70b", hardware="h100-sxm", tp=8), load_workload(spec))
    pp2 = simulate(SimConfig(model="llama-3.1-70b", hardware="h100-sxm", tp=4, pp=2), load_workload(spec))
    fp8 = simulate(SimConfig(model="llama-3.1-70b", hardware="h100-sxm", tp=4, quant="fp8"), load_workload(spec))
    assert tp8.summary.duration_s < base.summary.duration_s  # twice the GPUs finish sooner
    assert base.summary.time_split_s.communication > 0
    assert pp2.summary.time_split_s.communication > 0
    assert fp8.memory.num_blocks > base.memory.num_blocks  # lighter weights leave more KV room
    for r in (base, tp8, pp2, fp8):
        assert r.summary.num_finished == 100
    assert tp8.summary.cost.usd_per_hour == pytest.approx(2 * base.summary.cost.usd_per_hour)
    assert pp2.summary.cost.usd_per_hour == pytest.approx(2 * base.summary.cost.usd_per_hour)


def test_summary_has_the_documented_shape_and_valid_values() -> None:
    result = simulate(SimConfig(**SMALL, slo="ttft_p99=2s,tpot_p99=100ms"),
                      load_workload("synthetic:num=100,input=300,output=100,rate=10"))
    s = result.summary
    for key in ("num_requests", "duration_s", "throughput", "ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "slo",
                "kv_utilization", "preemptions", "cost", "goodput", "utilization"):
        assert key in s.to_dict()
    assert set(s.throughput.to_dict()) == {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s"}
    assert set(s.cost.to_dict()) >= {"usd_per_hour", "usd_per_million_output_tokens"}
    assert s.slo.all_met is True and s.slo.requests_within_slo == 1.0
    assert 0 < s.utilization.mfu < 1 and 0 < s.utilization.mbu < 1
    assert s.ttft_s.p50 <= s.ttft_s.p90 <= s.ttft_s.p99
    # ITL from the histogram agrees with the per-request TPOT (they average the same gaps).
    assert s.itl_s.mean == pytest.approx(s.tpot_s.mean, rel=0.05)
    ts = result.timeseries
    assert len(ts) > 10 and ts["kv_utilization"].between(0, 1).all()
    # Tokens in flight: at least one per running request, and never more than the KV cache holds.
    assert (ts["tokens_in_flight"] >= ts["running"]).all()
    assert (ts["tokens_in_flight"] <= result.memory.kv_tokens).all()


def test_memory_plan_names_the_fix_when_the_model_does_not_fit() -> None:
    with pytest.raises(ValueError, match=r"needs 141 GB of weights.*tp>=2"):
        SimConfig(model="llama-3.1-70b", hardware="a100-80gb").check()
    with pytest.raises(ValueError, match="does not divide"):
        SimConfig(model="llama-3.1-8b", hardware="a100-80gb", tp=3).check()
    with pytest.raises(ValueError, match="fp8"):
        SimConfig(model="llama-3.1-8b", hardware="a100-80gb", quant="fp8").check()
    _, _, plan = SimConfig(model="llama-3.1-8b", hardware="h100-sxm").check()
    assert 14 < plan.weight_bytes / 1e9 < 17 and plan.num_blocks > 1000
    _, _, int4 = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", quant="int4").check()
    _, _, kv8 = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", kv_dtype="fp8").check()
    assert int4.num_blocks > plan.num_blocks and kv8.num_blocks > 1.9 * plan.num_blocks
    # Weights that fit with no room for one request's KV: the count and its unit agree.
    with pytest.raises(ValueError, match=r"l40s .*: 0 KV blocks, fewer than the 1 block one 16-token request needs"):
        SimConfig(model="llama-3.1-8b", hardware="l40s", gpu_memory_utilization=0.35,
                  max_num_batched_tokens=8192).check()


@pytest.mark.parametrize("field, value, message", [
    ("router", "random", "router"), ("slo", "ttft_p42=1s", "unknown SLO"), ("tp", 0, "tp"),
    ("gpu_memory_utilization", 1.5, "gpu_memory_utilization"), ("replicas", 0, "replicas")])
def test_bad_config_fields_are_named(field, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**SMALL, **{field: value})


def test_a_million_requests_worth_of_memory_is_only_metric_rows() -> None:
    """Finished requests leave only their row: no Sequence survives the simulation."""
    import gc

    from engine.policy.sequence import Sequence

    simulate(SimConfig(**SMALL), load_workload("synthetic:num=500,input=100,output=20,rate=100"))
    gc.collect()
    assert not any(type(o) is Sequence for o in gc.get_objects())


def test_duration_and_rates_are_consistent() -> None:
    result = simulate(SimConfig(**SMALL), load_workload("synthetic:num=50,input=100,output=10,rate=5"))
    s, df = result.summary, result.requests
    assert s.duration_s == pytest.approx(df["finish_s"].max() - df["arrival_s"].min())
    assert s.throughput.output_tokens_per_s == pytest.approx(500 / s.duration_s)
    assert math.isfinite(s.cost.usd_per_million_output_tokens)


def test_a_finished_run_leaves_its_block_pools_to_reference_counting() -> None:
    """The replicas let go of their schedulers when a run ends, so its KV block pools are freed at
    once instead of waiting, in a cycle with the SimPy environment, for the collector to walk them."""
    import gc

    from engine.policy.block_manager import BlockManager

    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=3)
    gc.collect()
    gc.disable()
    try:
        result = simulate(config, load_workload("synthetic:num=60,input=300,output=20,rate=20", seed=0))
        alive = sum(isinstance(o, BlockManager) for o in gc.get_objects())
    finally:
        gc.enable()
    assert result.summary.num_finished == 60
    assert alive == 0


def test_a_workload_with_every_request_rejected_reports_each_one() -> None:
    """Nothing fits max_model_len: every request is a rejected row with its reason (not a crash on
    the finished rows' missing columns), whichever way the replicas are simulated."""
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=2, max_model_len=256)
    for workers in (1, 2):
        result = simulate(config, load_workload("synthetic:num=12,input=500,output=500,rate=5"), workers=workers)
        assert (result.requests["status"] == "rejected").all() and len(result.requests) == 12
        assert result.requests["reason"].str.contains("exceeds max_model_len=256").all()
        assert result.requests["ttft_s"].isna().all() and result.summary.throughput.requests_per_s == 0.0
