"""Held-out checks of the cost model (printed by bench/cost_model_heldout.py). No timing asserts here.

* GPU: curves fitted on the Vidur A100 profiles predict the A40's measured GEMMs.
* CPU: curves fitted on a profile of one tiny model predict another model's operators, measured
  on the same CPU.
* Splitwise: step times predicted for Llama-2-70B on A100 / H100 against the measured prefill and
  decode times in ../shared/reference/perf_model.csv.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from calibrate.fitting.device import load_cost_model
from calibrate.fitting.splitwise import HARDWARE_IDS, splitwise_rows
from simulator.cost.model import CostModel
from simulator.cost.types import Chunk
from simulator.catalog.models import load_model
from simulator.cost.profile_format import Measurement, Profile
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import step_cost


def operator_label(m: Measurement) -> str:
    if m.op == "gemm":
        return f"gemm:{m.name}"
    if m.op == "elementwise":
        return f"elementwise:{m.get('name')}"
    return m.op


def predict_measurement(model: CostModel, m: Measurement) -> float:
    p = dict(m.params)
    if m.op == "gemm":
        return model.predict("gemm", p["m"], p["n"], p["k"], p["dtype"], m.name).time_s
    return model.predict(m.op, **p).time_s


def cpu_held_out(fit_on: Profile, held_out: Profile, held_out_heads: tuple[int, int, int] | None = None
                 ) -> dict[str, dict[str, float]]:
    """Per operator: MAPE, count, and share of the held-out profile's time.

    held_out_heads (num_heads, num_kv_heads, head_dim) keeps only the held-out model's own
    attention layout: its profile also holds attention at other head dims, which that model never runs.
    """
    model = load_cost_model(fit_on.hardware, profile=fit_on)
    model._series = {}  # predict every held-out point from the fitted curves, not from fit_on's points
    errors: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for m in held_out.measurements:
        if m.op in ("step_overhead", "forward", "idle_wakeup"):
            continue
        if m.op.startswith("attention") and held_out_heads is not None and (
                m.get("num_heads"), m.get("num_kv_heads"), m.get("head_dim")) != held_out_heads:
            continue
        errors[operator_label(m)].append((predict_measurement(model, m), m.time_s))
    total = sum(t for v in errors.values() for _, t in v)
    out = {label: {"mape": float(np.mean([abs(p - t) / t for p, t in v])), "n": len(v),
                   "time_share": sum(t for _, t in v) / total} for label, v in errors.items()}
    every = [abs(p - t) / t for v in errors.values() for p, t in v]
    weighted = sum(abs(p - t) for v in errors.values() for p, t in v) / total
    out["all operators"] = {"mape": float(np.mean(every)), "n": len(every), "time_share": 1.0}
    out["time-weighted"] = {"mape": float(weighted), "n": len(every), "time_share": 1.0}
    return out


def splitwise_check(perf_model_csv: Path) -> list[dict]:
    """Predicted vs measured Llama-2-70B prefill (whole prompt) and decode-step times."""
    spec = load_model("llama-2-70b")
    models = {h: CostModel.load(HARDWARE_IDS[h]) for h in HARDWARE_IDS}
    rows = splitwise_rows(perf_model_csv)
    for r in rows:
        model = models[r["hardware"]]
        # Prompts of a batch are prefilled together; decode steps run at the mean context.
        shape = ReplicaShape(spec, tp=r["tp"], dtype="fp16", block_size=None)
        r["prefill_predicted_s"] = step_cost(model, shape, [Chunk(r["prompt"], r["prompt"])] * r["batch"]).total_s
        decode = [Chunk(1, r["prompt"] + r["output"] // 2)] * r["batch"]
        r["decode_predicted_s"] = step_cost(model, shape, decode).total_s
    return rows
