"""What a validation found (calibrate/validation/fidelity.py): a level's metrics from its requests
(metrics_of), one measurement of a level and a level over its repeats (Measurement, LevelResult),
and the table of errors against the targets and the engine's own spread (error_table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

METRICS = (("throughput", "output_tokens_per_s"), ("ttft", "p50"), ("ttft", "p90"), ("ttft", "p99"),
           ("tpot", "mean"), ("tpot", "p50"), ("tpot", "p99"), ("e2e", "p50"), ("e2e", "p99"))
TARGETS = {"throughput": 0.05, "tpot_mean": 0.05}  # everything else: 0.10


def target_of(metric: str) -> float:
    return TARGETS.get(metric, 0.10)


def metrics_of(requests: pd.DataFrame) -> dict[str, float]:
    finished = requests[requests["status"] == "finished"]
    duration = finished["finish_s"].max() - finished["arrival_s"].min()
    out = {"throughput": float(finished["output_tokens"].sum() / duration)}
    for metric, stat in METRICS[1:]:
        values = finished[f"{metric}_s"].dropna().to_numpy(dtype=float)
        out[f"{metric}_{stat}"] = float(values.mean() if stat == "mean" else np.percentile(values, float(stat[1:])))
    return out


@dataclass
class Measurement:
    """One measurement of a level: the engine's replay, its simulation and their step times."""

    measured: dict[str, float]
    predicted: dict[str, float]
    measured_requests: pd.DataFrame
    predicted_requests: pd.DataFrame
    steps: dict = field(default_factory=dict)  # step-time fidelity on the engine's own steps

    @property
    def errors(self) -> dict[str, float]:
        return {k: self.predicted[k] / self.measured[k] - 1 for k in self.measured}


@dataclass
class LevelResult:
    """A load level over its repeats: metrics, errors and step ratios are medians over them."""

    level: str
    rate_per_s: float
    repeats: list[Measurement]

    def _median(self, values: list[dict[str, float]]) -> dict[str, float]:
        return {k: float(np.median([v[k] for v in values])) for k in values[0]}

    @property
    def measured(self) -> dict[str, float]:
        return self._median([r.measured for r in self.repeats])

    @property
    def predicted(self) -> dict[str, float]:
        return self._median([r.predicted for r in self.repeats])

    @property
    def errors(self) -> dict[str, float]:
        return self._median([r.errors for r in self.repeats])

    @property
    def error_range(self) -> dict[str, tuple[float, float]]:
        return {k: (min(r.errors[k] for r in self.repeats), max(r.errors[k] for r in self.repeats))
                for k in self.repeats[0].errors}

    @property
    def engine_spread(self) -> dict[str, float]:
        """The engine against itself: how far the farthest repeat's measured value lies from the
        repeats' median (relative). Every repeat replays the same requests at the same times, so
        this is the machine's noise floor for that metric; 0 with one repeat."""
        return {k: float(max(abs(r.measured[k] / m - 1) for r in self.repeats)) if m else math.nan
                for k, m in self.measured.items()}

    @property
    def steps(self) -> dict:
        numeric = [{k: v for k, v in r.steps.items() if isinstance(v, (int, float))} for r in self.repeats]
        keys = set.intersection(*(set(n) for n in numeric))
        return {k: float(np.median([n[k] for n in numeric])) for k in sorted(keys)}

    @property
    def measured_requests(self) -> pd.DataFrame:  # the first repeat's, for per-request plots
        return self.repeats[0].measured_requests

    @property
    def predicted_requests(self) -> pd.DataFrame:
        return self.repeats[0].predicted_requests


def error_table(results: list[LevelResult]) -> pd.DataFrame:
    """One row per level and metric: medians over the repeats, the errors' range, and the engine's
    own spread over the repeats (LevelResult.engine_spread), and whether the error lies within the
    target and within that spread."""
    rows = []
    for r in results:
        measured, predicted, spread, engine_spread = r.measured, r.predicted, r.error_range, r.engine_spread
        for metric, error in r.errors.items():
            rows.append({"level": r.level, "rate_per_s": r.rate_per_s, "metric": metric, "measured": measured[metric],
                         "predicted": predicted[metric], "error": error, "error_min": spread[metric][0],
                         "error_max": spread[metric][1], "engine_spread": engine_spread[metric],
                         "repeats": len(r.repeats), "target": target_of(metric),
                         "within_target": abs(error) <= target_of(metric),
                         # No larger than the engine's own spread: the machine's noise could account
                         # for it (never with one repeat, which has no spread).
                         "within_engine_spread": len(r.repeats) > 1 and abs(error) <= engine_spread[metric]})
    return pd.DataFrame(rows)
