"""Fit efficiency curves (simulator/cost/efficiency.py) to measured operator times. No torch.

`fit_curve` fits one operator family of one or more profiles by least squares on log time.
`build_params` (`servecast calibrate`; `python -m calibrate.fitting.curve` writes the catalog's file) refits
the parameters simulator/catalog/efficiency.json ships, from the Vidur A100 profiles in ../shared.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.cost.efficiency import EfficiencyCurve
from simulator.cost.profile_format import Measurement
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import step_cost


def _least_squares(*args, **kwargs):
    """scipy's least_squares, imported on first use: scipy is a third of a what-if's start-up."""
    from scipy.optimize import least_squares

    return least_squares(*args, **kwargs)

# Plateaus may exceed 1: a device's measured peaks (a square matmul, a large copy) are not hard
# limits for every shape (cache-resident weights read faster than a DRAM copy). The cost model
# still never predicts below the roofline of the peaks it was given.
LOWER = [0.0, 0.01, math.log(1e-9), 0.5, 0.01, math.log(1e-9), 0.5]
UPPER = [5e-3, 2.0, math.log(1.0), 8.0, 2.0, math.log(1.0), 8.0]


@dataclass(frozen=True)
class Sample:
    flops: float
    nbytes: float
    time_s: float


# Indices in EfficiencyCurve.vector(): t0, ec_max, log_fc, pc, em_max, log_fm, pm.
# Function evaluations per start of a fit: good starts converge in far fewer; a start that wanders
# past this is not the one kept, and the cap keeps a sparse profile's fit to seconds.
MAX_EVALUATIONS = 400
LEVELS = (0, 1, 2, 4, 5)  # the overhead, the two plateaus and the two floors


def fit_curve(samples: Sequence[Sample], peak_flops: float, bandwidth: float | Callable[[float], float],
              start: EfficiencyCurve | None = None, shape_from: EfficiencyCurve | None = None,
              additive: bool = False) -> EfficiencyCurve:
    """Least squares on log time. With shape_from, only the overhead and the two efficiency
    plateaus are fitted and the saturation shape is taken from that (family) curve: a few points of
    one operator then cannot bend the curve in ways that extrapolate badly."""
    if len(samples) < 4:
        raise ValueError(f"need at least 4 measurements to fit an efficiency curve, got {len(samples)}")
    if shape_from is not None:
        return _fit_levels(samples, peak_flops, bandwidth, shape_from, additive)
    flops = np.array([s.flops for s in samples])
    nbytes = np.array([s.nbytes for s in samples])
    # Bandwidth may depend on the working set (caches): one value per sample.
    bandwidth = np.array([bandwidth(b) if callable(bandwidth) else bandwidth for b in nbytes])
    log_t = np.log([s.time_s for s in samples])

    def residuals(v):
        t0, ec, lfc, pc, em, lfm, pm = v
        compute = np.where(flops > 0, _soft_floor(flops / peak_flops / ec, np.exp(lfc), pc), 0.0)
        memory = np.where(nbytes > 0, _soft_floor(nbytes / bandwidth / em, np.exp(lfm), pm), 0.0)
        combined = compute + memory if additive else np.maximum(compute, memory)
        return np.log(t0 + combined + 1e-30) - log_t

    best = None
    starts = [start.vector()] if start else []
    starts += [EfficiencyCurve(t0=t0, log_fc=math.log(floor), log_fm=math.log(floor), pc=p, pm=p).vector()
               for t0 in (1e-6, 2e-5) for floor in (1e-6, 1e-5, 1e-4) for p in (1.0, 3.0)]
    for x0 in starts:
        x0 = np.clip(x0, LOWER, UPPER)
        result = _least_squares(residuals, x0, bounds=(LOWER, UPPER), method="trf", loss="soft_l1", f_scale=0.1,
                               max_nfev=MAX_EVALUATIONS)
        if best is None or result.cost < best.cost:
            best = result
    return EfficiencyCurve.from_vector(best.x)


def _fit_levels(samples: Sequence[Sample], peak_flops: float, bandwidth: float | Callable[[float], float],
                shape: EfficiencyCurve, additive: bool = False) -> EfficiencyCurve:
    base = np.array(shape.vector())
    measured = [s.time_s for s in samples]

    def residuals(levels):
        v = base.copy()
        v[list(LEVELS)] = levels
        curve = EfficiencyCurve.from_vector(v)
        return np.log([curve.time(s.flops, s.nbytes, peak_flops, bandwidth(s.nbytes) if callable(bandwidth)
                                   else bandwidth, additive) for s in samples]) - np.log(measured)

    lower = [LOWER[i] for i in LEVELS]
    upper = [UPPER[i] for i in LEVELS]
    # From the family's levels, and from "a fixed call overhead plus the roofline" (an operator
    # whose floor sits far below its family's, which the family's start cannot reach).
    fastest = min(measured)
    starts = [base[list(LEVELS)], np.array([0.8 * fastest, 0.8, math.log(1e-8), 0.8, math.log(1e-8)]),
              np.array([0.3 * fastest, 0.5, math.log(0.5 * fastest), 0.5, math.log(0.5 * fastest)])]
    best = None
    for x0 in starts:
        result = _least_squares(residuals, np.clip(x0, lower, upper), bounds=(lower, upper), method="trf",
                               loss="soft_l1", f_scale=0.1, max_nfev=MAX_EVALUATIONS)
        if best is None or result.cost < best.cost:
            best = result
    v = base.copy()
    v[list(LEVELS)] = best.x
    return EfficiencyCurve.from_vector(v)


def _soft_floor(time, floor, sharpness):
    """Vectorised: the soft floor of simulator.cost.efficiency.EfficiencyCurve.time."""
    big = np.maximum(time, floor)
    return big * ((time / big) ** sharpness + (floor / big) ** sharpness) ** (1 / sharpness)


def mape(predicted: Iterable[float], measured: Iterable[float]) -> float:
    p, m = np.asarray(list(predicted)), np.asarray(list(measured))
    return float(np.mean(np.abs(p - m) / m))


def samples_of(measurements: Iterable[Measurement], work) -> list[Sample]:
    """work(measurement) -> (flops, bytes)."""
    return [Sample(*work(m), m.time_s) for m in measurements]


def write_params(path: str | Path, params: dict) -> None:
    Path(path).write_text(json.dumps(params, indent=2) + "\n")


# -- the shipped parameter file ------------------------------------------------------------------
SHARED = Path(__file__).resolve().parent.parent.parent.parent / "shared"
PARAMS_OUT = Path(__file__).resolve().parent.parent.parent / "simulator" / "catalog" / "efficiency.json"
HELD_OUT_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# The CPU held-out MAPE (bench/cost_model_heldout.py: 12% time-weighted on two profile pairs), rounded up.
FITTED_ERROR = 0.15


def vidur_profiles(sku: str, shared: Path = SHARED) -> list:
    from calibrate.profiling.vidur import import_vidur_compute

    files = sorted((shared / "profiles" / "vidur" / "compute" / sku).glob("*/*/mlp.csv"))
    if not files:
        raise ValueError(f"no Vidur {sku} profiles under {shared}/profiles/vidur/compute: is ../shared there?")
    return [import_vidur_compute(f) for f in files]


# progress(what is being fitted now, steps done, steps in all): called before each step of a
# fit and once more, with done == total, at the end.
Progress = Callable[[str, int, int], None]


def _no_progress(label: str, done: int, total: int) -> None:
    pass


def fit_gpu_curves(shared: Path = SHARED, progress: Progress | None = None,
                   steps_after: int = 0) -> dict[str, EfficiencyCurve]:
    """GEMM and elementwise curves fitted on the Vidur A100 profiles (fp16); progress is told of each
    curve, out of the curves and the steps_after the caller still has to do."""
    from simulator.catalog.hardware import get_accelerator
    from simulator.cost.curves import curve_keys_of, work_of

    a100 = get_accelerator("a100-80gb")
    groups: dict[str, list[Sample]] = {}
    for profile in vidur_profiles("a100", shared):
        for m in profile.measurements:
            if m.op == "elementwise" and m.get("name") == "embedding":
                continue  # a lookup, not a streaming op
            for key in curve_keys_of(m):
                groups.setdefault(key, []).append(Sample(*work_of(m), m.time_s))
    groups = {key: samples for key, samples in groups.items() if len(samples) >= 8}
    progress = progress or _no_progress
    curves = {}
    for done, (key, samples) in enumerate(groups.items()):
        progress(f"curve {key}", done, len(groups) + steps_after)
        curves[key] = fit_curve(samples, a100.peak_flops("fp16"), a100.memory_bandwidth)
    if not steps_after:
        progress("curves fitted", len(groups), len(groups))
    return curves


def gpu_held_out(curves: dict[str, EfficiencyCurve], shared: Path = SHARED) -> dict[str, float]:
    """MAPE of predicting the A40's measured GEMMs (and elementwise ops) from curves fitted on the A100."""
    from simulator.catalog.hardware import get_accelerator
    from simulator.cost.curves import work_of
    from simulator.cost.model import CostModel

    a40 = get_accelerator("a40")
    model = CostModel(a40, dict(curves), {"extrapolated": 0.0, "fitted": 0.0, "interpolated": 0.0, "measured": 0.0})
    errors: dict[str, list[float]] = {}
    for profile in vidur_profiles("a40", shared):
        for m in profile.measurements:
            label = m.name if m.op == "gemm" else m.get("name")
            if label == "embedding":
                continue
            key = f"gemm:{m.name}" if m.op == "gemm" else f"elementwise:{label}"
            predicted = model.modeled(key, "fp16", lambda _, w=work_of(m): w).time(0)
            errors.setdefault(label, []).append(abs(predicted - m.time_s) / m.time_s)
    return {label: float(np.mean(v)) for label, v in errors.items()}


