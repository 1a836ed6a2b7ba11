"""Fitting a cost model's framework terms on observed steps (calibrate/fitting/device.py)."""

from __future__ import annotations

import pytest

from calibrate.fitting.device import fit_framework
from simulator.catalog import load_model
from simulator.cost.model import CostModel
from simulator.cost.profile_format import Profile
from simulator.cost.types import Chunk
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import step_cost


def test_framework_fit_predicts_the_mean_step_not_a_low_one_under_noise() -> None:
    """Steps timed on a shared machine scatter (here lognormally, 30 %). Fitting relative errors
    against the measured times would land below the typical step; summed step times (TPOT,
    throughput) need the mean, for every batch size observed."""
    import numpy as np

    from simulator.cost.types import StepObservation

    cm = CostModel.load("a100-80gb")
    model = load_model("llama-3.1-8b")
    rng = np.random.default_rng(0)
    noise = 0.3
    steps, true_times = [], {}
    for batch in (1, 2, 4, 8, 16, 32):
        chunks = [Chunk(1, 512)] * batch
        ops = step_cost(cm, ReplicaShape(model, tp=1, dtype="bf16", block_size=None),
                        chunks, include_host=False).total_s
        true_times[batch] = ops + 40e-6 + 5e-6 * batch  # host work per step and per chunk
        count = 400 if batch == 1 else 40  # light traffic: most steps decode one request
        for factor in rng.lognormal(-noise ** 2 / 2, noise, count):  # mean 1
            steps.append(StepObservation(chunks, model, "bf16", None, true_times[batch] * factor))
    fitted = CostModel.load("a100-80gb")
    fitted = fitted.with_framework(fit_framework(fitted, Profile("a100-80gb", {}, {}, "test"), steps))
    for batch, true_s in true_times.items():
        chunks = [Chunk(1, 512)] * batch
        predicted = step_cost(fitted, ReplicaShape(model, tp=1, dtype="bf16", block_size=None),
                              chunks).total_s - fitted.predict("step_overhead", batch).time_s
        assert predicted == pytest.approx(true_s, rel=0.04), batch


def test_framework_fit_recovers_what_a_change_of_step_shape_costs() -> None:
    """Engine steps observed in order: a step whose token count differs from the one before
    costs a part per halving and a part per doubling of it. The fit finds both; steps repeated
    back to back (previous_tokens None or equal) fit as before, and no shape terms appear without
    changes."""
    import numpy as np

    from simulator.cost.host import SHAPE_CHANGE_TERMS, shape_change_features
    from simulator.cost.types import StepObservation

    model = load_model("llama-3.1-8b")
    cm = CostModel.load("a100-80gb")
    per_halving_s, per_doubling_s = 100e-6, 250e-6
    rng = np.random.default_rng(1)
    sizes = [1, 2, 3, 4, 8, 16, 64, 256]
    steps, previous = [], None
    for _ in range(600):
        tokens = int(rng.choice(sizes)) if rng.random() < 0.3 or previous is None else previous
        chunks = [Chunk(1, 300)] * tokens if tokens <= 16 else [Chunk(tokens, tokens)]
        ops = step_cost(cm, ReplicaShape(model, tp=1, dtype="bf16", block_size=None),
                        chunks, include_host=False).total_s
        halvings, doublings = shape_change_features(previous, tokens)
        steps.append(StepObservation(chunks, model, "bf16", None,
                                     ops + 40e-6 + halvings * per_halving_s + doublings * per_doubling_s, previous))
        previous = tokens
    fitted = CostModel.load("a100-80gb")
    fitted = fitted.with_framework(fit_framework(fitted, Profile("a100-80gb", {}, {}, "test"), steps))
    assert fitted.framework["step_per_halving_s"] == pytest.approx(per_halving_s, rel=0.05)
    assert fitted.framework["step_per_doubling_s"] == pytest.approx(per_doubling_s, rel=0.05)
    assert fitted.predict("shape_change", 256, 1).time_s == pytest.approx(8 * per_halving_s, rel=0.05)
    assert fitted.predict("shape_change", 2, 8).time_s == pytest.approx(2 * per_doubling_s, rel=0.05)
    assert fitted.predict("shape_change", 4, 4).time_s == 0.0 and fitted.predict("shape_change", None, 4).time_s == 0.0

    repeated = [StepObservation(o.chunks, o.model, o.dtype, o.block_size, o.forward_s) for o in steps]
    plain = CostModel.load("a100-80gb")
    plain = plain.with_framework(fit_framework(plain, Profile("a100-80gb", {}, {}, "test"), repeated))
    assert not set(SHAPE_CHANGE_TERMS) & set(plain.framework)
    assert plain.predict("shape_change", 256, 1).time_s == 0.0


