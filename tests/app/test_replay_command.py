"""servecast replay and servecast compare from the command line (real HTTP to a fake
OpenAI-compatible server on loopback)."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from app.cli import app
from calibrate.runs.replay_summary import read_replay
from tests.calibrate.runs.fake_openai import MODEL, FakeServer, serving

runner = CliRunner()
TRACE = "synthetic:num=6,input=uniform(10,30),output=uniform(2,5),rate=50"


@pytest.fixture(scope="module")
def server():
    with serving(FakeServer(first_token_s=0.01, token_s=0.002)) as fake:
        yield fake


def test_replay_json_and_out_folder(server, tmp_path) -> None:
    result = runner.invoke(app, ["replay", "--url", server.url + "/", "--trace", TRACE, "--slo", "ttft_p99=5s",
                                 "--max-concurrency", "3", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_finished"] == 6 and summary["slo"]["all_met"] is True
    assert summary["replay"]["model"] == MODEL == server.received[-1]["model"]  # from GET /models
    assert summary["replay"]["server"]["data"][0]["id"] == MODEL and summary["replay"]["url"] == server.url
    run = read_replay(tmp_path)
    assert run.summary.to_dict() == summary and len(run.requests) == 6 and run.info.max_concurrency == 3
    assert run.summary.replay.server["data"][0]["id"] == MODEL and run.summary.slo.all_met is True
    assert run.info.trace == TRACE + ",concurrency=3" and run.info.tokenizer is None and run.info.vocab_size == 256


def test_replay_prints_a_table(server) -> None:
    result = runner.invoke(app, ["replay", "--url", server.url, "--trace", TRACE, "--model", "other"])
    assert result.exit_code == 0, result.output
    assert "TTFT" in result.stdout and "6/6 requests finished" in result.stdout
    assert server.received[-1]["model"] == "other"


def closed_port_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("args, message", [
    (["--url", "ftp://example.com/v1"], "not an http(s) URL"),
    (["--url", "http://"], "--url"),
    (["--url", "CLOSED"], "no server answers at"),
    (["--trace", "missing.csv"], "no trace file"),
    (["--trace", "synthetic:num=x"], "not a number"),
    (["--slo", "ttft=2s"], "unknown SLO"),
    (["--max-concurrency", "0"], "--max-concurrency"),
    (["--max-concurrency", "3", "--trace", "synthetic:num=4,concurrency=2"], "disagree"),
    (["--vocab-size", "0"], "--vocab-size"),
    (["--tokenizer", "no/such/folder"], "--tokenizer"),
    (["--request-timeout", "0"], "--request-timeout"),
])
def test_replay_bad_input_exits_2_with_one_line(server, args, message) -> None:
    args = [closed_port_url() if a == "CLOSED" else a for a in args]
    defaults = {"--url": server.url, "--trace": TRACE}
    for flag in args[::2]:
        defaults.pop(flag, None)
    result = runner.invoke(app, ["replay", *args, *(x for kv in defaults.items() for x in kv)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def summary_file(path, **changes) -> str:
    summary = {"num_requests": 10, "ttft_s": {"mean": 0.2, "p50": 0.1, "p90": 0.3, "p99": 0.5},
               "tpot_s": {"mean": 0.02, "p50": 0.02, "p90": 0.03, "p99": 0.04},
               "itl_s": {"mean": 0.02, "p50": 0.02, "p90": 0.03, "p99": None},
               "throughput": {"requests_per_s": 2.0, "output_tokens_per_s": 100.0, "total_tokens_per_s": 300.0}}
    for key, value in changes.items():
        part, _, stat = key.partition("__")
        summary[part][stat] = value
    path.write_text(json.dumps(summary))
    return str(path)


def test_compare_gives_zero_against_itself_and_the_relative_error_otherwise(tmp_path) -> None:
    a = summary_file(tmp_path / "a.json")
    same = runner.invoke(app, ["compare", a, a, "--json"])
    assert same.exit_code == 0, same.output
    metrics = json.loads(same.stdout)["metrics"]
    assert metrics["ttft_s.p99"] == {"a": 0.5, "b": 0.5, "relative_error": 0.0}
    assert all(m["relative_error"] == 0.0 for k, m in metrics.items() if m["a"] is not None)
    assert metrics["itl_s.p99"]["a"] is None and metrics["e2e_s.mean"] == {"a": None, "b": None, "relative_error": None}
    b = summary_file(tmp_path / "b.json", ttft_s__p99=0.4, throughput__requests_per_s=2.5)
    diff = json.loads(runner.invoke(app, ["compare", a, b, "--json"]).stdout)["metrics"]
    assert diff["ttft_s.p99"]["relative_error"] == pytest.approx(0.25)
    assert diff["throughput.requests_per_s"]["relative_error"] == pytest.approx(-0.2)
    assert diff["ttft_s.mean"]["relative_error"] == 0.0
    table = runner.invoke(app, ["compare", a, str(tmp_path / "b.json")])
    assert table.exit_code == 0 and "+25.0%" in table.stdout and "missing" in table.stdout


def test_compare_reads_a_replay_folder_against_a_simulation(server, tmp_path) -> None:
    replayed = runner.invoke(app, ["replay", "--url", server.url, "--trace", TRACE, "--json", "--out",
                                   str(tmp_path / "replay")])
    simulated = runner.invoke(app, ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--trace", TRACE,
                                    "--workers", "1", "--json", "--out", str(tmp_path / "sim")])
    assert replayed.exit_code == simulated.exit_code == 0, replayed.output + simulated.output
    result = runner.invoke(app, ["compare", str(tmp_path / "sim"), str(tmp_path / "replay"), "--json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)["metrics"]
    assert all(m["relative_error"] is not None for m in metrics.values())


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"), ("{not json", "is not JSON"), ('{"ttft_s": {}}', "not a run summary"), ("[1, 2]", "not a run summary")])
def test_compare_refuses_what_is_not_a_summary(tmp_path, content, message) -> None:
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    good = summary_file(tmp_path / "good.json")
    result = runner.invoke(app, ["compare", good, str(bad)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_replay_records_the_deployment_and_warms_up_on_prompts_of_its_own(server, tmp_path) -> None:
    before = len(server.received)
    result = runner.invoke(app, ["replay", "--url", server.url, "--trace", TRACE, "--model",
                                 "meta-llama/Llama-3.1-8B-Instruct", "--deployment", "hardware=h100-sxm,tp=2",
                                 "--warmup", "3", "--out", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    sent = server.received[before:]
    warm, timed = sent[:3], sent[3:]
    assert len(timed) == 6 and json.loads(result.stdout)["num_requests"] == 6  # the warm-up is not recorded
    assert not {tuple(w["prompt"][:4]) for w in warm} & {tuple(t["prompt"][:4]) for t in timed}
    info = read_replay(tmp_path / "r").info
    # The model's catalog id from the served name, the rest as stated.
    assert info.deployment == {"model": "llama-3.1-8b", "hardware": "h100-sxm", "tp": 2}
    assert info.prompt_seed is not None


def test_each_replay_draws_new_prompts_unless_told_the_seed(server) -> None:
    def first_prompts(*extra: str) -> list:
        before = len(server.received)
        assert runner.invoke(app, ["replay", "--url", server.url, "--trace", TRACE, *extra]).exit_code == 0
        return sorted(r["prompt"] for r in server.received[before:])  # arrival order at the server varies

    assert first_prompts() != first_prompts()  # no replay hits what an earlier one left in a prefix cache
    assert first_prompts("--prompt-seed", "7") == first_prompts("--prompt-seed", "7")
    assert sorted(map(len, first_prompts())) == sorted(map(len, first_prompts()))  # the workload's seed keeps lengths


@pytest.mark.parametrize("args, message", [
    (["--deployment", "tp"], "not key=value"),
    (["--deployment", "gpus=2"], "unknown field 'gpus'"),
    (["--warmup", "-1"], "--warmup"),
    (["--prompt-seed", "-1"], "--prompt-seed"),
])
def test_replay_refuses_a_bad_deployment_or_warmup(server, args, message) -> None:
    result = runner.invoke(app, ["replay", "--url", server.url, "--trace", TRACE, *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_the_deployment_names_the_catalog_model_of_the_weights_a_card_serves() -> None:
    from app.replay_command import deployment_of

    card = {"data": [{"id": "chat", "root": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 4096}]}
    assert deployment_of({"hardware": "h100-sxm"}, card, "chat") == {"hardware": "h100-sxm", "model": "llama-3.1-8b"}
    assert deployment_of({}, {"data": [{"id": "chat"}]}, "chat") is None  # nothing known: nothing recorded
    reported = {"data": [{"id": "demo", "deployment": {"model": "servecast-demo", "hardware": "cpu-local", "tp": 1}}]}
    assert deployment_of({"tp": 2}, reported, "demo") == {"model": "servecast-demo", "hardware": "cpu-local", "tp": 2}


def test_a_warm_up_leaves_nothing_a_later_replay_could_hit(server) -> None:
    def prompts(*extra: str) -> set:
        before = len(server.received)
        assert runner.invoke(app, ["replay", "--url", server.url, "--trace", TRACE, *extra]).exit_code == 0
        return {tuple(r["prompt"]) for r in server.received[before:]}

    warmed = prompts("--prompt-seed", "1", "--warmup", "3")
    for seed in ("1", "2"):
        assert not prompts("--prompt-seed", seed) & (warmed - prompts("--prompt-seed", "1"))



def test_a_replay_with_failures_lists_every_reason_once_and_exits_non_zero() -> None:
    from app.replay_command import REQUESTS_FAILED

    trace = "synthetic:num=12,input=uniform(10,30),output=uniform(2,6),rate=50"
    # Two kinds of refusal, and a card that says how long a sequence the server takes.
    with serving(FakeServer(first_token_s=0.0, token_s=0.001, reject_max_tokens=frozenset({2, 3}),
                            max_model_len=30)) as fake:
        result = runner.invoke(app, ["replay", "--url", fake.url, "--trace", trace])
    assert result.exit_code == REQUESTS_FAILED, result.output
    assert "warning: " in result.stderr and "max_model_len=30" in result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("failed ")]
    reasons = [line.split(": ", 1)[1] for line in failed]
    assert len(failed) == 2 and len(set(reasons)) == 2  # each reason once, with its count
    counts = sum(int(line.split()[1].rstrip(":")) for line in failed)
    finished = int(result.stdout.split("/12 requests finished")[0].split()[-1])
    assert counts == 12 - finished > 0