def fit_all_reduce(shared: Path = SHARED) -> dict[str, float]:
    """Intra-node all-reduce on the Vidur A100 DGX profile:
    t = base + per_hop * (w - 1) + 2 (w - 1) / w * bytes / (link_efficiency * link bandwidth)."""
    from calibrate.profiling.vidur import import_vidur_network
    from simulator.catalog.hardware import get_accelerator

    path = shared / "profiles" / "vidur" / "network" / "a100_dgx" / "all_reduce.csv"
    measured = [m for m in import_vidur_network(path, "a100-80gb").of("all_reduce")
                if dict(m.tags)["devices_per_node"] == m.get("world")]  # one node: the links the catalog describes
    world = np.array([m.get("world") for m in measured], dtype=float)
    nbytes = np.array([m.get("nbytes") for m in measured], dtype=float)
    times = np.array([m.time_s for m in measured])
    link = get_accelerator("a100-80gb").interconnect_gbps * 1e9

    def model(v):
        base, per_hop, efficiency = v
        return base + per_hop * (world - 1) + 2 * (world - 1) / world * nbytes / (efficiency * link)

    fit = _least_squares(lambda v: np.log(model(v)) - np.log(times), [1e-5, 1e-5, 0.5],
                        bounds=([0, 0, 0.01], [1e-3, 1e-3, 1.0]))
    base, per_hop, efficiency = (float(x) for x in fit.x)
    return {"base_s": base, "per_hop_s": per_hop, "link_efficiency": efficiency,
            "vidur_a100_fit_mape": round(mape(model(fit.x), times), 4)}


