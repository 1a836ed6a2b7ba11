"""`servecast plan`: JSON, output files with the HTML report, bad input in one line."""

from __future__ import annotations

import json

import pytest

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
    for row in (c for c in plan["candidates"] if c["feasible"]):  # every answer inside its own interval
        predicted = {**row["slo_measured"], "ttft_p99": row["ttft_p99_s"], "e2e_p99": row["e2e_p99_s"]}
        assert row["intervals"] and all(row["intervals"][k][0] <= v <= row["intervals"][k][1]
                                        for k, v in predicted.items()), row
    assert (tmp_path / "plan.json").exists() and (tmp_path / "candidates.csv").exists()
    import csv

    with open(tmp_path / "candidates.csv") as f:  # one value per column, counts as integers
        table = list(csv.DictReader(f))
    text = (tmp_path / "candidates.csv").read_text()
    assert "{" not in text and "[" not in text
    best = next(r for r in table if r["candidate"] == plan["recommendation"]["1.0"]["candidate"])
    assert best["replicas"].isdigit() and best["requests"].isdigit() and best["tp"] == "1"
    assert float(best["slo_ttft_p99_s"]) == plan["recommendation"]["1.0"]["slo_measured"]["ttft_p99"]
    report = (tmp_path / "report.html").read_text()
    assert "Pareto front" in report and plan["recommendation"]["1.0"]["candidate"] in report
    for bad, message in ((["--hardware", "h900"], "unknown hardware"), (["--slo", "ttft_p99=fast"], "not a duration"),
                         (["--speculation", "ngram:four:0.5"], "write none, ngram:G:A"),
                         (["--speculation", "ngram:4:1.5"], "acceptance"),
                         (["--max-replicas", "0"], "max_replicas must be at least 1"),
                         (["--tp", "two"], "--tp takes a comma-separated list"), (["--growth", "0"], "positive")):
        result = runner.invoke(app, [*args, *bad])
        assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
    # Bad input every candidate shares: one line naming the option (not the candidate checked first),
    # before any plan is printed.
    for bad, message in ((["--model", "llama-9b"], "error: unknown model 'llama-9b'"),
                         (["--slo", "ttft_p42=1s"], "error: --slo: unknown SLO")):
        result = runner.invoke(app, [*args, *bad])
        assert result.exit_code == 2 and result.stderr.startswith(message), result.output
        assert len(result.stderr.strip().splitlines()) == 1 and "Cheapest fleet" not in result.stdout


def test_plan_with_speculation_and_pipeline_options() -> None:
    result = CliRunner().invoke(app, ["plan", "--trace", TRACE, "--hardware", "h100-sxm", "--quant", "bf16",
                                      "--tp", "1", "--pp", "1,2", "--speculation", "none,ngram:3:0.7",
                                      "--workers", "0", "--json"])
    assert result.exit_code == 0, result.output
    labels = [c["candidate"] for c in json.loads(result.stdout)["candidates"]]
    assert labels == ["h100-sxm bf16 tp=1", "h100-sxm bf16 tp=1 spec=ngramx3@0.7", "h100-sxm bf16 tp=1 pp=2",
                      "h100-sxm bf16 tp=1 pp=2 spec=ngramx3@0.7"]


