"""Serving-engine profiles: reading them, their all-reduce algorithms, CUDA-graph padding, the
per-request latency, and the intervals from their residuals."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from simulator.catalog.engines import (DEFAULT_GPU_ENGINE, INTERVAL, OWN_ENGINE, Collective, EngineProfile, engine_ids,
                                       load_engine, residual_quantile)
from simulator.cost.model import CostModel
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import step_cost
from simulator.cost.types import Chunk
from simulator.catalog.models import load_model


def engine_model(hardware: str = "h100-sxm", engine: EngineProfile | None = None, max_num_seqs: int = 128,
                 mbt: int = 2048) -> CostModel:
    return CostModel.load(hardware).with_engine(engine or load_engine(DEFAULT_GPU_ENGINE), max_num_seqs, mbt)


def test_catalog_profiles_load_and_round_trip(tmp_path) -> None:
    assert DEFAULT_GPU_ENGINE in engine_ids() and OWN_ENGINE in engine_ids()
    vllm = load_engine(DEFAULT_GPU_ENGINE)
    assert vllm.graph_sizes[:4] == (1, 2, 4, 8) and vllm.custom_all_reduce.max_bytes == 8 << 20
    path = tmp_path / "mine.json"
    vllm.save(path)
    assert load_engine(path=path) == vllm
    assert load_engine(OWN_ENGINE).adds_nothing


@pytest.mark.parametrize("bad, message", [("nope", "unknown engine"), (None, "not an engine profile")])
def test_bad_engines_are_refused_with_the_fix(tmp_path, bad, message) -> None:
    with pytest.raises(ValueError, match=message):
        if bad is None:
            (tmp_path / "e.json").write_text(json.dumps({"id": "x", "nccl": {"base_s": 1}}))
            load_engine(path=tmp_path / "e.json")
        else:
            load_engine(bad)


def test_graph_sizes_follow_the_servers_limits() -> None:
    vllm = load_engine(DEFAULT_GPU_ENGINE)
    assert vllm.graph_sizes_for(128, 8192)[-1] == 256 and vllm.graph_sizes_for(512, 8192)[-1] == 512
    assert vllm.graph_sizes_for(128, 100)[-1] <= 100
    cm = engine_model()
    assert [cm.graph_tokens(t) for t in (1, 3, 9, 250, 256, 257, 2000)] == [1, 4, 16, 256, 256, 257, 2000]


def test_fitted_speeds_move_the_memory_bound_side_only() -> None:
    from simulator.catalog.models import load_model
    from simulator.cost.types import Chunk
    model = load_model("llama-3.1-8b")
    plain = replace(load_engine(DEFAULT_GPU_ENGINE), scales={}, device_scales={})
    fast = replace(plain, device_scales={"h100-sxm": {"gemm": 0.5}})
    gate = lambda e, chunks: step_cost(engine_model(engine=e), ReplicaShape(model, block_size=None),
                                       chunks).by_operator["gate_up_proj"]  # noqa: E731
    decode, prefill = [Chunk(1, 500)] * 8, [Chunk(2048, 2048)]
    assert gate(fast, decode) < 0.8 * gate(plain, decode)  # memory-bound: faster
    assert gate(fast, prefill) == pytest.approx(gate(plain, prefill), rel=0.02)  # compute-bound: as before
    assert engine_model("a100-80gb", fast).scales == {}  # another device keeps its curves


def test_graphed_steps_pay_no_launch_term_and_run_padded() -> None:
    bare, vllm = CostModel.load("h100-sxm"), engine_model()
    assert all(c.t0 == 0 for c in vllm.curves.values()) and any(c.t0 > 0 for c in bare.curves.values())
    from simulator.catalog.models import load_model
    from simulator.cost.types import Chunk
    model = load_model("llama-3.1-8b")
    step = lambda cm, n: step_cost(cm, ReplicaShape(model, block_size=None),
                                   [Chunk(1, 500)] * n).by_operator["gate_up_proj"]  # noqa: E731
    assert step(vllm, 9) == pytest.approx(step(vllm, 16))  # 9 decodes run as the 16-token graph
    assert step(vllm, 9) < step(bare, 9)


def test_custom_all_reduce_on_nvlink_nccl_beyond_it_and_on_pcie() -> None:
    cited = replace(load_engine(DEFAULT_GPU_ENGINE), scales={})  # the algorithms alone, no in-situ speed
    nvlink = engine_model("h100-sxm", cited)
    one_shot = nvlink.predict("all_reduce", 256 << 10, 4).time_s
    two_shot = nvlink.predict("all_reduce", 1 << 20, 4).time_s
    nccl = nvlink.predict("all_reduce", 16 << 20, 4).time_s
    # The cited H100 TP4 latencies the profile was set from: ~10 us (0.5 MB one-shot), ~18 us (1 MB two-shot).
    assert 6e-6 < one_shot < 12e-6 and 14e-6 < two_shot < 22e-6 and nccl > two_shot
    assert nvlink.predict("all_reduce", (512 << 10) - 16, 4).time_s == pytest.approx(10e-6, rel=0.25)
    pcie = engine_model("l40s", cited)  # custom kernel only at world 2 without NVLink
    assert pcie.predict("all_reduce", 256 << 10, 4).time_s > 3 * nvlink.predict("all_reduce", 256 << 10, 4).time_s
    no_custom = engine_model("h100-sxm", replace(cited, custom_all_reduce=None))
    assert no_custom.predict("all_reduce", 256 << 10, 4).time_s > one_shot
    # The engine's algorithms replace the kernel-only model's fitted ring only under an engine.
    assert CostModel.load("h100-sxm").predict("all_reduce", 256 << 10, 4).time_s > 5 * one_shot


def test_request_latency_adds_to_ttft_and_e2e_only() -> None:
    spec = "synthetic:num=40,input=200,output=20,rate=2,arrival=constant"
    base = replace(load_engine(DEFAULT_GPU_ENGINE), request_s=0.0)
    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm")
    runs = [simulate(config, load_workload(spec), engine_model(engine=replace(base, request_s=s), max_num_seqs=256,
                                                               mbt=8192)) for s in (0.0, 0.02)]
    (a, b) = (r.requests.set_index("request_id") for r in runs)
    assert (b["ttft_s"] - a["ttft_s"]).to_numpy() == pytest.approx(0.02)
    assert (b["e2e_s"] - a["e2e_s"]).to_numpy() == pytest.approx(0.02)
    assert (b["tpot_s"] - a["tpot_s"]).abs().max() < 1e-12


def test_intervals_come_from_the_residuals() -> None:
    profile = EngineProfile("x", "", residuals={"ttft_mean": [-0.2, -0.1, 0.0, 0.1, 0.2]})
    lo, hi = profile.interval("ttft_mean", 1.0)
    # rank 0.1 x 6 and 0.9 x 6 of five residuals fall outside them: the interval is their range
    assert lo == pytest.approx(math.exp(-0.2)) and hi == pytest.approx(math.exp(0.2))
    wider = EngineProfile("x", "", residuals={"ttft_mean": [i / 10 for i in range(-9, 10)]})
    assert wider.interval("ttft_mean", 1.0) == pytest.approx((math.exp(-0.8), math.exp(0.8)))
    assert profile.interval("tpot", 1.0) is None
    assert Collective(1e-5, 0.5).per_hop_s == 0.0


def test_an_80_percent_interval_of_few_residuals_covers_80_percent_of_new_ones() -> None:
    rng = np.random.default_rng(0)
    draws = rng.normal(size=(4000, 17))
    covered = [residual_quantile(row[:16], INTERVAL[0]) <= row[16] <= residual_quantile(row[:16], INTERVAL[1])
               for row in draws]
    assert np.mean(covered) == pytest.approx(0.8, abs=0.02)


def test_simulate_defaults_to_vllm_on_catalog_gpus_and_names_it() -> None:
    spec = "synthetic:num=30,input=100,output=10,rate=5"
    default = simulate(SimConfig(model="llama-3.1-8b", hardware="h100-sxm"), load_workload(spec))
    own = simulate(SimConfig(model="llama-3.1-8b", hardware="h100-sxm", engine=OWN_ENGINE), load_workload(spec))
    assert default.summary.cost_model.engine == DEFAULT_GPU_ENGINE
    assert own.summary.cost_model.engine == OWN_ENGINE and own.summary.intervals == {}
    assert default.summary.e2e_s.mean != own.summary.e2e_s.mean


def test_output_delay_adds_a_step_to_ttft_and_e2e_not_to_the_schedule() -> None:
    spec = "synthetic:num=60,input=300,output=40,rate=8,arrival=constant"
    base = replace(load_engine(DEFAULT_GPU_ENGINE), request_s=0.0, output_delay_steps=0.0)
    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm")
    (a, b) = (simulate(config, load_workload(spec), engine_model(engine=replace(base, output_delay_steps=d),
                                                                   max_num_seqs=256, mbt=8192)).requests
              .set_index("request_id") for d in (0.0, 1.0))
    added = b["ttft_s"] - a["ttft_s"]
    assert (added > 0).all() and added.max() < 0.05  # one step, a few ms to tens of ms
    assert (b["first_scheduled_s"] == a["first_scheduled_s"]).all()  # the scheduler did not wait for it
    assert ((b["e2e_s"] - a["e2e_s"]) > 0).all()


def test_a_first_token_waits_on_the_step_after_its_own() -> None:
    # One long prompt alone: its prefill step is many decode steps long; the first token streams
    # with the second, so the delay is a decode step, not the prefill's.
    spec = "synthetic:num=1,input=3000,output=20,rate=1"
    base = replace(load_engine(DEFAULT_GPU_ENGINE), request_s=0.0, output_delay_steps=0.0)
    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm")
    (a, b) = (simulate(config, load_workload(spec), engine_model(engine=replace(base, output_delay_steps=d),
                                                                   max_num_seqs=256, mbt=8192)).requests.iloc[0]
              for d in (0.0, 1.0))
    decode_step = (a["e2e_s"] - a["ttft_s"]) / 19
    assert b["ttft_s"] - a["ttft_s"] == pytest.approx(decode_step, rel=0.02)
    assert a["ttft_s"] > 3 * decode_step


def test_decode_attention_compute_speed_slows_grouped_heads_more() -> None:
    # At a fiftieth of the curve's arithmetic speed, 8 query heads per K/V head turn compute-bound
    # while one per K/V head stays memory-bound.
    vllm = load_engine(DEFAULT_GPU_ENGINE)
    fast, slow = (engine_model(engine=replace(vllm, scales={**vllm.scales, "attention_decode_compute": c}))
                  for c in (1.0, 0.02))
    for heads, kv_heads, slower in ((64, 8, True), (32, 32, False)):
        t = [cm.predict("attention_decode", 64, 2000, heads, kv_heads, 128, "bf16").time_s for cm in (fast, slow)]
        assert (t[1] > 1.5 * t[0]) is slower


def test_a_device_of_the_same_kernels_takes_the_fitted_devices_speeds() -> None:
    from simulator.catalog.engines import load_engine
    from simulator.fleet.costs import EXTRAPOLATED, cost_basis, cost_model_for
    from simulator.fleet.sim_config import SimConfig

    vllm = load_engine("vllm-v0.15")
    assert vllm.transfers["h200"] == "h100-sxm" and "h200" not in vllm.device_scales
    assert vllm.speeds_on("h200") == vllm.speeds_on("h100-sxm") != vllm.speeds_on("a100-80gb")
    h200 = cost_model_for(SimConfig(model="llama-3.1-8b", hardware="h200"))
    assert h200.scales["gemm"] == vllm.device_scales["h100-sxm"]["gemm"]
    assert cost_basis(SimConfig(model="llama-3.1-8b", hardware="h200")) == EXTRAPOLATED  # still no run behind it


def test_a_device_of_other_kernels_takes_the_fitted_speeds_times_published_ratios() -> None:
    from simulator.catalog.engines import load_engine

    vllm = load_engine("vllm-v0.15")
    ratio, h100 = vllm.scaled_devices["mi300x"], vllm.speeds_on("h100-sxm")
    mi300x = vllm.speeds_on("mi300x")
    assert mi300x["gemm"] == pytest.approx(h100["gemm"] / ratio["bandwidth"])  # divides the bandwidth seen
    assert mi300x["gemm_compute"] == pytest.approx(ratio["compute"]) and mi300x["all_reduce"] == h100["all_reduce"]
    # A compute-bound prefill slows by about the compute ratio.
    plain, engine = CostModel.load("mi300x"), CostModel.load("mi300x").with_engine(vllm, 128, 8192)
    spec = ReplicaShape(load_model("llama-3.1-8b"))
    prefill = step_cost(engine, spec, [Chunk(4096, 4096)]).by_operator
    raw = step_cost(plain, spec, [Chunk(4096, 4096)]).by_operator
    gemms = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    assert gemms and all(prefill[g] > 1.5 * raw[g] for g in gemms)
    assert "curves at catalog peaks" not in " ".join(
        simulate(SimConfig(model="llama-3.1-8b", hardware="mi300x"), load_workload("synthetic:num=5,input=100,output=5,rate=1"))
        .summary.extrapolated_across)


def test_gemm_floors_set_a_small_gemms_time_not_a_large_ones() -> None:
    model = load_model("gpt-oss-120b")
    plain = replace(load_engine(DEFAULT_GPU_ENGINE), scales={}, device_scales={})
    low = replace(plain, device_scales={"h100-sxm": {"gemm_floor": 0.5}})
    op = lambda e, shape, chunks, name: step_cost(engine_model(engine=e), shape,  # noqa: E731
                                                  chunks).by_operator[name]
    moe, dense = ReplicaShape(model, tp=8, weight_dtype="mxfp4"), ReplicaShape(load_model("llama-3.1-70b"))
    decode = [Chunk(1, 1000)] * 4
    for name in ("qkv_proj", "moe_experts"):  # a few rows: the GEMMs' floors are most of their time
        assert op(low, moe, decode, name) < 0.8 * op(plain, moe, decode, name)
    assert op(low, moe, decode, "rms_norm") == op(plain, moe, decode, "rms_norm")  # other kernels keep theirs
    long = [Chunk(8192, 8192)]  # GEMMs of milliseconds: their floors hardly show
    assert op(low, dense, long, "qkv_proj") == pytest.approx(op(plain, dense, long, "qkv_proj"), rel=0.05)
    # A device scaled from the fitted one (other kernels, no runs) keeps its floors.
    scaled = replace(low, scaled_devices={"mi300x": {"from": "h100-sxm", "bandwidth": 1.0, "compute": 1.0}})
    assert scaled.speeds_on("mi300x")["gemm_floor"] == 0.5
