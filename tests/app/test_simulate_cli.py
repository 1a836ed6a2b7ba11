"""servecast simulate / validate from the command line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from app.cli import app

runner = CliRunner()
SIM = ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm",
       "--trace", "synthetic:num=60,input=uniform(100,600),output=uniform(10,80),rate=20"]


def test_simulate_json_and_out_dir(tmp_path) -> None:
    result = runner.invoke(app, [*SIM, "--slo", "ttft_p99=1s,tpot_p99=50ms", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_finished"] == 60 and summary["slo"]["targets"] == {"ttft_p99": 1.0, "tpot_p99": 0.05}
    assert json.loads((tmp_path / "summary.json").read_text())["num_requests"] == 60
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(requests) == 60 and {"ttft_s", "tpot_s", "e2e_s", "queue_s"} <= set(requests.columns)
    assert len(pd.read_parquet(tmp_path / "timeseries.parquet")) > 0
    html = (tmp_path / "report.html").read_text()
    assert "Latency CDFs" in html and "Where time goes" in html and "plotly" in html.lower()


def test_simulate_is_deterministic_for_a_seed() -> None:
    a = runner.invoke(app, [*SIM, "--json", "--seed", "4"])
    b = runner.invoke(app, [*SIM, "--json", "--seed", "4"])
    assert a.exit_code == b.exit_code == 0 and a.stdout == b.stdout


def test_simulate_gives_the_same_answer_on_one_process_or_several_and_refuses_zero() -> None:
    one = runner.invoke(app, [*SIM, "--replicas", "3", "--json", "--workers", "1"])
    two = runner.invoke(app, [*SIM, "--replicas", "3", "--json", "--workers", "2"])
    assert one.exit_code == two.exit_code == 0 and one.stdout == two.stdout
    bad = runner.invoke(app, [*SIM, "--workers", "0"])
    assert bad.exit_code == 2 and "--workers must be at least 1" in bad.output


def test_simulate_prints_a_summary() -> None:
    result = runner.invoke(app, [*SIM, "--replicas", "2", "--router", "least_outstanding_tokens"])
    assert result.exit_code == 0, result.output
    assert "TTFT" in result.stdout and "60/60 requests finished" in result.stdout and "$" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "llama-3.1-70b", "--hardware", "a100-80gb"], "needs 141 GB of weights"),
    (["--model", "nope"], "unknown model"),
    (["--hardware", "tpu-v9"], "unknown hardware"),
    (["--tp", "3"], "does not divide"),
    (["--router", "random"], "--router"),
    (["--slo", "ttft=2s"], "SLO"),
    (["--trace", "synthetic:num=x"], "not a number"),
    (["--trace", "missing.csv"], "no trace file"),
    (["--quant", "int3"], "--quant"),
    # A profiled local device: what it needs named by the options that give it.
    (["--hardware", "cpu-local"], "timed from its profile (--profile FILE; `servecast profile` makes one) and has no "
                                  "memory size in the catalog: give --num-gpu-blocks N"),
    (["--hardware", "cpu-local", "--num-gpu-blocks", "64"], "pass its profile (run `servecast profile` first)"),
    (["--hardware", "cpu-local", "--num-gpu-blocks", "64", "--profile", "missing-profile.json"],
     "no profile at missing-profile.json"),
])
def test_simulate_bad_input_exits_2_with_one_line(args, message) -> None:
    base = {"--model": "llama-3.1-8b", "--hardware": "h100-sxm", "--trace": "synthetic:num=5"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    result = runner.invoke(app, ["simulate", *[x for kv in base.items() for x in kv]])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert result.output.count("error:") == 1


def test_validate_runs_engine_and_simulator_at_three_loads(tmp_path) -> None:
    """Tiny model and workload (the figures themselves come from `servecast validate` on defaults)."""
    from calibrate.profiling.plan import ProfileGrid
    from calibrate.profiling.profiler import Profiler
    from engine.policy.config import ModelConfig

    config = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
    (tmp_path / "config.json").write_text(json.dumps(config))
    profile = tmp_path / "profile.jsonl"
    Profiler(ModelConfig.from_hf(config), grid=ProfileGrid.quick()).run(profile)
    result = runner.invoke(app, ["validate", "--model", str(tmp_path / "config.json"), "--profile", str(profile),
                                 "--num-requests", "6", "--max-total-tokens", "64", "--max-num-batched-tokens", "64",
                                 "--num-blocks", "64", "--calibration-requests", "8", "--repeats", "2", "--json",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    errors = pd.DataFrame(report["errors"])
    assert set(errors["level"]) == {"light", "near saturation", "overloaded"}
    assert {"throughput", "ttft_p99", "tpot_mean", "e2e_p50"} <= set(errors["metric"])
    assert errors["measured"].gt(0).all() and errors["predicted"].gt(0).all()
    assert errors["repeats"].eq(2).all() and (errors["error_min"] <= errors["error"]).all()
    assert (errors["error"] <= errors["error_max"]).all()
    assert errors["engine_spread"].ge(0).all()
    assert errors["within_engine_spread"].eq(errors["error"].abs() <= errors["engine_spread"]).all()
    assert all(v["steps"] > 0 for v in report["step_time"].values())
    # The fitted model on the calibration steps either side of each level, as a drift check.
    assert all(v["calibration_before_total_ratio"] > 0 and v["calibration_after_total_ratio"] > 0
               for v in report["step_time"].values())
    # Each repeat's own errors; the level's error is their median.
    for level, repeats in report["repeats"].items():
        assert len(repeats) == 2
        for metric, row in errors[errors["level"] == level].set_index("metric").iterrows():
            values = sorted(r["errors"][metric] for r in repeats)
            assert row["error"] == pytest.approx((values[0] + values[1]) / 2)
            assert (row["error_min"], row["error_max"]) == pytest.approx((values[0], values[1]))
    assert (tmp_path / "out" / "report.html").exists() and (tmp_path / "out" / "errors.csv").exists()
    # Each repeat's level was simulated at the speed the probe saw during it.
    assert all(r["step_time"]["level_slowdown"] > 0 for repeats in report["repeats"].values() for r in repeats)
    plain = runner.invoke(app, ["validate", "--model", str(tmp_path / "config.json"), "--profile", str(profile),
                                "--num-requests", "6", "--max-total-tokens", "64", "--max-num-batched-tokens", "64",
                                "--num-blocks", "64", "--calibration-requests", "8", "--repeats", "1",
                                "--no-speed-probe", "--json"])
    assert plain.exit_code == 0, plain.output
    assert not any("level_slowdown" in v for v in json.loads(plain.stdout)["step_time"].values())


@pytest.mark.parametrize("args, message", [
    (["--threads", "-1"], "threads must be at least 1"),
    (["--num-blocks", "0"], "0 blocks"),
    (["--max-total-tokens", "5000"], "exceeds the model's max_position_embeddings"),
    (["--length-scale", "0"], "length scale must be positive"),
    (["--lengths", "/nonexistent.csv"], "no length file"),
    (["--calibration-requests", "-1"], "calibration requests"),
    (["--repeats", "0"], "repeats must be at least 1"),
])
def test_validate_bad_settings_fail_before_any_profiling(args, message) -> None:
    result = runner.invoke(app, ["validate", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_simulate_a_disaggregated_fleet_from_the_command_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from app.cli import app

    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--disaggregate",
                                      "1:2", "--prefill-tp", "2", "--trace", "synthetic:num=30,input=800,output=50,rate=4",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "prefill pool 1 x h100-sxm (bf16, TP 2)" in result.stdout.replace("\n", " ")
    assert "Disaggregated: prefill pool" in (tmp_path / "report.html").read_text()
    bad = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--prefill-tp", "2",
                                   "--trace", "synthetic:num=3,input=8,output=5,rate=4"])
    assert bad.exit_code == 2 and "give disaggregate=P:D too" in bad.output and "Traceback" not in bad.output