def test_the_report_answers_first_in_words_and_units(tmp_path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["plan", "--trace", TRACE, "--hardware", "h100-sxm,l40s", "--quant", "bf16",
                                 "--tp", "1,3", "--workers", "0", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    best = plan["recommendation"]["1.0"]
    report = (tmp_path / "report.html").read_text()
    # The question and the answer in words, before any table; no dict, no JSON dump.
    assert "TTFT p99 ≤ 2 s and TPOT p99 ≤ 100 ms" in report and "{'ttft_p99'" not in report
    assert report.index("Buy ") < report.index("class='sortable'") and '"candidates"' not in report
    assert f"Buy {best['replicas']} x {best['hardware']}" in report and "80 % interval" in report
    assert "TTFT p99 (ms)" in report and "$ / hour" in report and ">None<" not in report
    # Infeasible candidates grouped: both tp=3 ones under one reason; l40s flagged as extrapolated.
    assert report.count("does not divide") == 1 and "⚠" in report
    assert "reproduce with: servecast plan" in report and "Cross-validated" in report
    # The terminal: the recommendation, then one line per reason covering its candidates.
    lines = [line for line in result.stdout.splitlines() if line.startswith("cannot meet them")]
    assert len(lines) == 1 and lines[0].startswith("cannot meet them (2)")
    assert "recommended at x1" in result.stdout


def test_no_answer_says_so_with_the_closest_miss_and_exits_3() -> None:
    result = CliRunner().invoke(app, ["plan", "--trace", TRACE, "--hardware", "l40s", "--quant", "bf16",
                                      "--tp", "1", "--slo", "tpot_p99=5ms", "--max-replicas", "2", "--workers", "0"])
    assert result.exit_code == 3, result.output
    line = next(x for x in result.stdout.splitlines() if "no candidate meets" in x)
    assert "TPOT p99 ≤ 5 ms" in line and "closest miss: l40s bf16 tp=1" in line


@pytest.mark.parametrize("args, words", [
    (["--hardware", "h100-sxm", "--tp", "3,6"], "every candidate failed; most often: tp=3 does not divide"),
    (["--hardware", "a40", "--tp", "1"], "meet the SLOs but none has a price"),
])
def test_no_answer_without_simulating_or_without_prices(args, words) -> None:
    result = CliRunner().invoke(app, ["plan", "--trace", "synthetic:num=40,input=200,output=20,rate=2", "--quant",
                                      "bf16", "--workers", "0", *args])
    assert result.exit_code == 3, result.output
    assert words in " ".join(result.stdout.split())


def test_plan_weighs_a_cpu_kv_tier() -> None:
    runner = CliRunner()
    trace = "synthetic:prefixes=20,users=1,prefix_len=1500,input=100,output=40,num=120,rate=4"
    result = runner.invoke(app, ["plan", "--trace", trace, "--hardware", "a100-80gb", "--quant", "bf16", "--tp", "1",
                                 "--kv-offload-gb", "0,256", "--workers", "0", "--json"])
    assert result.exit_code == 0, result.output
    labels = [c["candidate"] for c in json.loads(result.stdout)["candidates"]]
    assert labels == ["a100-80gb bf16 tp=1", "a100-80gb bf16 tp=1 cpu-kv=256GB"]
    bad = runner.invoke(app, ["plan", "--trace", trace, "--hardware", "a100-80gb", "--kv-offload-gb", "-1"])
    assert bad.exit_code == 2 and "--kv-offload-gb" in bad.stderr


def test_a_tier_that_saves_nothing_is_not_recommended_and_the_plan_says_where_one_pays() -> None:
    from app.plan_words import cheapest_first, choice_words, variant_words
    from simulator.plan.capacity import Candidate, CandidateResult, recommend

    def result(hardware: str, gb: float, replicas: int | None, e2e: float = 1.0) -> CandidateResult:
        return CandidateResult(Candidate(hardware, kv_offload_gb=gb), 1.0, replicas is not None,
                               None if replicas else "misses", replicas, replicas,
                               None if replicas is None else 2.0 * replicas, e2e_p99_s=e2e)

    same = [result("a100-80gb", 0, 3, e2e=1.2), result("a100-80gb", 256, 3, e2e=1.1)]
    assert recommend(same).candidate.kv_offload_gb == 0  # equal cost: no tier, though its E2E is lower
    assert [r["kv_offload_gb"] for r in cheapest_first([r.row() for r in same])] == [0, 256]
    rows = [r.row() for r in [*same, result("h100-sxm", 0, 4), result("h100-sxm", 256, 2),
                              result("l40s", 0, None), result("l40s", 256, 5)]]
    assert variant_words(rows, " cpu-kv=", "a CPU KV tier") == (
        "A CPU KV tier is cheaper on h100-sxm bf16 tp=1 cpu-kv=256GB ($4.00/hour less: 2 GPUs against 4); only "
        "with a CPU KV tier do l40s bf16 tp=1 cpu-kv=256GB meet the SLOs; a CPU KV tier is no cheaper on "
        "a100-80gb bf16 tp=1 cpu-kv=256GB.")
    assert choice_words(rows) == [variant_words(rows, " cpu-kv=", "a CPU KV tier")]
    assert choice_words([r.row() for r in same[:1]]) == []


def test_plan_weighs_prefill_decode_disaggregation() -> None:
    runner = CliRunner()
    trace = "synthetic:num=120,input=1000,output=100,rate=4"
    result = runner.invoke(app, ["plan", "--trace", trace, "--hardware", "h100-sxm", "--quant", "bf16", "--tp", "1",
                                 "--disaggregate", "none,1:2", "--slo", "ttft_p99=2s,tpot_p99=100ms", "--workers",
                                 "0", "--json"])
    assert result.exit_code == 0, result.output
    rows = {c["candidate"]: c for c in json.loads(result.stdout)["candidates"]}
    assert set(rows) == {"h100-sxm bf16 tp=1", "h100-sxm bf16 tp=1 pd=1:2"}
    split = rows["h100-sxm bf16 tp=1 pd=1:2"]
    assert split["feasible"] and split["gpus"] == 3 * split["replicas"]  # n x (1 prefill + 2 decode)
    bad = runner.invoke(app, ["plan", "--trace", trace, "--hardware", "h100-sxm", "--disaggregate", "1-2"])
    assert bad.exit_code == 2 and "disaggregate='1-2': write P:D" in bad.stderr


def test_the_trace_is_said_at_its_nominal_rate_with_the_samples_beside_it() -> None:
    from app import plan_words
    from simulator.workload.load import load_workload

    spec = f"synthetic:num=400,lengths={BUNDLED_LENGTHS},rate=8"
    workload = load_workload(spec, seed=0)
    assert plan_words.nominal_rate(spec) == 8.0 and plan_words.nominal_rate("trace.csv") is None
    words = plan_words.trace_words(workload, "ShareGPT lengths", plan_words.nominal_rate(spec))
    sample = f"{workload.rate_per_s:.3g}"
    assert sample != "8" and words == f"400 requests at 8 req/s (ShareGPT lengths; {sample} req/s in this sample)"
    assert plan_words.trace_words(workload, "x") == f"400 requests at {sample} req/s (x)"



def test_a_recommendation_on_unvalidated_costs_says_so_and_names_the_validated_one(tmp_path) -> None:
    result = CliRunner().invoke(app, ["plan", "--trace", TRACE, "--hardware", "mi300x,h100-sxm", "--quant", "fp8",
                                      "--tp", "1", "--workers", "0", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    best, validated = plan["recommendation"]["1.0"], plan["validated_recommendation"]["1.0"]
    assert best["candidate"] == "mi300x fp8 tp=1" and best["cost_basis"] == "extrapolated"
    assert validated["candidate"] == "h100-sxm fp8 tp=1" and validated["cost_basis"] == "validated"
    words = " ".join(result.stdout.split())
    assert "⚠ rests on unvalidated costs (mi300x: kernel costs extrapolated" in words
    assert f"the cheapest on validated costs: {validated['replicas']} x h100-sxm fp8 tp=1" in words
    assert "Rests on unvalidated costs" in (tmp_path / "report.html").read_text()
    alone = CliRunner().invoke(app, ["plan", "--trace", TRACE, "--hardware", "h100-sxm", "--quant", "fp8", "--tp", "1",
                                     "--workers", "0"])
    assert alone.exit_code == 0 and "unvalidated" not in alone.stdout


def test_plan_ablate_stacks_the_techniques_on_the_recommended_accelerator(tmp_path) -> None:
    runner = CliRunner()
    small = "synthetic:num=60,input=uniform(100,800),output=uniform(20,200),rate=2"
    result = runner.invoke(app, ["plan", "--trace", small, "--hardware", "a100-80gb", "--quant", "bf16", "--tp", "1",
                                 "--max-replicas", "4", "--workers", "0", "--ablate", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    ablation = json.loads((tmp_path / "plan.json").read_text())["ablation"]
    assert ablation["hardware"] == "a100-80gb" and len(ablation["rows"]) == 9
    assert ablation["rows"][0]["technique"] == "static batching" and "tp=2" in ablation["rows"][-1]["config"]
    report = (tmp_path / "report.html").read_text()
    assert "What each technique buys on a100-80gb" in report and "Peak output tok/s per GPU" in report
    assert report.index("What each technique buys") < report.index("How these numbers were made")
