"""The cost model: interpolation of profiles, monotonicity, roofline bounds, provenance, step times."""

from __future__ import annotations

import json

import pytest

from calibrate.fitting.device import load_cost_model
from simulator.catalog import get_accelerator, load_hardware, load_model
from simulator.cost.model import CostModel
from simulator.cost.types import Chunk
from simulator.cost.efficiency import gemm_work
from simulator.cost.profile_format import Measurement, Profile
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import step_cost


def gemm_profile(hardware: str = "a100-80gb") -> Profile:
    profile = Profile(hardware, {"device_name": "test"}, {}, "test")
    for m, t in [(1, 10e-6), (16, 12e-6), (64, 20e-6), (256, 60e-6), (1024, 220e-6)]:
        profile.measurements.append(Measurement.make("gemm", t, name="qkv_proj", m=m, n=4096, k=4096, dtype="fp16"))
    return profile


def test_interpolation_reproduces_profiled_points_and_says_so() -> None:
    model = load_cost_model("a100-80gb", profile=gemm_profile())
    for m in gemm_profile().of("gemm"):
        p = model.predict("gemm", m.get("m"), 4096, 4096, "fp16")
        assert p.time_s == pytest.approx(m.time_s) and p.provenance == "measured"
    between = model.predict("gemm", 128, 4096, 4096, "fp16")
    assert 20e-6 < between.time_s < 60e-6 and between.provenance == "interpolated"
    beyond = model.predict("gemm", 2048, 4096, 4096, "fp16")
    assert beyond.time_s == pytest.approx(440e-6)  # proportional to size past the grid
    other_shape = model.predict("gemm", 128, 1024, 4096, "fp16")
    assert other_shape.provenance == "fitted"


def test_non_monotone_measurements_still_give_monotone_predictions() -> None:
    profile = gemm_profile()
    profile.measurements.append(Measurement.make("gemm", 15e-6, m=128, n=4096, k=4096, dtype="fp16"))  # a dip
    model = load_cost_model("a100-80gb", profile=profile)
    times = [model.predict("gemm", m, 4096, 4096, "fp16").time_s for m in range(1, 3000, 7)]
    assert all(a <= b for a, b in zip(times, times[1:]))


@pytest.mark.parametrize("hardware", sorted(h for h, a in load_hardware().items() if not a.profiled))
def test_predictions_are_monotone_and_never_beat_the_roofline(hardware: str) -> None:
    model = CostModel.load(hardware)
    acc = get_accelerator(hardware)
    dtype = "bf16"
    for n, k in [(4096, 4096), (12288, 4096), (128256, 8192), (1024, 128)]:
        previous = 0.0
        for m in [1, 2, 8, 32, 128, 512, 2048, 8192, 32768]:
            t = model.predict("gemm", m, n, k, dtype).time_s
            flops, nbytes = gemm_work(m, n, k, dtype)
            assert t >= max(flops / acc.peak_flops(dtype), nbytes / acc.memory_bandwidth)
            assert t >= previous
            previous = t
    previous = 0.0
    for kv in [16, 128, 1024, 8192]:
        t = model.predict("attention_decode", 8, kv, 32, 8, 128, dtype).time_s
        assert t >= previous
        previous = t
    assert (model.predict("attention_prefill", 512, 512, 32, 8, 128, dtype).time_s
            < model.predict("attention_prefill", 512, 4096, 32, 8, 128, dtype).time_s)


def test_decode_attention_accepts_one_length_per_sequence() -> None:
    model = CostModel.load("h100-sxm")
    assert model.predict("attention_decode", 3, [100, 200, 300], 32, 8, 128, "bf16").time_s == pytest.approx(
        model.predict("attention_decode", 3, 200, 32, 8, 128, "bf16").time_s)
    with pytest.raises(ValueError, match="3 context lengths for a batch of 2"):
        model.predict("attention_decode", 2, [1, 2, 3], 32, 8, 128, "bf16").time_s


def test_faster_hardware_predicts_faster_steps() -> None:
    spec = load_model("llama-2-7b")
    prefill = [Chunk(1024, 1024)]
    decode = [Chunk(1, 2048)] * 32
    for chunks in (prefill, decode):
        times = {h: step_cost(CostModel.load(h), ReplicaShape(spec, block_size=None),
                              chunks).total_s for h in ("l4", "a100-80gb", "h100-sxm", "b200")}
        assert times["l4"] > times["a100-80gb"] > times["h100-sxm"] > times["b200"]
    # Decode is bandwidth-bound: H200 (4.8 TB/s) beats H100 (3.35 TB/s) at the same compute peak.
    shape = ReplicaShape(spec, block_size=None)
    assert step_cost(CostModel.load("h200"), shape, decode).total_s < step_cost(CostModel.load("h100-sxm"), shape,
                                                                                 decode).total_s


