"""The typed run summary: its fields are what its JSON says, in DESIGN.md's key order."""

from __future__ import annotations

import json

import pytest

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.summary import Distribution, RunSummary
from simulator.workload.load import load_workload

SPEC = "synthetic:num=120,input=uniform(20,600),output=uniform(2,200),rate=40"


def test_the_typed_summary_reads_as_its_json() -> None:
    result = simulate(SimConfig(model="llama-3.1-8b", hardware="a100-80gb", replicas=2), load_workload(SPEC, seed=1))
    s = result.summary
    assert isinstance(s, RunSummary) and isinstance(s.ttft_s, Distribution)
    as_json = s.to_dict()
    assert list(as_json)[:7] == ["model", "hardware", "tp", "pp", "cp", "replicas", "quant"]
    assert "stopped_early" not in as_json
    assert dict(s) == as_json  # the mapping view is the JSON
    assert s.ttft_s.p99 == as_json["ttft_s"]["p99"] and s["tpot_s"]["mean"] == s.tpot_s.mean
    assert s.num_finished == as_json["num_finished"] == 120
    assert s.cost.usd_per_hour == as_json["cost"]["usd_per_hour"] > 0
    assert json.loads(json.dumps(as_json))["time_split_s"]["steps"] == s.time_split_s.steps > 0
    with pytest.raises(Exception):
        s.num_finished = 0  # frozen


def test_a_run_stopped_early_says_why_and_reads_its_slos_missed() -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", slo="ttft_p90=10ms")
    result = simulate(config, load_workload("synthetic:num=400,input=2000,output=50,rate=200"),
                      stop_when_slo_missed=True)
    s = result.summary
    assert s.stopped_early and "stopped_early" in s and s.to_dict()["stopped_early"] == s.stopped_early
    assert s.slo["all_met"] is False and s.slo["met"]["ttft_p90"] is False