def test_the_framework_fit_learns_an_moe_layers_host_work_only_from_moe_steps() -> None:
    from simulator.cost.host import MOE_TERMS, moe_host_features
    from simulator.cost.types import Chunk, StepObservation

    cm = CostModel.load("a100-80gb")
    mixtral, dense = load_model("mixtral-8x7b"), load_model("llama-3.1-8b")

    def observed(model, batch: int, host_s: float) -> StepObservation:
        chunks = [Chunk(1, 512)] * batch
        ops = step_cost(cm, ReplicaShape(model, tp=1, dtype="bf16", block_size=None),
                        chunks, include_host=False).total_s
        return StepObservation(chunks, model, "bf16", None, ops + host_s)

    # Host work of 20 us per MoE layer and 5 us per expert touched in it, on top of the operators.
    def host(model, batch):
        layers, touched = moe_host_features(model, batch)
        return 20e-6 * layers + 5e-6 * touched
    steps = [observed(mixtral, b, host(mixtral, b)) for b in range(1, 65, 2)]
    fitted = CostModel.load("a100-80gb")
    fitted = fitted.with_framework(fit_framework(fitted, Profile("a100-80gb", {}, {}, "test"), steps))
    assert set(MOE_TERMS) <= set(fitted.framework)
    for o in steps:
        predicted = step_cost(fitted, ReplicaShape(mixtral, tp=1, dtype="bf16", block_size=None),
                              o.chunks).total_s - fitted.predict("step_overhead", len(o.chunks)).time_s
        assert predicted == pytest.approx(o.forward_s, rel=0.02)
    dense_fit = CostModel.load("a100-80gb")
    dense_fit = dense_fit.with_framework(fit_framework(dense_fit, Profile("a100-80gb", {}, {}, "test"),
                                                       [observed(dense, b, 30e-6) for b in range(1, 65, 2)]))
    assert not set(MOE_TERMS) & set(dense_fit.framework)


def test_the_fit_beside_a_profile_serves_only_that_profile(tmp_path) -> None:
    """The simulator reads the terms fitted beside a profile file, and only while the file is the one
    they were fitted on; without them it refuses, naming the fix."""
    from calibrate.fitting.device import fit_profile, load_cost_model
    from simulator.cost.fitted import FittedTerms
    from simulator.cost.profile_format import Measurement

    profile = Profile("a100-80gb", {"device_name": "test"}, {}, "test")
    for m, t in [(1, 10e-6), (16, 12e-6), (64, 20e-6), (256, 60e-6), (1024, 220e-6), (2048, 430e-6)]:
        profile.measurements.append(Measurement.make("gemm", t, name="qkv_proj", m=m, n=4096, k=4096, dtype="fp16"))
    path = tmp_path / "p.jsonl"
    profile.save(path)
    with pytest.raises(ValueError, match="no fitted terms"):
        CostModel.load("a100-80gb", profile=path)
    fitted_here = load_cost_model("a100-80gb", profile=path)
    fit_profile(CostModel.unfitted("a100-80gb", path), Profile.load(path)).save_beside(path)
    read = CostModel.load("a100-80gb", profile=path)
    assert read.curves == fitted_here.curves and read.framework == fitted_here.framework
    assert read.predict("gemm", 128, 1024, 4096, "fp16") == fitted_here.predict("gemm", 128, 1024, 4096, "fp16")

    Profile.append(path, Measurement.make("gemm", 800e-6, name="qkv_proj", m=4096, n=4096, k=4096, dtype="fp16"))
    assert FittedTerms.beside(path) is None  # fitted on the file before this point
    FittedTerms.path_beside(path).write_text('{"format": "servecast-fitted-terms"')
    assert FittedTerms.beside(path) is None  # unreadable: as if absent
