"""Mixture-of-experts step costs: expected expert load, the read-all-experts / compute-bound regimes,
expert parallelism and routing skew, memory of all experts, profiled expert points."""

from __future__ import annotations

import pytest

from calibrate.fitting.device import load_cost_model
from simulator.catalog import load_model
from simulator.cost.model import CostModel
from simulator.cost.recipe import StepRecipe
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import StepTimer, step_cost
from simulator.cost.types import Chunk
from simulator.cost.moe import expert_shares, placement, step_load
from simulator.cost.memory import weight_bytes_per_gpu
from simulator.cost.profile_format import Measurement, Profile
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload


def test_uniform_routing_spreads_every_pick_and_touches_experts_as_expected() -> None:
    for tokens in (1, 3, 16, 500):
        load = step_load(tokens, 8, 2)
        assert load.rows == pytest.approx(2 * tokens)
        assert load.active_experts == pytest.approx(8 * (1 - (1 - 2 / 8) ** tokens))
        assert load.active_experts <= min(8, 2 * tokens) + 1e-9
    assert step_load(1, 8, 2).active_experts == pytest.approx(2.0)  # one token: exactly its k experts
    assert step_load(10_000, 8, 2).active_experts == pytest.approx(8.0)


def test_skew_loads_the_hottest_rank_more() -> None:
    assert sum(expert_shares(16, 1.2)) == pytest.approx(1.0)
    assert sorted(sum(placement(16, 4), [])) == list(range(16))
    even, skewed = step_load(256, 16, 2, 0.0, ranks=4), step_load(256, 16, 2, 1.2, ranks=4)
    assert even.rows == pytest.approx(256 * 2 / 4)
    assert skewed.rows > even.rows


def moe_layer_time(cost_model: CostModel, model, tokens: int, **kwargs) -> float:
    """One MoE layer's routed experts (the recipe's moe_experts operator, once)."""
    recipe = StepRecipe.of(model, kwargs.pop("tp", 1), "bf16", **kwargs)
    op = next(op for op in recipe.token_ops if op.name == "moe_experts")
    return cost_model.source(op.kind, op.shape).time(tokens)


def test_few_tokens_read_few_experts_and_many_tokens_amortize_them() -> None:
    cm = CostModel.load("h100-sxm")
    mixtral = load_model("mixtral-8x7b")
    one, four, many = (moe_layer_time(cm, mixtral, t) for t in (1, 4, 2048))
    # One token reads 2 experts' weights; four tokens touch ~5.4 of 8: memory-bound, so the time
    # grows with the experts touched, far less than with the tokens.
    assert 1.5 < four / one < 5.4 / 2 + 0.5
    # Many tokens: every expert is touched and compute dominates; per token far cheaper.
    assert many / 2048 < one / 20


def test_expert_parallel_adds_all_to_all_and_skew_slows_it() -> None:
    cm = CostModel.load("h100-sxm")
    mixtral = load_model("mixtral-8x7b")
    step = [Chunk(512, 512)]
    plain = step_cost(cm, ReplicaShape(mixtral, tp=4), step)
    ep = step_cost(cm, ReplicaShape(mixtral, tp=4, expert_parallel=True), step)
    skewed = step_cost(cm, ReplicaShape(mixtral, tp=4, expert_parallel=True, routing_skew=1.5), step)
    assert "all_to_all" in ep.by_operator and "all_to_all" not in plain.by_operator
    assert skewed.by_operator["moe_experts"] > ep.by_operator["moe_experts"]


def test_memory_counts_every_expert() -> None:
    mixtral = load_model("mixtral-8x7b")
    assert weight_bytes_per_gpu(mixtral, "bf16", 2, 1) == pytest.approx(46.7e9 * 2 / 2, rel=0.01)


def test_profiled_expert_points_are_used_and_interpolated_between_expert_counts() -> None:
    profile = Profile("a100-80gb", {"device_name": "test"}, {}, "test")
    for active, base in ((1, 100e-6), (4, 400e-6)):
        for rows, extra in ((1, 0.0), (16, 50e-6)):
            profile.measurements.append(Measurement.make("moe_experts", base + active * extra, rows=rows, active=active,
                                                         hidden=64, ffn=96, dtype="bf16"))
    cm = load_cost_model("a100-80gb", profile=profile)
    at_one = cm.predict("moe_experts", 1, 1, 64, 96, "bf16")
    assert at_one.time_s == pytest.approx(100e-6) and at_one.provenance == "measured"
    between = cm.predict("moe_experts", 1, 2.5, 64, 96, "bf16")
    assert between.time_s == pytest.approx(250e-6)
    other_shape = cm.predict("moe_experts", 1, 2, 64, 128, "bf16")
    assert other_shape.provenance == "extrapolated"


