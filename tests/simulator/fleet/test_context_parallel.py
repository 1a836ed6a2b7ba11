"""Context parallelism in the fleet: the same results at cp=1, lower TTFT for long prompts, a
ring that costs more on a slower link, cp times the KV tokens, GPUs and price, errors that name the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from simulator.cost.model import CostModel
from simulator.cost.step_timer import StepTimer
from simulator.fleet.costs import cost_model_for
from simulator.fleet.fleet import replica_shape
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload

LONG = "synthetic:num=6,input=48000,output=16,rate=0.05"  # 48k-token prompts, one at a time
SHORT = "synthetic:num=60,input=uniform(20,2000),output=uniform(2,200),rate=20"


def config(**fields) -> SimConfig:
    return SimConfig(**{"model": "llama-3.1-8b", "hardware": "h100-sxm", **fields})


def test_cp1_reproduces_the_summary_without_the_field_and_the_plain_step_timer() -> None:
    workload = load_workload(SHORT, seed=2)
    without = simulate(config(kv_offload_gb=16), workload).summary.to_dict()
    with_cp1 = simulate(config(kv_offload_gb=16, cp=1), workload).summary.to_dict()
    base = config(kv_offload_gb=16)
    cost_model = cost_model_for(base)
    timer = StepTimer(cost_model, replica_shape(base, base.model_spec()))
    plain = simulate(base, workload, cost_model, timer=timer).summary.to_dict()
    assert with_cp1 == without == plain and without["cp"] == 1


def test_a_long_prompt_gets_its_first_token_sooner_at_cp2() -> None:
    workload = load_workload(LONG)
    one, two = (simulate(config(cp=cp), workload).summary for cp in (1, 2))
    assert two.ttft_s.p50 < 0.7 * one.ttft_s.p50
    assert two.cp == 2 and one.time_split_s.communication == 0 < two.time_split_s.communication


def test_the_ring_costs_more_on_a_slower_link() -> None:
    workload = load_workload(LONG)
    plain = CostModel.load("h100-sxm")
    slow = plain.with_collective({**plain.collective, "link_efficiency": plain.collective["link_efficiency"] / 200})
    fast, crawl = simulate(config(cp=2), workload).summary, simulate(config(cp=2), workload, slow).summary
    assert crawl.time_split_s.communication > 10 * fast.time_split_s.communication
    assert crawl.ttft_s.p50 > fast.ttft_s.p50


def test_cp2_holds_twice_the_kv_tokens_on_twice_the_gpus_at_twice_the_price() -> None:
    one, two = config(num_gpu_blocks=2000), config(num_gpu_blocks=2000, cp=2)
    (_, _, p1), (_, _, p2) = one.check(), two.check()
    assert p2.kv_tokens == 2 * p1.kv_tokens == 2 * 2000 * 16 and p2.scheduled_block_size == 32
    assert (two.num_gpus, two.usd_per_hour()) == (2 * one.num_gpus, 2 * one.usd_per_hour())
    planned = config(cp=2).check()[2]  # memory planned: a rank's blocks, cp x its tokens
    assert planned.kv_tokens == 2 * planned.num_blocks * 16 > 1.9 * config().check()[2].kv_tokens
    # A 48k-token prompt does not fit 2000 blocks of 16 tokens; it fits 2000 virtual blocks of 32.
    workload = load_workload("synthetic:num=2,input=48000,output=8,rate=1")
    s1, s2 = simulate(one, workload).summary, simulate(two, workload).summary
    assert s1.num_rejected == 2 and s2.num_finished == 2
    assert s2.cost.usd_per_hour == 2 * s1.cost.usd_per_hour and s2.memory.kv_tokens == 64000


def test_bad_settings_are_named_with_their_fix() -> None:
    with pytest.raises(ValidationError, match="cp"):
        config(cp=0)
    with pytest.raises(ValidationError, match="use pp=1 or cp=1"):
        config(cp=2, pp=2)
    with pytest.raises(ValidationError, match="speculative=ngram or cp=1"):
        config(cp=2, speculative="draft", num_speculative_tokens=2, acceptance=0.5, draft_model="llama-3.1-8b")
    with pytest.raises(ValidationError, match="give disaggregate=P:D too"):
        config(prefill_cp=2)
    with pytest.raises(ValueError, match="a larger tp, pp or cp"):
        config(max_model_len=131072, hardware="l4").check()


def test_a_prefill_pool_of_its_own_cp_serves_long_prompts_sooner_and_sends_half_per_gpu() -> None:
    workload = load_workload(LONG)
    plain = simulate(config(disaggregate="1:1"), workload).summary
    split = simulate(config(disaggregate="1:1", prefill_cp=2), workload).summary
    pools = split.disaggregation
    assert (pools.prefill.cp, pools.prefill.gpus, pools.decode.cp, pools.decode.gpus) == \
        (2, 2, 1, 1)
    assert split.ttft_s.p50 < 0.7 * plain.ttft_s.p50
    transfer, half = plain.disaggregation.transfer, pools.transfer
    latency = transfer.latency_s
    assert half.mean_s - latency == pytest.approx((transfer.mean_s - latency) / 2, rel=1e-3)
