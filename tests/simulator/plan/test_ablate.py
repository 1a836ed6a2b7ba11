"""The technique ladder (simulator/plan/ablate.py): each rung the one before plus one change, and
the gains that must hold where they must."""

from __future__ import annotations

import pytest

from simulator.fleet.sim_config import SimConfig, parse_slos
from simulator.plan.ablate import ablate, at_once, base_tp, ladder, serving_length, weight_quant
from simulator.plan.capacity import PlanSpec
from simulator.workload.load import load_workload

SPEC = "synthetic:num=120,input=uniform(100,1500),output=uniform(20,300),rate=6,prefixes=4,prefix_len=400"


def test_each_rung_adds_one_technique_to_the_one_before() -> None:
    rungs = ladder("llama-2-70b", "a100-80gb")
    assert [r.label for r in rungs] == ["static batching", "continuous batching", "paged KV", "prefix caching",
                                        "chunked prefill", "speculative decoding", "weight quantization",
                                        "KV quantization", "tensor parallelism"]
    static, contiguous, paged, prefix, chunked, spec, quant, kv, tp = rungs
    assert static.knobs["scheduler"] == "static" and "scheduler" not in contiguous.knobs
    # Reserved whole: as many requests as the cache holds of max_model_len (4096 for Llama-2).
    _, _, memory = SimConfig(model="llama-2-70b", hardware="a100-80gb", tp=static.candidate.tp).check()
    assert contiguous.knobs["max_num_seqs"] == memory.kv_tokens // 4096
    assert "max_num_seqs" not in paged.knobs and not paged.knobs["enable_prefix_caching"]
    assert "enable_prefix_caching" not in prefix.knobs and not prefix.knobs["enable_chunked_prefill"]
    assert chunked.knobs == {} and chunked.candidate == prefix.candidate
    assert spec.candidate.speculative == "ngram" and spec.knobs == chunked.knobs
    assert quant.candidate.quant == "int8" == weight_quant("a100-80gb") and weight_quant("h100-sxm") == "fp8"
    assert kv.knobs["kv_dtype"] == "fp8" and kv.candidate == quant.candidate
    assert tp.candidate.tp == 2 * quant.candidate.tp == 4  # bf16 70B needs two A100s; the last rung doubles it
    assert base_tp("llama-3.1-8b", "a100-80gb", {}) == 1


def test_the_gains_that_must_hold_do() -> None:
    workload = load_workload(SPEC, seed=1)
    spec = PlanSpec("llama-3.1-8b", workload, parse_slos("ttft_p99=2s,tpot_p99=100ms"), min_requests=120,
                    min_duration_s=20.0)
    max_len = serving_length(workload, 131072)
    assert max_len % 1024 == 0 and max_len - 1024 < max(r.prompt_tokens + r.output_tokens for r in workload) <= max_len
    rows = {r.rung.label: r for r in ablate(spec, ladder("llama-3.1-8b", "a100-80gb", {"max_model_len": max_len}))}
    peak = {k: r.peak_output_tokens_per_s_per_gpu for k, r in rows.items()}
    gpus = {k: r.plan.gpus for k, r in rows.items()}
    assert all(r.plan.feasible for r in rows.values())
    # Admitting at every step, then without reserving max_model_len per request, never serves less.
    assert peak["static batching"] < peak["continuous batching"] <= peak["paged KV"]
    assert gpus["static batching"] >= gpus["continuous batching"] >= gpus["paged KV"]
    # The same fleet with prefix hits computes less: its first tokens come no later at the same size.
    assert rows["prefix caching"].plan.ttft_p99_s <= rows["paged KV"].plan.ttft_p99_s or \
        gpus["prefix caching"] < gpus["paged KV"]
    assert all(r.plan.usd_per_million_output_tokens > 0 for r in rows.values())


def test_every_request_at_once_keeps_the_requests() -> None:
    workload = load_workload(SPEC, seed=1)
    burst = at_once(workload)
    assert len(burst) == len(workload) and {r.arrival_s for r in burst} == {0.0}
    assert [r.prompt_tokens for r in burst] == [r.prompt_tokens for r in workload]


def test_a_model_too_big_for_eight_gpus_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="does not fit on 8 x l4"):
        ladder("llama-2-70b", "l4")


def test_a_published_preset_sets_the_speculation_rungs_acceptance_and_drafts() -> None:
    rungs = ladder("llama-3.1-8b", "a100-80gb", {"max_model_len": 2048}, acceptance_preset="vllm-mtp-k8-gsm8k")
    spec, quant = rungs[5], rungs[6]
    assert spec.candidate.num_speculative_tokens == 8 and spec.candidate.acceptance is None
    assert spec.knobs["acceptance_preset"] == quant.knobs["acceptance_preset"] == "vllm-mtp-k8-gsm8k"
    assert "vllm-project/vllm PR #48892" in spec.change and "acceptance_preset" not in rungs[4].knobs
    config = PlanSpec("llama-3.1-8b", load_workload(SPEC, seed=1), {}, knobs=spec.knobs).config(spec.candidate, 1)
    assert config.acceptance_preset == "vllm-mtp-k8-gsm8k" and config.acceptance is None
    with pytest.raises(ValueError, match="unknown acceptance preset"):
        ladder("llama-3.1-8b", "a100-80gb", acceptance_preset="nope")