def test_moe_models_simulate_and_bad_expert_parallel_configs_are_refused() -> None:
    workload = load_workload("synthetic:num=60,input=uniform(50,400),output=uniform(20,120),rate=10", seed=0)
    for model in ("mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite", "llama-4-scout"):
        tp = 4 if model == "llama-4-scout" else 2
        result = simulate(SimConfig(model=model, hardware="h100-sxm", tp=tp, expert_parallel=True), workload)
        assert result.summary.num_finished == 60
        assert result.summary.time_split_s.communication > 0
    with pytest.raises(ValueError, match="is dense"):
        SimConfig(model="llama-3.1-8b", hardware="h100-sxm", tp=2, expert_parallel=True).check()
    with pytest.raises(ValueError, match="cannot split qwen1.5-moe-a2.7b's 60 experts evenly"):
        SimConfig(model="qwen1.5-moe-a2.7b", hardware="h100-sxm", tp=8, expert_parallel=True).check()


def test_a_step_reads_the_experts_it_touches() -> None:
    mixtral = load_model("mixtral-8x7b")
    timer = StepTimer(CostModel.load("h100-sxm"), ReplicaShape(mixtral))
    per_expert = 3 * 4096 * 14336 * 2 * 32  # bf16 bytes of one expert in every layer
    one, many = timer.weight_bytes(1), timer.weight_bytes(4096)
    assert many - one == pytest.approx(6 * per_expert, rel=1e-6)  # 2 experts per layer -> all 8
    dense = StepTimer(CostModel.load("h100-sxm"), ReplicaShape(load_model("llama-3.1-8b")))
    assert dense.weight_bytes(1) == dense.weight_bytes(4096)


def test_gpt_oss_interleaves_sliding_layers_and_mxfp4_weighs_the_checkpoint() -> None:
    from simulator.cost.memory import kv_bytes_per_token, plan_memory, weight_bytes_per_gpu
    from simulator.catalog.hardware import get_accelerator

    small, large = load_model("gpt-oss-20b"), load_model("gpt-oss-120b")
    assert (small.sliding_window, small.num_sliding_layers, small.attention_sinks) == (128, 12, True)
    assert small.hybrid_attention and (large.num_experts, large.experts_per_token) == (128, 4)
    # MXFP4 experts (4.25 bits, hidden size padded to 3,072 as vLLM's kernels store it), every other weight
    # bf16: what vLLM logs loading ("Model loading took"), 64.38 GiB on H100 and 13.72 GiB on A100.
    assert weight_bytes_per_gpu(large, "mxfp4", 1, 1) / 2**30 == pytest.approx(64.38, rel=0.01)
    assert weight_bytes_per_gpu(small, "mxfp4", 1, 1) / 2**30 == pytest.approx(13.72, rel=0.03)
    # A token's blocks hold the 12 full-attention layers; the sliding ones keep a window per sequence.
    kw = dict(tp=1, pp=1, weight_precision="mxfp4", kv_dtype="bf16", gpu_memory_utilization=0.9, block_size=16,
              max_num_batched_tokens=8192, max_model_len=None)
    few, many = (plan_memory(small, get_accelerator("h100-sxm"), max_num_seqs=n, **kw) for n in (16, 256))
    assert few.kv_bytes_per_token == kv_bytes_per_token(small, "bf16", 1, 1) / 2
    window = kv_bytes_per_token(small, "bf16", 1, 1, 12) * (128 // 16 + 1) * 16
    assert few.reserve_bytes - many.reserve_bytes == pytest.approx(-(256 - 16) * window)


def test_sliding_layers_attend_their_window_only() -> None:
    from simulator.cost.shape import ReplicaShape
    from simulator.cost.step_timer import StepTimer
    from simulator.fleet.costs import cost_model_for
    from simulator.fleet.sim_config import SimConfig

    gpt = load_model("gpt-oss-20b")
    full = gpt.model_copy(update={"sliding_window": None, "num_sliding_layers": 0})
    cost = cost_model_for(SimConfig(model="gpt-oss-20b", hardware="h100-sxm"))
    sliding, plain = StepTimer(cost, ReplicaShape(gpt)), StepTimer(cost, ReplicaShape(full))
    assert sliding.decode_attention(8, 8 * 100) == pytest.approx(plain.decode_attention(8, 8 * 100))  # inside it
    assert sliding.decode_attention(8, 8 * 8000) < 0.6 * plain.decode_attention(8, 8 * 8000)  # half the layers local
    assert sliding.prefill_attention(512, 8000) < plain.prefill_attention(512, 8000)


def test_fp4_formats_need_their_kernels() -> None:
    from simulator.fleet.sim_config import SimConfig

    with pytest.raises(ValueError, match="nvfp4 weights need FP4 tensor cores"):
        SimConfig(model="llama-3.1-8b", hardware="h100-sxm", quant="nvfp4").check()
    with pytest.raises(ValueError, match="quantizes a MoE model's experts"):
        SimConfig(model="llama-3.1-8b", hardware="h100-sxm", quant="mxfp4").check()
    _, _, plan = SimConfig(model="llama-3.1-8b", hardware="b200", quant="nvfp4").check()
    assert plan.weight_bytes / 1e9 < 0.4 * SimConfig(model="llama-3.1-8b", hardware="b200").check()[2].weight_bytes / 1e9
