"""`servecast plan`: JSON, output files with the HTML report, bad input in one line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from app.cli import app
from simulator.workload.requests import BUNDLED_LENGTHS

TRACE = f"synthetic:num=120,lengths={BUNDLED_LENGTHS},rate=6"


def test_plan_cli_json_and_bad_input(tmp_path) -> None:
    runner = CliRunner()
    args = ["plan", "--trace", TRACE, "--hardware", "h100-sxm,a100-80gb", "--quant", "bf16,fp8", "--tp", "1",
            "--workers", "0"]
    result = runner.invoke(app, [*args, "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["recommendation"]["1.0"]["feasible"] and len(plan["candidates"]) == 4
    assert any("no fp8 tensor cores" in (c["reason"] or "") for c in plan["candidates"])
    assert (tmp_path / "plan.json").exists() and (tmp_path / "candidates.csv").exists()
    report = (tmp_path / "report.html").read_text()
    assert "Pareto front" in report and plan["recommendation"]["1.0"]["candidate"] in report
    for bad, message in ((["--hardware", "h900"], "unknown hardware"), (["--slo", "ttft_p99=fast"], "not a duration"),
                         (["--speculation", "ngram:four:0.5"], "write none, ngram:G:A"),
                         (["--speculation", "ngram:4:1.5"], "acceptance"),
                         (["--max-replicas", "0"], "max_replicas must be at least 1"),
                         (["--tp", "two"], "--tp takes a comma-separated list"), (["--growth", "0"], "positive")):
        result = runner.invoke(app, [*args, *bad])
        assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_plan_with_speculation_and_pipeline_options() -> None:
    result = CliRunner().invoke(app, ["plan", "--trace", TRACE, "--hardware", "h100-sxm", "--quant", "bf16",
                                      "--tp", "1", "--pp", "1,2", "--speculation", "none,ngram:3:0.7",
                                      "--workers", "0", "--json"])
    assert result.exit_code == 0, result.output
    labels = [c["candidate"] for c in json.loads(result.stdout)["candidates"]]
    assert labels == ["h100-sxm bf16 tp=1", "h100-sxm bf16 tp=1 spec=ngramx3", "h100-sxm bf16 tp=1 pp=2",
                      "h100-sxm bf16 tp=1 pp=2 spec=ngramx3"]
