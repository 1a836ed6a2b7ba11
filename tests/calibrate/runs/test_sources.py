"""Replay folders as measured runs: read back with their deployment, simulated as they were sent,
refused with the fix where they cannot be, and an engine profile fitted on them."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from app.common import dumps
from calibrate.runs.deployment import deployment_config
from calibrate.fitting.engine_profile import cross_validate, predict, summary_errors
from calibrate.runs.tables import RunsError
from calibrate.runs.sources import read_run_sources
from calibrate.runs.replay_summary import ReplayInfo
from simulator.catalog.engines import EngineProfile, load_engine
from simulator.cost.model import CostModel
from simulator.fleet.run import simulate
from simulator.workload.load import load_workload
from tests.calibrate.runs.test_tables import TABLES

DEPLOYMENT = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "max_num_seqs": 64, "max_num_batched_tokens": 2048}
# A server whose requests spend 20 ms outside the engine's steps and whose steps cost 3 ms of host time.
TRUTH = EngineProfile("truth", "what the fake server adds", framework={"step_s": 0.003}, request_s=0.02)


def trace_at(rate: float, num: int = 60) -> str:
    return f"synthetic:num={num},input=uniform(100,400),output=uniform(20,80),rate={rate:g}"


def simulated_replay(folder: Path, trace: str, **info) -> Path:
    """A replay folder whose measurements are a simulation of the TRUTH engine on DEPLOYMENT: what
    a server that is exactly TRUTH would have given `servecast replay --out folder` (info: other
    fields of its replay section, e.g. the deployment it says it has)."""
    config = deployment_config(DEPLOYMENT, "test")
    cost_model = CostModel.load(config.hardware).with_engine(TRUTH, config.max_num_seqs, config.max_num_batched_tokens)
    result = simulate(config, load_workload(trace), cost_model=cost_model)
    checks = {"short_outputs": info.pop("short_outputs", 0)}
    replay = ReplayInfo(**{"url": "http://127.0.0.1:1/v1", "model": "served", "trace": trace, "seed": 0,
                           "rate_scale": 1.0, "max_concurrency": None, "tokenizer": None, "vocab_size": 256,
                           "started_at": "", "server": None, "deployment": DEPLOYMENT, **info})
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(dumps({**result.summary.to_dict(), "replay": {**asdict(replay), **checks}}))
    result.requests.to_parquet(folder / "requests.parquet")
    return folder


def test_a_replay_folder_reads_as_a_run_of_its_deployment(tmp_path) -> None:
    folder = simulated_replay(tmp_path / "replays" / "r10", trace_at(10))
    (run,) = read_run_sources([tmp_path / "replays"])  # a folder of replay folders
    summary = json.loads((folder / "summary.json").read_text())
    assert run.id == "r10" and run.family == "llama-3.1-8b" and run.hardware == "h100-sxm" and run.tp == 1
    assert run.sim_config().max_num_seqs == 64 and run.sim_config().max_num_batched_tokens == 2048
    assert run.measured["ttft_mean"] == pytest.approx(summary["ttft_s"]["mean"] * 1e3)
    assert run.measured["tpot"] == pytest.approx(summary["tpot_s"]["mean"] * 1e3)  # the requests' own TPOTs
    assert not run.saturated and len(run.workload(0.1)) == 60  # a replay is simulated whole
    # Replayed on the profile that made it, the run comes back as measured.
    again = predict(TRUTH, run, 1.0)
    assert all(again.error(m) == pytest.approx(0.0, abs=1e-9) for m in run.measured)
    # Runs tables and replays together; a repeated id gets its source in front.
    table = tmp_path / "runs.md"
    table.write_text(TABLES)
    simulated_replay(tmp_path / "more" / "r10", trace_at(10))
    runs = read_run_sources([table, tmp_path / "replays", tmp_path / "more" / "r10"])
    assert [r.id for r in runs] == ["a", "b", "replays/r10", "more/r10"]
    twice = read_run_sources([folder, folder])  # still alike after that: numbered
    assert [r.id for r in twice] == ["replays/r10", "replays/r10#2"]


@pytest.mark.parametrize("change, message", [
    ({"deployment": None}, "does not say its model"),
    ({"deployment": {"model": "llama-3.1-8b"}}, "does not say its hardware"),
    ({"deployment": {**DEPLOYMENT, "hardware": "cpu-local"}}, "a device timed from its own profile: give --profile P.jsonl, made on the machine that served it by `servecast profile --model"),
    ({"deployment": {**DEPLOYMENT, "tp": 3}}, "tp=3 does not divide"),
    ({"trace": trace_at(10, num=50)}, "the trace changed since"),
])
def test_a_replay_that_cannot_be_simulated_as_measured_names_the_fix(tmp_path, change, message) -> None:
    folder = simulated_replay(tmp_path / "r", trace_at(10))
    summary = json.loads((folder / "summary.json").read_text())
    summary["replay"].update(change)
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RunsError, match=message):
        read_run_sources([folder])


def test_a_replay_with_max_concurrency_is_read_as_closed_loop_clients(tmp_path) -> None:
    from simulator.workload.requests import Clients

    folder = simulated_replay(tmp_path / "r", trace_at(10))
    summary = json.loads((folder / "summary.json").read_text())
    summary["replay"]["max_concurrency"] = 4
    (folder / "summary.json").write_text(json.dumps(summary))
    (run,) = read_run_sources([folder])
    assert run.workload().clients == Clients(4)


def test_short_outputs_are_refused(tmp_path) -> None:
    folder = simulated_replay(tmp_path / "r", trace_at(10), short_outputs=3)
    with pytest.raises(RunsError, match="3 requests got fewer tokens than the trace asked"):
        read_run_sources([folder])


def test_failed_requests_and_folders_without_replays_are_refused(tmp_path) -> None:
    folder = simulated_replay(tmp_path / "r", trace_at(10))
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(num_rejected=2, rejections={"HTTP 500": 2})
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(RunsError, match="2 of 60 requests failed \\(HTTP 500\\)"):
        read_run_sources([folder])
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunsError, match="holds no replay"):
        read_run_sources([tmp_path / "empty"])
    # The device a deployment leaves out can come from the command line.
    hardware_less = simulated_replay(tmp_path / "h", trace_at(10), deployment={"model": "llama-3.1-8b"})
    assert read_run_sources([hardware_less], hardware="a100-80gb")[0].hardware == "a100-80gb"


def test_a_fit_on_replays_finds_what_the_server_adds(tmp_path) -> None:
    """Replays of a server that adds 20 ms per request and 3 ms per step to the kernel times: from
    servecast's own engine (which adds nothing), the fit predicts them within a few percent, in
    sample and on each replay left out, where the unfitted engine misses TTFT by a third or more."""
    for rate in (5, 20, 40):
        simulated_replay(tmp_path / f"rate{rate}", trace_at(rate))
    runs = read_run_sources([tmp_path])
    base = load_engine("servecast")
    before = summary_errors([predict(base, run, 1.0) for run in runs])
    result = cross_validate(base, runs, max_evaluations=300)
    assert before["ttft_mean_mdape"] > 30
    for label in ("in_sample", "leave_one_run_out"):
        errors = result.profile.errors[label]
        assert errors["e2e_mean_mdape"] < 3 and errors["ttft_mean_mdape"] < 3 and errors["tpot_mdape"] < 3, label
    assert result.profile.errors["leave_one_run_out"]["refits_moved"] == 3  # each fold fitted afresh
    assert "leave_one_model_out" not in result.profile.errors and result.leave_one_model_out == []  # one model
    assert 15 < result.profile.request_s * 1e3 < 25
    assert set(result.profile.residuals["e2e_mean"]) and len(result.profile.residuals["tpot"]) == 3
