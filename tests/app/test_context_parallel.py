"""Context parallelism from the command line, in the plan's words and report, and in the app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from app.cli import app
from app.plan_words import choice_words, variant_words
from simulator.plan.capacity import Candidate, CandidateResult, recommend
from simulator.plan.grid import candidate_grid

PAGES = Path(__file__).resolve().parents[2] / "app" / "dashboard"
runner = CliRunner()
LONG = "synthetic:num=40,input=32000,output=16,rate=0.5"  # 32k-token prompts
SHORT = "synthetic:num=120,input=uniform(100,1000),output=uniform(20,200),rate=8"
SIM = ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--trace",
       "synthetic:num=4,input=40000,output=8,rate=0.2"]
PLAN = ["plan", "--hardware", "h100-sxm", "--quant", "bf16", "--tp", "1", "--workers", "0"]


def test_simulate_at_cp2_reports_it_in_the_summary_the_terminal_and_the_report(tmp_path) -> None:
    result = runner.invoke(app, [*SIM, "--cp", "2", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["cp"] == 2 and summary["num_finished"] == 4
    report = (tmp_path / "report.html").read_text()
    assert "tp=1, pp=1, cp=2" in report and "Context parallelism: 2 ranks of TP 1 per replica" in report
    printed = runner.invoke(app, [*SIM, "--cp", "2"])
    assert printed.exit_code == 0 and "cp=2" in printed.stdout and "Context parallelism: 2 ranks" in printed.stdout
    plain = runner.invoke(app, SIM)
    assert plain.exit_code == 0 and "cp=" not in plain.stdout and "Context parallelism" not in plain.stdout


@pytest.mark.parametrize("args, message", [
    (["--cp", "0"], "--cp: Input should be greater than or equal to 1"),
    (["--cp", "2", "--pp", "2"], "use pp=1 or cp=1"),
    (["--prefill-cp", "2"], "give disaggregate=P:D too"),
])
def test_simulate_refuses_bad_cp_in_one_line(args, message) -> None:
    result = runner.invoke(app, [*SIM, *args])
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_the_planner_picks_cp2_for_long_prompts_under_a_tight_ttft_and_says_why(tmp_path) -> None:
    result = runner.invoke(app, [*PLAN, "--trace", LONG, "--cp", "1,2", "--slo", "ttft_p99=1s", "--out",
                                 str(tmp_path)])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    best = plan["recommendation"]["1.0"]
    assert best["candidate"] == "h100-sxm bf16 tp=1 cp=2" and best["cp"] == 2 and best["gpus"] == 2 * best["replicas"]
    words = "Only with context parallelism do h100-sxm bf16 tp=1 cp=2 meet the SLOs."
    assert words in " ".join(result.stdout.split())
    assert "TP 1, CP 1 or 2" in plan["about"]["question"] and "x CP 1 or 2" in plan["about"]["grid"]
    report = (tmp_path / "report.html").read_text()
    assert f"Buy {best['replicas']} x h100-sxm (bf16, TP 1, CP 2)" in report and words in report
    assert "--cp 1,2" in report  # the command that reproduces the plan


def test_the_planner_prefers_cp1_for_short_prompts() -> None:
    result = runner.invoke(app, [*PLAN, "--trace", SHORT, "--cp", "1,2", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["recommendation"]["1.0"]["candidate"] == "h100-sxm bf16 tp=1"
    assert {c["candidate"] for c in plan["candidates"]} == {"h100-sxm bf16 tp=1", "h100-sxm bf16 tp=1 cp=2"}
    rows = plan["candidates"]
    assert choice_words(rows) == ["Context parallelism is no cheaper on h100-sxm bf16 tp=1 cp=2."]


@pytest.mark.parametrize("args, message", [
    (["--cp", "0"], "--cp sizes must be at least 1"),
    (["--cp", "two"], "--cp takes a comma-separated list"),
    (["--cp", "2", "--pp", "2"], "context parallelism is not combined with pipeline parallelism"),
])
def test_the_planner_refuses_bad_cp_sizes(args, message) -> None:
    result = runner.invoke(app, [*PLAN, "--trace", SHORT, *args])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_the_grid_varies_cp_after_pp_and_leaves_cp_out_under_pp() -> None:
    grid = candidate_grid(["h100-sxm"], ["bf16"], [1], [1, 2], cp=[1, 2])
    assert [c.label for c in grid] == ["h100-sxm bf16 tp=1", "h100-sxm bf16 tp=1 cp=2", "h100-sxm bf16 tp=1 pp=2"]
    assert candidate_grid(["h100-sxm"], ["bf16"], [1]) == [Candidate("h100-sxm")]  # the default: no CP


def test_cp_that_saves_nothing_is_not_recommended_and_the_words_say_where_it_pays() -> None:
    def result(hardware: str, cp: int, replicas: int | None, e2e: float = 1.0) -> CandidateResult:
        gpus = None if replicas is None else replicas * cp
        return CandidateResult(Candidate(hardware, cp=cp), 1.0, replicas is not None,
                               None if replicas else "misses", replicas, gpus,
                               None if replicas is None else 2.0 * gpus, e2e_p99_s=e2e)

    same = [result("a100-80gb", 1, 4, e2e=1.2), result("a100-80gb", 2, 2, e2e=1.0)]
    assert recommend(same).candidate.cp == 1  # equal cost: no CP, though its E2E is lower
    rows = [r.row() for r in [*same, result("h100-sxm", 1, 6), result("h100-sxm", 2, 2)]]
    assert variant_words(rows, " cp=", "context parallelism") == (
        "Context parallelism is cheaper on h100-sxm bf16 tp=1 cp=2 ($4.00/hour less: 4 GPUs against 6); context "
        "parallelism is no cheaper on a100-80gb bf16 tp=1 cp=2.")


def test_explore_and_compare_offer_cp() -> None:
    at = AppTest.from_file(str(PAGES / "explore_page.py"), default_timeout=120)
    at.run()
    at.radio(key="explore_src").set_value("trace spec").run()
    at.text_input(key="explore_spec").set_value("synthetic:num=4,input=40000,output=8,rate=0.2").run()
    one = at.metric[1].value
    at.selectbox(key="explore_cp").set_value(2).run()
    assert not at.exception and at.metric[1].value != one
    assert any("Context parallelism: 2 ranks" in c.value for c in at.caption)
    compare = AppTest.from_file(str(PAGES / "compare_page.py"), default_timeout=120)
    compare.run()
    compare.selectbox(key="b_cp").set_value(4).run()
    table = compare.dataframe[0].value.set_index("Figure")
    assert not compare.exception
    assert table.loc["Context parallelism (ranks per replica)"].tolist() == ["1", "4"]


def test_the_plan_page_plans_cp_candidates() -> None:
    at = AppTest.from_file(str(PAGES / "plan_page.py"), default_timeout=300)
    at.run()
    at.radio(key="plan_src").set_value("trace spec").run()
    at.text_input(key="plan_spec").set_value(LONG).run()
    at.number_input(key="ttft").set_value(1.0)
    at.multiselect(key="quant").set_value(["bf16"])
    at.multiselect(key="tp").set_value([1])
    at.multiselect(key="cp").set_value([1, 2])
    at.multiselect(key="hardware").set_value(["h100-sxm"])
    at.button[0].click().run()
    assert not at.exception and "h100-sxm bf16 tp=1 cp=2" in at.success[0].value
    assert "CP 1 or 2" in at.markdown[0].value
