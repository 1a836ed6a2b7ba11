"""The typed run summary: its fields are what its JSON says, in the key order docs/summary.md
documents; one distribution, NaN on empty input."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest

from simulator.fleet.metrics import PERCENTILES, TokenGaps, distribution, served
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.summary import Distribution, RunSummary
from simulator.workload.load import load_workload

SPEC = "synthetic:num=120,input=uniform(20,600),output=uniform(2,200),rate=40"
DOC = Path(__file__).resolve().parents[3] / "docs" / "summary.md"


def test_the_typed_summary_is_its_json() -> None:
    result = simulate(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=2), load_workload(SPEC, seed=1))
    s = result.summary
    assert isinstance(s, RunSummary) and isinstance(s.ttft_s, Distribution)
    as_json = s.to_dict()
    assert list(as_json)[:7] == ["model", "hardware", "tp", "pp", "cp", "replicas", "quant"]
    assert "stopped_early" not in as_json
    assert s.ttft_s.p99 == as_json["ttft_s"]["p99"] and as_json["tpot_s"]["mean"] == s.tpot_s.mean
    assert s.num_finished == as_json["num_finished"] == 120
    assert s.cost.usd_per_hour == as_json["cost"]["usd_per_hour"] > 0
    assert s.memory.kv_tokens == as_json["memory"]["kv_tokens"] > 0 and s.cost_model.engine == "vllm-v0.15"
    assert s.slo.all_met is True and s.slo.targets == {}
    assert json.loads(json.dumps(as_json))["time_split_s"]["steps"] == s.time_split_s.steps > 0
    assert RunSummary.from_dict(json.loads(json.dumps(as_json))) == s  # read back from its JSON
    with pytest.raises(Exception):
        s.num_finished = 0  # frozen


def test_a_run_stopped_early_says_why_and_reads_its_slos_missed() -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", slo="ttft_p90=10ms")
    result = simulate(config, load_workload("synthetic:num=400,input=2000,output=50,rate=200"),
                      stop_when_slo_missed=True)
    s = result.summary
    assert s.stopped_early and s.to_dict()["stopped_early"] == s.stopped_early
    assert s.slo.all_met is False and s.slo.met["ttft_p90"] is False


def documented_keys() -> dict[str, list[str]]:
    """docs/summary.md's tables: section ("" for the top level) -> its keys in order. A table's
    rows are `| `key` | type | unit | meaning |`; a section's table follows a heading naming it as
    `key`."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"#+ .*?`(\w+)`", line)
        if line.startswith("## Top level"):
            current = sections.setdefault("", [])
        elif heading:
            current = sections.setdefault(heading.group(1), [])
        elif line.startswith("#"):
            current = None
        elif current is not None and (row := re.match(r"\|\s*`(\w+)`\s*\|", line)):
            current.append(row.group(1))
    return sections


def test_the_documented_schema_is_run_summarys() -> None:
    from calibrate.runs.replay_summary import ReplaySection, ReplaySummary
    from simulator.fleet import summary_parts as parts

    documented = documented_keys()
    assert documented[""] == [f.name for f in fields(ReplaySummary)]  # RunSummary's, then "replay"
    sections = {"throughput": parts.Throughput, "goodput": parts.Goodput, "ttft_s": parts.Distribution,
                "slo": parts.Slo, "kv_utilization": parts.KvUtilization, "utilization": parts.Utilization,
                "time_split_s": parts.TimeSplit, "cost": parts.Cost, "memory": parts.Memory,
                "cost_model": parts.CostModelInfo, "speculation": parts.Speculation, "kv_offload": parts.KvOffload,
                "disaggregation": parts.Disaggregation, "prefill": parts.Pool, "transfer": parts.Transfer,
                "replay": ReplaySection}
    for name, part in sections.items():
        assert documented[name] == [f.name for f in fields(part)], name
    assert set(documented) == {"", *sections}