def test_step_time_tensor_parallel_and_breakdown() -> None:
    spec = load_model("llama-2-70b")
    model = CostModel.load("h100-sxm")
    chunks = [Chunk(512, 512), Chunk(1, 700, True), Chunk(1, 900, True)]
    tp1 = step_cost(model, ReplicaShape(spec, tp=1, block_size=None), chunks)
    tp4 = step_cost(model, ReplicaShape(spec, tp=4, block_size=None), chunks)
    assert tp4.total_s < tp1.total_s and "all_reduce" in tp4.by_operator and "all_reduce" not in tp1.by_operator
    assert tp1.total_s == pytest.approx(sum(tp1.by_operator.values()))
    assert set(tp1.provenance.values()) == {"extrapolated"}
    assert step_cost(model, ReplicaShape(spec, block_size=None), []).total_s == 0.0


def test_profiled_device_needs_its_profile() -> None:
    with pytest.raises(ValueError, match="pass its profile"):
        CostModel.load("cpu-local")
    with pytest.raises(ValueError, match="the profile is of 'a100-80gb'"):
        load_cost_model("h100-sxm", profile=gemm_profile())


@pytest.mark.parametrize("line, message", [
    ('{"op": "gemm", "m": 1, "n": 2, "dtype": "fp16", "time_s": 1e-5}', "lacks k"),
    ('{"op": "gemm", "m": 1, "n": 2, "k": 3, "dtype": "fp16", "time_s": -1}', "time_s must be a positive"),
    ('{"op": "gemm", "m": 1, "n": 2, "k": 3, "dtype": "fp16", "time_s": NaN}', "time_s must be a positive"),
    ('{"op": "warp", "time_s": 1}', "unknown op"),
    ('not json', "not JSON"),
])
def test_bad_profiles_are_rejected_with_the_line(tmp_path, line, message) -> None:
    path = tmp_path / "p.jsonl"
    header = {"format": "servecast-profile", "version": 1, "hardware": "a100-80gb", "fingerprint": {}, "peaks": {}}
    path.write_text(json.dumps(header) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message) as err:
        Profile.load(path)
    assert f"{path}:2" in str(err.value)


def test_profile_of_an_unknown_device_is_rejected(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    gemm_profile("a100-80gb").save(path)
    text = path.read_text().replace('"a100-80gb"', '"warp-drive"')
    path.write_text(text)
    with pytest.raises(ValueError, match="unknown device 'warp-drive'"):
        Profile.load(path, known_hardware=set(load_hardware()))
    with pytest.raises(ValueError, match="unknown hardware 'warp-drive'"):
        load_cost_model("warp-drive", profile=path)


def test_idle_wakeup_is_zero_without_measurements_and_interpolated_with_them() -> None:
    plain = load_cost_model("a100-80gb", profile=gemm_profile())
    assert plain.predict("idle_wakeup", 1.0).time_s == 0.0
    profile = gemm_profile()
    profile.measurements += [Measurement.make("idle_wakeup", 0.4e-3, idle_ms=5),
                             Measurement.make("idle_wakeup", 1.2e-3, idle_ms=50)]
    model = load_cost_model("a100-80gb", profile=profile)
    assert model.predict("idle_wakeup", 0.001).time_s == 0.0  # shorter than any idle measured
    assert model.predict("idle_wakeup", 0.005).time_s == pytest.approx(0.4e-3)
    assert 0.4e-3 < model.predict("idle_wakeup", 0.02).time_s < 1.2e-3
    assert model.predict("idle_wakeup", 10.0).time_s == pytest.approx(1.2e-3)  # flat beyond the longest


@pytest.mark.parametrize("hardware, model, tp, weight_dtype, profile", [
    ("h100-sxm", "llama-3.1-8b", 1, None, None),
    ("a100-80gb", "llama-3.1-70b", 4, None, None),
    ("h100-sxm", "llama-3.1-8b", 2, "int4", None),
    ("l40s", "qwen2.5-7b", 1, "fp8", None),
    ("h200", "llama-3.1-8b", 1, None, "profiles/h200-llama-3.1-8b-bf16-gemm.jsonl"),
    ("h100-sxm", "mixtral-8x7b", 2, None, None),
])
def test_the_step_timers_token_sum_is_the_recipes_to_the_bit(hardware, model, tp, weight_dtype, profile) -> None:
    """The simulator's memoized per-step sum equals the cost model's operator by operator sum of
    the step recipe exactly, measured (profiled GEMMs) and extrapolated alike, dense and MoE."""
    from pathlib import Path

    from simulator.cost.recipe import StepRecipe
    from simulator.cost.step_timer import StepTimer
    from simulator.cost.types import StepCost

    root = Path(__file__).resolve().parents[3]
    costs = load_cost_model(hardware, profile=str(root / profile) if profile else None)
    spec = load_model(model)
    timer = StepTimer(costs, ReplicaShape(spec, tp, weight_dtype=weight_dtype))
    recipe = StepRecipe.of(spec, tp, "bf16", weight_dtype)
    for tokens in (1, 2, 3, 7, 16, 100, 257, 1000, 2048, 4097, 8192, 12345):
        cost = StepCost(0.0)
        for op in recipe.token_ops:  # the recipe's operators one by one, as a report lists them
            cost.add(op.name, costs.source(op.kind, op.shape).predict(op.size(tokens)), op.count)
        all_reduce = cost.by_operator.get("all_reduce", 0.0)
        assert timer.token_ops(tokens) == (cost.total_s - all_reduce, all_reduce), tokens