def fit_collective_latency(curves: dict[str, EfficiencyCurve], all_reduce: dict[str, float],
                           shared: Path = SHARED) -> dict[str, float]:
    """Refit the all-reduce latency terms (base, per hop) on Splitwise's measured A100 decode
    steps of Llama-2-70B at TP 2/4/8 (../shared/reference/perf_model.csv): a serving engine's
    collectives carry more fixed cost than a bare NCCL benchmark. H100 rows stay held out."""
    from calibrate.fitting.splitwise import splitwise_rows
    from simulator.catalog.hardware import get_accelerator
    from simulator.catalog.models import load_model
    from simulator.cost.model import CostModel
    from simulator.cost.types import Chunk

    spec = load_model("llama-2-70b")
    rows = [r for r in splitwise_rows(shared / "reference" / "perf_model.csv") if r["hardware"] == "a100-80gb"]
    plain = CostModel(get_accelerator("a100-80gb"), dict(curves), {"unvalidated": 0.5})
    measured = np.array([r["decode_measured_s"] for r in rows])

    def predicted(v):
        model = plain.with_collective({**all_reduce, "base_s": float(v[0]), "per_hop_s": float(v[1])})
        return np.array([step_cost(model, ReplicaShape(spec, tp=r["tp"], dtype="fp16", block_size=None),
                                   [Chunk(1, r["prompt"] + r["output"] // 2)] * r["batch"]).total_s for r in rows])

    fit = _least_squares(lambda v: np.log(predicted(v)) - np.log(measured), [all_reduce["base_s"], all_reduce["per_hop_s"]],
                        bounds=([0, 0], [1e-3, 1e-3]))
    return {**all_reduce, "base_s": float(fit.x[0]), "per_hop_s": float(fit.x[1]),
            "latency_fitted_on": "Splitwise A100 Llama-2-70B decode steps, TP 2/4/8"}


def build_params(shared: Path = SHARED, out: Path = PARAMS_OUT, progress: Progress | None = None) -> dict:
    """Fit every curve and the collectives, measure the A40 held-out error, write them to out."""
    progress = progress or _no_progress
    curves = fit_gpu_curves(shared, progress, steps_after=3)
    total = len(curves) + 3
    progress("all-reduce (Vidur A100 DGX)", len(curves), total)
    all_reduce = fit_all_reduce(shared)
    progress("collective latency (Splitwise decode steps)", len(curves) + 1, total)
    all_reduce = fit_collective_latency(curves, all_reduce, shared)
    progress("A40 held-out error", len(curves) + 2, total)
    held_out = gpu_held_out(curves, shared)
    progress("done", total, total)
    gemm_error = float(np.mean([held_out[op] for op in HELD_OUT_OPS]))
    by_curve = {(f"gemm:{k}" if k in HELD_OUT_OPS else f"elementwise:{k}"): round(v, 4) for k, v in held_out.items()}
    by_curve["gemm"] = round(gemm_error, 4)
    params = {
        "fitted_device": "a100-80gb",  # the catalog accelerator those profiles measured
        "fitted_on": "Vidur A100-80GB mlp.csv profiles (fp16), ../shared/profiles/vidur; calibrate/fitting/curve.py",
        "curves": {k: v.to_dict() for k, v in sorted(curves.items())},
        "all_reduce": all_reduce,
        "held_out_a40_mape": {k: round(v, 4) for k, v in sorted(held_out.items())},
        # extrapolated: GEMMs predicted on an unprofiled GPU (A100 -> A40 held-out MAPE);
        # by_curve: the same per operator; unvalidated: operators no held-out data covers
        # (attention, KV writes, sampling, collectives on GPUs); fitted: a profiled device's own
        # curves on other shapes (CPU held-out check, bench/cost_model_heldout.py).
        "expected_error": {"extrapolated": round(gemm_error, 4), "fitted": FITTED_ERROR, "unvalidated": 0.5,
                           "by_curve": by_curve},
    }
    write_params(out, params)
    return params


if __name__ == "__main__":
    result = build_params()
    print(json.dumps(result["held_out_a40_mape"], indent=2))