def test_a_simulations_json_keys_are_the_documented_ones() -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", disaggregate="1:1", slo="ttft_p99=1s")
    as_json = simulate(config, load_workload("synthetic:num=20,input=300,output=20,rate=5")).summary.to_dict()
    documented = documented_keys()
    assert list(as_json) == [k for k in documented[""] if k not in ("stopped_early", "replay")]
    for name in ("throughput", "goodput", "slo", "cost", "memory", "cost_model", "disaggregation"):
        assert list(as_json[name]) == documented[name], name
    assert list(as_json["ttft_s"]) == documented["ttft_s"] == ["mean", *(f"p{p}" for p in PERCENTILES)]
    assert list(as_json["disaggregation"]["prefill"]) == documented["prefill"]
    assert list(as_json["disaggregation"]["transfer"]) == documented["transfer"]


@pytest.mark.parametrize("empty", [pd.Series([], dtype=float), pd.Series([math.nan, None], dtype=float), [], [None]])
def test_the_one_distribution_of_no_values_is_nan_throughout(empty) -> None:
    d = distribution(empty)
    assert isinstance(d, Distribution) and all(math.isnan(v) for v in d.to_dict().values())
    assert list(d.to_dict()) == ["mean", "p50", "p90", "p95", "p99"]
    assert distribution([2.0, None, 4.0]).to_dict() == pytest.approx(Distribution(3.0, 3.0, 3.8, 3.9, 3.98).to_dict())


def test_the_json_edge_writes_an_empty_distribution_as_null() -> None:
    from app.common import dumps

    assert json.loads(dumps(distribution([]))) == dict.fromkeys(("mean", "p50", "p90", "p95", "p99"))


def test_no_finished_request_gives_nan_distributions_and_zero_throughput() -> None:
    rows = pd.DataFrame({"status": ["rejected", "rejected"], "reason": ["too long", "too long"],
                         "arrival_s": [0.0, 1.0], "finish_s": [math.nan, math.nan], "prompt_tokens": [10, 20],
                         "output_tokens": [5, 5], "ttft_s": [math.nan] * 2, "tpot_s": [math.nan] * 2,
                         "e2e_s": [math.nan] * 2})
    figures = served(rows, {"ttft_p99": 1.0}, TokenGaps([]))
    assert figures.num_rejected == 2 and figures.rejections == {"too long": 2} and figures.queue_s is None
    assert figures.throughput.requests_per_s == 0.0 and figures.goodput.output_tokens_per_s == 0.0
    assert all(math.isnan(v) for d in (figures.ttft_s, figures.itl_s) for v in d.to_dict().values())
    assert figures.slo.met == {"ttft_p99": False} and figures.slo.all_met is False


def test_a_prediction_sits_inside_its_interval_and_the_slo_verdict_reads_it() -> None:
    from simulator.catalog.engines import residual_metric
    from simulator.fleet.costs import cost_model_for

    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", slo={"ttft_p99": 10.0, "e2e_mean": 60.0})
    workload = load_workload(SPEC, seed=1)
    s = simulate(config, workload).summary
    engine = cost_model_for(config).engine
    assert s.intervals and set(s.predicted) == set(s.intervals)
    for key, (lo, hi) in s.intervals.items():  # the held-out residuals' median lies inside their 80 % range
        assert lo <= s.predicted[key] <= hi, key
    # The profile's TTFT p99 residuals are biased (real runs slower than simulated): the prediction
    # carries it, and the SLO is judged on the prediction, the simulated value kept beside it.
    bias = engine.bias(residual_metric("ttft_p99"))
    assert bias > 1.05 and s.predicted["ttft_s.p99"] == pytest.approx(s.ttft_s.p99 * bias)
    assert s.slo.simulated["ttft_p99"] == pytest.approx(s.ttft_s.p99)
    assert s.slo.measured["ttft_p99"] == pytest.approx(s.ttft_s.p99 * bias)
    # A limit between the simulated and the predicted value: missed, in a full run and in one that
    # stops as soon as the miss is certain.
    between = s.ttft_s.p99 * (1 + bias) / 2
    tight = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", slo={"ttft_p99": between})
    full = simulate(tight, workload).summary.slo
    stopped = simulate(tight, workload, stop_when_slo_missed=True).summary.slo
    assert full.met == {"ttft_p99": False} and not full.all_met and not stopped.all_met
    assert s.ttft_s.p99 < between < full.measured["ttft_p99"]
