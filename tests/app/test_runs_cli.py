"""servecast validate --runs / calibrate --runs, and engines and intervals on simulate."""

from __future__ import annotations

import json
import math

from typer.testing import CliRunner

from app.cli import app
from simulator.catalog.engines import load_engine
from tests.calibrate.test_real_runs import TABLES

runner = CliRunner()


def test_validate_runs_prints_each_run_and_the_errors(tmp_path) -> None:
    path = tmp_path / "runs.md"
    path.write_text(TABLES)
    result = runner.invoke(app, ["validate", "--runs", str(path), "--time-scale", "0.5", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["engine"] == "vllm-v0.15" and [r["id"] for r in out["runs"]] == ["a", "b"]
    assert out["errors"]["runs"] == 2 and all(r["predicted"]["e2e_mean"] > 0 for r in out["runs"])
    table = runner.invoke(app, ["validate", "--runs", str(path), "--time-scale", "0.5", "--engine", "servecast"])
    assert table.exit_code == 0 and "median absolute error" in table.output


def test_runs_commands_refuse_bad_input_with_status_2(tmp_path) -> None:
    missing = runner.invoke(app, ["validate", "--runs", str(tmp_path / "nope.md")])
    assert missing.exit_code == 2 and "no such runs file" in missing.output
    path = tmp_path / "runs.md"
    path.write_text(TABLES)
    no_out = runner.invoke(app, ["calibrate", "--runs", str(path)])
    assert no_out.exit_code == 2 and "--out" in no_out.output
    engine = runner.invoke(app, ["validate", "--runs", str(path), "--engine", "tgi"])
    assert engine.exit_code == 2 and "unknown engine" in engine.output


def test_calibrate_runs_writes_a_profile_simulate_takes(tmp_path) -> None:
    path = tmp_path / "runs.md"
    third = "| c | `Qwen/Qwen2.5-7B-Instruct` | 1 | FP16 | 2048 | 0.9 | chat-lite | 130 | 135 | 140 | 27 | 31 | 36 | 5.4 |\n"
    path.write_text(TABLES.replace("| 2 | FP16 | 2048", "| 1 | FP16 | 2048") + third)
    profile = tmp_path / "mine.json"
    fit = runner.invoke(app, ["calibrate", "--runs", str(path), "--out", str(profile), "--fit-time-scale", "0.25",
                              "--time-scale", "0.25", "--evaluations", "8"])
    assert fit.exit_code == 0, fit.output
    assert load_engine(path=profile).errors["leave_one_run_out"]["runs"] == 3
    sim = runner.invoke(app, ["simulate", "--model", "qwen2.5-7b", "--hardware", "h100-sxm", "--engine-file",
                              str(profile), "--trace", "synthetic:num=30,input=100,output=20,rate=2", "--json"])
    assert sim.exit_code == 0, sim.output
    summary = json.loads(sim.stdout)
    assert summary["cost_model"]["engine"] == "vllm-v0.15" and "e2e_s.mean" in summary["intervals"]
    low, high = summary["intervals"]["e2e_s.mean"]  # the held-out errors' spread (and bias) around it
    residuals = sorted(load_engine(path=profile).residuals["e2e_mean"])
    assert 0 < low < high and residuals[0] <= math.log(low / summary["e2e_s"]["mean"]) + 1e-9
    assert math.log(high / summary["e2e_s"]["mean"]) <= residuals[-1] + 1e-9


def test_simulate_refuses_an_unknown_engine() -> None:
    result = runner.invoke(app, ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--engine", "x",
                                 "--trace", "synthetic:num=5,input=10,output=5,rate=1"])
    assert result.exit_code == 2 and "unknown engine" in result.output
