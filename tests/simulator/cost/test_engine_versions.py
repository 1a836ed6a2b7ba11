"""Engine profiles per version and engine: inheritance, release aliases, the launcher's default
limits per GPU class, synchronous host work, SGLang's prefill-first steps, and the intervals of a
profile that has no runs of its own."""

from __future__ import annotations

import math

import pytest

from simulator.catalog.engine_defaults import PLAIN, defaults_for
from simulator.catalog.engines import load_engine
from simulator.catalog.hardware import get_accelerator
from simulator.cost.model import CostModel
from simulator.fleet.extrapolation import extrapolation
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload

SPEC = "synthetic:num=40,input=uniform(200,800),output=uniform(40,120),rate=6,seed=2"


def test_a_profile_inherits_its_parents_fitted_terms_and_says_so() -> None:
    base, old = load_engine("vllm-v0.15"), load_engine("vllm-v0.12")
    assert old.scales == base.scales and old.framework == base.framework and old.residuals == base.residuals
    assert old.transferred_from == "vllm-v0.15" and base.transferred_from == ""
    assert not old.async_scheduling and old.host_not_overlapped and base.async_scheduling
    assert "host_not_overlapped" in old.sources and "graph_sizes" in old.sources  # own sources beside the parent's
    assert old.extrapolation["fitted"] == base.extrapolation["fitted"]
    assert old.extrapolation["widen"]["engine"] > base.extrapolation["widen"]["engine"]


@pytest.mark.parametrize("name, profile, transferred", [
    ("vllm-v0.15.1", "vllm-v0.15", ""), ("vllm-v0.18", "vllm-v0.15", "vllm-v0.15"),
    ("vllm-v0.13", "vllm-v0.12", "vllm-v0.15"), ("vllm-v0.40.2", "vllm-v0.34", "vllm-v0.15"),
    ("sglang-0.5.6", "sglang-0.5", "vllm-v0.15")])
def test_a_release_takes_the_profile_that_spans_it(name, profile, transferred) -> None:
    got, spanning = load_engine(name), load_engine(profile)
    assert got.id == name and got.transferred_from == transferred
    assert (got.async_scheduling, got.scheduler_policy, got.limits) == (
        spanning.async_scheduling, spanning.scheduler_policy, spanning.limits)


def test_a_release_no_profile_spans_is_refused_with_the_spans() -> None:
    with pytest.raises(ValueError, match=r"unknown engine 'vllm-v0.9'.*vllm-v0.12 0.12-0.13.*vllm-v0.34 0.34-\.\.\."):
        load_engine("vllm-v0.9")


@pytest.mark.parametrize("engine, hardware, seqs, tokens", [
    ("vllm-v0.15", "h100-sxm", 1024, 8192), ("vllm-v0.15", "a100-80gb", 256, 2048),
    ("vllm-v0.15", "l40s", 256, 2048), ("vllm-v0.15", "b200", 1024, 8192), ("vllm-v0.34", "b200", 1024, 16384),
    ("vllm-v0.34", "h100-sxm", 1024, 8192), ("sglang-0.5", "h100-sxm", 2048, 8192),
    ("sglang-0.5", "b200", 2048, 16384), ("sglang-0.5", "l40s", 2048, 4096)])
def test_unset_limits_take_the_engines_defaults_for_the_gpu(engine, hardware, seqs, tokens) -> None:
    config = SimConfig(model="llama-3.1-8b", hardware=hardware, engine=engine)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (seqs, tokens)
    assert config.gpu_memory_utilization == defaults_for(load_engine(engine).limits, get_accelerator(hardware))[
        "gpu_memory_utilization"]


def test_a_limit_given_wins_and_the_own_engine_keeps_the_plain_defaults() -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", max_num_seqs=64, gpu_memory_utilization=0.8)
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.gpu_memory_utilization) == (64, 8192, 0.8)
    own = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", engine="servecast")
    assert (own.max_num_seqs, own.max_num_batched_tokens) == (PLAIN["max_num_seqs"], PLAIN["max_num_batched_tokens"])


