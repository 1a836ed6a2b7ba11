"""What happens around requests: a client that leaves, a full queue, SIGTERM with streams in flight,
and bad command lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from app.serve.tokenizers import ByteTokenizer
from calibrate.runs.deployment import deployment_config
from tests.app.serve.helpers import free_port, running_server, wait_for


def open_stream(url: str, prompt: list[int], max_tokens: int):
    """A streaming request left open: (the response, its line iterator)."""
    client = httpx.Client(timeout=60)
    request = client.build_request("POST", url + "/completions", json={
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True})
    response = client.send(request, stream=True)
    return client, response, response.iter_lines()


def next_chunk(lines) -> dict:
    for line in lines:
        if line.startswith("data: "):
            return json.loads(line[6:])
    raise AssertionError("the stream ended")


def test_a_client_that_disconnects_mid_stream_frees_its_blocks() -> None:
    with running_server(ByteTokenizer(), max_model_len=512) as (url, state):
        free_at_start = state.loop.state.free_blocks
        client, response, lines = open_stream(url, list(range(1, 40)), 470)  # running until it is aborted
        next_chunk(lines), next_chunk(lines)
        wait_for(lambda: state.loop.state.free_blocks < free_at_start)
        response.close()
        client.close()
        wait_for(lambda: state.loop.outstanding == 0 and state.loop.state.running == 0)
        wait_for(lambda: state.loop.state.free_blocks == free_at_start)
        # the server goes on serving
        done = httpx.post(url + "/completions", json={"prompt": [5, 6], "max_tokens": 3, "ignore_eos": True})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3


def test_a_full_queue_gets_429_with_retry_after() -> None:
    # The first request must still be running when the third arrives: it asks for as many tokens
    # as the model's positions allow, and is aborted when its stream closes.
    with running_server(ByteTokenizer(), max_queued_requests=1, max_num_seqs=1, max_model_len=512) as (url, state):
        first = open_stream(url, [1, 2, 3], 509)
        next_chunk(first[2])  # running
        second = open_stream(url, [4, 5, 6], 4)
        wait_for(lambda: state.loop.state.waiting == 1)
        refused = httpx.post(url + "/completions", json={"prompt": [7, 8], "max_tokens": 2})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        for client, response, _ in (first, second):
            response.close()
            client.close()
        wait_for(lambda: state.loop.outstanding == 0)
        assert httpx.post(url + "/completions", json={"prompt": [7, 8], "max_tokens": 2}).status_code == 200


def serving_process(*args: str) -> tuple[subprocess.Popen, str]:
    """`servecast serve` in its own process on a free port, once it answers: (the process, its API URL).
    The caller kills it."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), *args],
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert "OpenAI API at" in server.stderr.readline()
        url = f"http://127.0.0.1:{port}/v1"
        wait_for(lambda: _healthy(url), timeout=60)
    except BaseException:
        server.kill()
        raise
    return server, url


def test_sigterm_lets_the_streams_in_flight_finish() -> None:
    server, url = serving_process("--max-num-seqs", "8", "--threads", "1")
    try:
        # The model card says what the simulator needs to replay this server.
        deployed = httpx.get(url + "/models").json()["data"][0]["deployment"]
        config = deployment_config(deployed, "served", profile="any.jsonl")
        assert (config.model, config.hardware, config.max_num_seqs, config.quant) == \
            ("servecast-demo", "cpu-local", 8, "fp32")
        results: dict[int, list[dict]] = {}
        started = threading.Barrier(4)

        def run(i: int) -> None:
            client, response, lines = open_stream(url, [10 + i, 11, 12], 60)
            chunks = [next_chunk(lines)]
            started.wait()
            for line in lines:
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
            results[i] = chunks
            client.close()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        started.wait()
        server.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert server.wait(120) == 0
        for chunks in results.values():
            assert len(chunks) == 60 and chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert len(results) == 3
    finally:
        server.kill()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize("args, message", [
    (["--model", "no/such/config.json"], "no such file"),
    (["--tokenizer", "."], "tokenizer"),
    (["--port", "0"], "--port"),
    (["--max-queued-requests", "-1"], "--max-queued-requests"),
    (["--threads", "0"], "--threads"),
    (["--hardware", "h1000"], "h1000"),
])
def test_bad_command_lines_exit_2_with_one_clear_line(args, message) -> None:
    done = subprocess.run([sys.executable, "-m", "app.cli", "serve", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_a_stream_still_running_when_the_grace_period_ends_gets_an_error_event() -> None:
    server, url = serving_process("--threads", "1", "--grace-period", "1")
    try:
        client, response, lines = open_stream(url, [10, 11, 12], 1000)  # far longer than the grace period
        first = next_chunk(lines)
        server.send_signal(signal.SIGTERM)
        events = [first] + [json.loads(line[6:]) for line in lines if line.startswith("data: ")
                            and line != "data: [DONE]"]
        client.close()
        assert server.wait(60) == 0
        log = server.stderr.read()
        assert "error" in events[-1] and "shutting down" in events[-1]["error"]["message"]
        assert len(events) < 1000 and "ended 1 stream" in log
        assert "Traceback" not in log and "Exception in ASGI" not in log, log
    finally:
        server.kill()


def test_a_port_in_use_is_said_before_anything_starts() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--port", str(port)], capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 2 and "OpenAI API at" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "in use" in done.stderr
