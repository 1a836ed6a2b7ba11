"""servecast validate --runs / calibrate --runs, and engines and intervals on simulate."""

from __future__ import annotations

import json
import math

from typer.testing import CliRunner

from app.cli import app
from simulator.catalog.engines import load_engine
from tests.calibrate.runs.test_tables import TABLES

runner = CliRunner()


def test_validate_runs_prints_each_run_and_the_errors(tmp_path) -> None:
    path = tmp_path / "runs.md"
    path.write_text(TABLES)
    result = runner.invoke(app, ["validate", "--runs", str(path), "--time-scale", "0.5", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["engine"] == "vllm-v0.15" and [r["id"] for r in out["runs"]] == ["a", "b"]
    assert out["errors"]["runs"] == 2 and all(r["predicted"]["e2e_mean"] > 0 for r in out["runs"])
    table = runner.invoke(app, ["validate", "--runs", str(path), "--time-scale", "0.5", "--engine", "servecast"],
                          env={"COLUMNS": "120"})
    assert table.exit_code == 0 and "median absolute error: E2E mean" in table.output
    # Within the terminal's width, in words: no raw keys.
    assert max(map(len, table.output.splitlines())) <= 120 and "_mdape" not in table.output


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


def test_calibrate_and_validate_take_replay_folders(tmp_path) -> None:
    from tests.calibrate.runs.test_sources import simulated_replay, trace_at

    for rate in (5, 20, 40):
        simulated_replay(tmp_path / "replays" / f"rate{rate}", trace_at(rate, num=30))
    profile = tmp_path / "fitted.json"
    fit = runner.invoke(app, ["calibrate", "--runs", str(tmp_path / "replays"), "--out", str(profile),
                              "--evaluations", "20", "--json"])
    assert fit.exit_code == 0, fit.output
    out = json.loads(fit.stdout)
    # On a catalog GPU the fit starts from vLLM's profile (servecast's own only on a profiled device).
    assert out["engine"] == "vllm-v0.15" and out["errors"]["leave_one_run_out"]["runs"] == 3
    assert [r["id"] for r in out["runs"]] == ["rate5", "rate20", "rate40"]
    assert all({"in_sample", "leave_one_run_out", "measured"} <= set(r) for r in out["runs"])
    assert load_engine(path=profile).residuals["e2e_mean"]
    checked = runner.invoke(app, ["validate", "--runs", str(tmp_path / "replays" / "rate5"), "--runs",
                                  str(tmp_path / "replays" / "rate40"), "--engine-file", str(profile), "--json"])
    assert checked.exit_code == 0, checked.output
    assert [r["id"] for r in json.loads(checked.stdout)["runs"]] == ["rate5", "rate40"]
    one = runner.invoke(app, ["calibrate", "--runs", str(tmp_path / "replays" / "rate5"), "--out", str(profile)])
    assert one.exit_code == 2 and "at least 2" in one.output


def test_simulate_replays_what_a_replay_sent(tmp_path) -> None:
    from tests.calibrate.runs.test_sources import TRUTH, simulated_replay, trace_at

    folder = simulated_replay(tmp_path / "r", trace_at(10, num=20))
    engine = tmp_path / "truth.json"
    TRUTH.save(engine)
    sim = runner.invoke(app, ["simulate", "--replay", str(folder), "--engine-file", str(engine), "--workers", "1",
                              "--out", str(tmp_path / "sim"), "--json"])
    assert sim.exit_code == 0, sim.output
    summary = json.loads(sim.stdout)
    assert summary["num_requests"] == 20 and summary["model"] == "llama-3.1-8b" and summary["hardware"] == "h100-sxm"
    compared = json.loads(runner.invoke(app, ["compare", str(tmp_path / "sim"), str(folder), "--json"]).stdout)
    errors = [m["relative_error"] for m in compared["metrics"].values()]
    assert len([e for e in errors if e is not None]) == len(errors) and max(map(abs, errors)) < 1e-9
    # On another device: the recorded one stands in the replay, the flag for this simulation.
    other = runner.invoke(app, ["simulate", "--replay", str(folder), "--hardware", "a100-80gb", "--workers", "1",
                                "--json"])
    assert other.exit_code == 0, other.output
    assert json.loads(other.stdout)["hardware"] == "a100-80gb"
    assert json.loads(other.stdout)["e2e_s"]["mean"] > summary["e2e_s"]["mean"]  # a slower GPU
    flags = runner.invoke(app, ["simulate", "--replay", str(folder), "--tp", "2", "--trace", "x"])
    assert flags.exit_code == 2 and "drop --trace, --tp" in flags.output
    neither = runner.invoke(app, ["simulate", "--hardware", "h100-sxm"])
    assert neither.exit_code == 2 and "give --model, --trace (or --replay DIR" in neither.output