def test_a_prefill_pool_on_another_gpu_takes_that_gpus_defaults_unless_given() -> None:
    split = dict(model="llama-3.1-8b", hardware="h100-sxm", disaggregate="1:1", prefill_hardware="a100-80gb")
    prefill, decode = SimConfig(**split).pool_configs()
    assert (prefill.max_num_batched_tokens, decode.max_num_batched_tokens) == (2048, 8192)
    prefill, decode = SimConfig(**split, max_num_batched_tokens=4096).pool_configs()
    assert prefill.max_num_batched_tokens == decode.max_num_batched_tokens == 4096


def test_synchronous_scheduling_pays_host_time_per_running_request() -> None:
    sync, asyn = (CostModel.load("h100-sxm").with_engine(load_engine(e), 256, 8192) for e in ("vllm-v0.12", "vllm-v0.15"))
    per_request = load_engine("vllm-v0.12").host_not_overlapped["step_per_chunk_s"]
    assert sync.framework["step_per_chunk_s"] == pytest.approx(asyn.framework["step_per_chunk_s"] + per_request)
    config = dict(model="llama-3.1-8b", hardware="h100-sxm", max_num_seqs=256, max_num_batched_tokens=8192)
    old = simulate(SimConfig(**config, engine="vllm-v0.12"), load_workload(SPEC)).summary
    new = simulate(SimConfig(**config, engine="vllm-v0.15"), load_workload(SPEC)).summary
    assert old.tpot_s.mean > new.tpot_s.mean


def test_sglang_graphs_decode_batches_up_to_its_limit() -> None:
    engine = load_engine("sglang-0.5")
    tp1 = CostModel.load("h100-sxm").with_engine(engine, 2048, 8192, tp=1).graph_sizes
    tp4 = CostModel.load("h100-sxm").with_engine(engine, 2048, 8192, tp=4).graph_sizes
    assert tp1[-1] == 256 and tp4[-1] == 512


def test_sglang_runs_prompts_before_decodes_in_the_simulator() -> None:
    config = dict(model="llama-3.1-8b", hardware="h100-sxm", max_num_seqs=64, max_num_batched_tokens=2048)
    sglang = simulate(SimConfig(**config, engine="sglang-0.5"), load_workload(SPEC))
    vllm = simulate(SimConfig(**config, engine="vllm-v0.15"), load_workload(SPEC))
    assert sglang.summary.num_finished == vllm.summary.num_finished == 40
    # Prompts go first under prefill-first: first tokens come no later, and decodes wait for them.
    assert sglang.summary.ttft_s.mean <= vllm.summary.ttft_s.mean * 1.02
    assert sglang.summary.tpot_s.mean > vllm.summary.tpot_s.mean


def test_a_profile_without_runs_of_its_own_widens_its_intervals_and_names_why() -> None:
    base, old = load_engine("vllm-v0.15"), load_engine("vllm-v0.12")
    crossed = extrapolation(old, "llama-3.1-70b", "h100-sxm", 4, False)
    assert any("vllm-v0.12" in words and "vllm-v0.15" in words for words in crossed.across)
    assert crossed.factor("tpot") == pytest.approx(old.extrapolation["widen"]["engine"])
    assert extrapolation(base, "llama-3.1-70b", "h100-sxm", 4, False).across == ()
    summary = simulate(SimConfig(model="llama-3.1-70b", hardware="h100-sxm", tp=4, engine="vllm-v0.18"),
                       load_workload(SPEC)).summary
    assert any("vllm-v0.18" in words for words in summary.extrapolated_across)
    low, high = summary.intervals["tpot_s.mean"]
    low0, high0 = base.interval("tpot", summary.tpot_s.mean)
    assert math.log(high / low) > math.log(high0 / low0)
