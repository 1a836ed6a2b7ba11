"""Replaying real runs (calibrate/real_runs.py) through the simulator: each run's workload and
server flags as a SimConfig, and the simulated figures beside the measured ones. No torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from calibrate.real_runs import SATURATED_TTFT_MS, RealRun
from simulator.cost.model import CostModel
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload

# The campaign's fixed server flags (../shared/reference/vllm-runs.md, Protocol).
MAX_NUM_SEQS, BLOCK_SIZE, MAX_MODEL_LEN = 128, 16, 4096


@dataclass(frozen=True)
class Replayed:
    run: RealRun
    predicted: dict[str, float]  # METRICS, ms

    @property
    def saturated(self) -> bool:
        return self.predicted["ttft_mean"] > SATURATED_TTFT_MS

    def error(self, metric: str) -> float | None:
        """Signed relative error (predicted / measured - 1), None where the run has no measurement."""
        measured = self.run.measured.get(metric)
        return None if measured is None else self.predicted[metric] / measured - 1.0


def run_config(run: RealRun) -> SimConfig:
    return SimConfig(model=run.model, hardware=run.hardware, tp=run.tp, quant=run.quant,
                     max_num_batched_tokens=run.max_num_batched_tokens, max_num_seqs=MAX_NUM_SEQS,
                     block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN,
                     gpu_memory_utilization=run.gpu_memory_utilization)


def replay(run: RealRun, cost_model: CostModel, time_scale: float = 1.0, config: SimConfig | None = None) -> Replayed:
    """Simulate the run (its stages shortened by time_scale) on cost_model; figures in ms, TPOT
    derived as the runs file derives it: (E2E mean - TTFT mean) / (measured output mean - 1)."""
    config = config or run_config(run)
    result = simulate(config, load_workload(run.spec(time_scale), seed=config.seed), cost_model=cost_model)
    s = result.summary
    e2e, ttft = s["e2e_s"], s["ttft_s"]
    predicted = {"e2e_mean": e2e["mean"], "e2e_p90": e2e["p90"], "e2e_p99": e2e["p99"],
                 "ttft_mean": ttft["mean"], "ttft_p90": ttft["p90"], "ttft_p99": ttft["p99"]}
    predicted = {k: v * 1e3 for k, v in predicted.items()}
    predicted["tpot"] = (predicted["e2e_mean"] - predicted["ttft_mean"]) / max(run.output_mean - 1.0, 1.0)
    if s["num_finished"] < s["num_requests"]:  # requests that could never run: the run did not keep up
        predicted = {k: (math.inf if k.startswith("ttft") else v) for k, v in predicted.items()}
    return Replayed(run, predicted)
