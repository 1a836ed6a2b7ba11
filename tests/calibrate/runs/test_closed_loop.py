"""Public closed-loop runs as measured runs: which the default profile's fit takes, and their
replay as C clients in a loop, predicted in the statistic each source published."""

from __future__ import annotations

import pytest

from calibrate.fitting.engine_profile import log_residuals
from calibrate.runs.closed_loop import FIT_DEVICE, RUNS, fitted_runs
from calibrate.runs.measured import replay
from simulator.catalog.engines import DEFAULT_GPU_ENGINE, load_engine
from simulator.fleet.costs import cost_model_for


def test_the_fit_takes_only_runs_on_its_device_under_releases_it_spans() -> None:
    fitted, default = fitted_runs(), load_engine(DEFAULT_GPU_ENGINE)
    assert fitted and all(r.hardware == FIT_DEVICE and default.covers(r.release) and not r.anomalous for r in fitted)
    left = {r.source for r in RUNS if r not in fitted}
    assert {"EMMY", "PR25398", "PR23151"} <= left  # an H200, an H100 PCIe, a release before the profile's
    assert all(not r.saturated and set(r.measured) == {"tpot"} for r in RUNS)
    assert len({r.id for r in RUNS}) == len(RUNS)


def test_a_closed_loop_run_replays_as_its_clients_and_its_statistic() -> None:
    run = next(r for r in fitted_runs() if r.concurrency == 4)
    workload = run.workload(prompts=8)
    assert len(workload.requests) == 8 and workload.clients.concurrency == run.concurrency
    config = run.sim_config()
    assert config.max_num_seqs == run.concurrency and config.quant == run.quant
    replayed = replay(run, cost_model_for(config), config=config)
    assert replayed.predicted["tpot"] > 0 and set(replayed.predicted) >= {"tpot", "ttft_mean", "e2e_mean"}
    (residual,) = log_residuals(replayed)  # its TPOT alone
    assert residual == pytest.approx(__import__("math").log(replayed.predicted["tpot"] / run.tpot_ms))
    median = next(r for r in fitted_runs() if r.tpot_stat == "p50")
    summary = type("S", (), {k: type("D", (), {"mean": 2.0, "p50": 1.0})() for k in ("tpot_s", "ttft_s", "e2e_s")})()
    assert median.figures(summary)["tpot"] == 1000.0 and run.figures(summary)["tpot"] == 2000.0


def test_the_default_profile_says_it_was_fitted_on_the_closed_loop_runs_it_takes() -> None:
    # Its span (extrapolation["fitted"]) decides what an answer is said to be extrapolated across.
    fitted = load_engine(DEFAULT_GPU_ENGINE).extrapolation["fitted"]
    for run in fitted_runs():
        assert run.family in fitted["models"] and run.sim_config().tp in fitted["tp"], run.id
        assert run.hardware in fitted["devices"], run.id
