"""Replaying a workload against an OpenAI-compatible server (vLLM, SGLang, servecast's own, ...):
each request sent at its arrival time as a streamed completion with its output length forced, and
everything the client sees recorded.

Requests are POST {url}/completions with stream, stream_options.include_usage, max_tokens and
min_tokens both the trace's output length, ignore_eos and temperature 0 (min_tokens and ignore_eos
are vLLM's extras: with them the output length is the trace's whatever the model says; a server that
ignores them may stop early, and the records show it). One connection per request in flight.

Open loop, latency runs from each request's *scheduled* arrival (its time in the trace after the
replay's start), as the simulator's TTFT and E2E run from arrival: a request sent late because
the client fell behind has that wait in its latency, and send_s says how long it was. Under
closed-loop clients (the workload's Clients: `--max-concurrency C` or `concurrency=C[,think=S]` in
the trace) at most C requests are in flight, each sent in order when a client is free (think
seconds after its last request ended) and not before its arrival; its latency runs from that
send, as `vllm bench serve --max-concurrency` measures and the simulator's clients record
(simulator/fleet/clients.py), and its arrival_s is the send.

Token times are the arrivals of streamed chunks that carry text (one token each on vLLM and on
servecast's server). Output and prompt token counts are the final usage chunk's; a server that
sends none gets the chunks counted and the trace's prompt length. A request that fails (an HTTP
error status, an error chunk, a broken connection or stream, a timeout) is recorded with its error
and never stops the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import pandas as pd

from simulator.workload.requests import Workload

CONNECT_TIMEOUT_S = 30.0


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds after the replay's start (nan: never)."""

    request_id: int
    arrival_s: float  # scheduled
    prompt_tokens: int  # the server's count where it reports usage, else the trace's
    requested_output_tokens: int  # the trace's
    send_s: float = math.nan
    token_times_s: list[float] = field(default_factory=list)
    finish_s: float = math.nan  # the stream's end
    output_tokens: int | None = None  # usage.completion_tokens; None: not reported
    cached_prompt_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where reported
    http_status: int | None = None
    error: str = ""


def base_url(url: str) -> str:
    """The API base (http://host:port/v1) without a trailing slash; ValueError if it is not one."""
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"--url {url!r} is not a URL ({exc}): give e.g. http://127.0.0.1:8000/v1") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"--url {url!r} is not an http(s) URL with a host: give e.g. http://127.0.0.1:8000/v1")
    return str(parsed).rstrip("/")


def server_models(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> dict | None:
    """What GET {url}/models returns (None where the server answers with an error status or not JSON);
    ValueError when nothing answers."""
    try:
        response = httpx.get(f"{url}/models", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ValueError(f"no server answers at {url} ({type(exc).__name__}: {exc})") from None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if response.is_success and isinstance(body, dict) else None


def first_model(models: dict | None, url: str) -> str:
    """The first model id of a GET /models answer; ValueError with the fix where there is none."""
    data = (models or {}).get("data")
    if not data or not isinstance(data, list) or not isinstance(data[0], dict) or "id" not in data[0]:
        raise ValueError(f"{url}/models lists no model: give --model NAME")
    return str(data[0]["id"])


def served_max_model_len(models: dict | None, model: str) -> int | None:
    """The longest sequence (prompt + output tokens) the server takes for `model`, where its card
    says (vLLM's and servecast's give max_model_len); None otherwise."""
    for card in (models or {}).get("data") or []:
        if isinstance(card, dict) and card.get("id") == model and isinstance(card.get("max_model_len"), int):
            return card["max_model_len"]
    return None


def reported_deployment(models: dict | None, model: str) -> dict:
    """The deployment servecast's server reports in the card of `model` (calibrate/runs/deployment.py);
    {} from a server that reports none."""
    for card in (models or {}).get("data") or []:
        if isinstance(card, dict) and card.get("id") == model and isinstance(card.get("deployment"), dict):
            return dict(card["deployment"])
    return {}


def completion_payload(model: str, prompt: list[int] | str, output_tokens: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": output_tokens, "min_tokens": output_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}


def replay(url: str, model: str, workload: Workload, prompts: Sequence[list[int] | str],
           timeout_s: float | None = None, on_done: Callable[[int], None] | None = None) -> list[RequestRecord]:
    """Send every request of the workload (with prompts[i] for its i-th request) at its arrival
    time after the first's, or as its closed-loop clients free up (the module's docstring), and
    record each; on_done(number finished or failed so far) after each. timeout_s: the longest wait
    for any byte of a response (None: no limit)."""
    if not len(workload):
        raise ValueError(f"{workload.name} holds no requests to replay")
    return asyncio.run(_replay(url, model, workload, prompts, timeout_s, on_done))


async def _replay(url, model, workload, prompts, timeout_s, on_done) -> list[RequestRecord]:
    t0 = workload.requests[0].arrival_s
    records = [RequestRecord(r.request_id, r.arrival_s - t0, r.prompt_tokens, r.output_tokens) for r in workload]
    clients = workload.clients
    slots = asyncio.Semaphore(clients.concurrency) if clients else contextlib.nullcontext()
    think_s = clients.think_s if clients else 0.0
    done = 0
    most = clients.concurrency if clients else None
    limits = httpx.Limits(max_connections=most, max_keepalive_connections=most)
    timeout = httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        start = time.perf_counter()

        async def one(record: RequestRecord, prompt) -> None:
            nonlocal done
            record.send_s = time.perf_counter() - start
            if clients:
                record.arrival_s = record.send_s  # a closed loop's latency runs from the send
            payload = completion_payload(model, prompt, record.requested_output_tokens)
            await _send(client, f"{url}/completions", payload, record, start)
            done += 1
            if on_done is not None:
                on_done(done)
            if think_s:
                await asyncio.sleep(think_s)  # the client holds its slot while it thinks

        async def held(record: RequestRecord, prompt) -> None:
            try:
                await one(record, prompt)
            finally:
                if clients:
                    slots.release()

        tasks = []
        for record, prompt in zip(records, prompts, strict=True):
            if clients:
                await slots.acquire()  # in order: the next request waits for a free client
            wait = start + record.arrival_s - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(held(record, prompt)))
        await asyncio.gather(*tasks)
    return records


async def _send(client: httpx.AsyncClient, url: str, payload: dict, record: RequestRecord, start: float) -> None:
    try:
        async with client.stream("POST", url, json=payload) as response:
            record.http_status = response.status_code
            if not response.is_success:
                record.error = _error_text(response.status_code, await response.aread())
                return
            await _read_stream(response, record, start)
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
    except (ValueError, TypeError) as exc:  # a chunk that is not JSON, or not of the API's shape
        record.error = f"bad stream: {exc}"
    finally:
        record.finish_s = time.perf_counter() - start


async def _read_stream(response: httpx.Response, record: RequestRecord, start: float) -> None:
    """Reads the SSE stream (`data: {json}` lines, `data: [DONE]` last) into the record."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        data = line[5:].strip()
        if data == "[DONE]":
            return
        now = time.perf_counter() - start
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"chunk {data[:80]!r} is not a JSON object")
        if "error" in chunk:
            record.error = _message(chunk) or data[:200]
            return
        if any(isinstance(c, dict) and c.get("text") for c in chunk.get("choices") or ()):
            record.token_times_s.append(now)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            record.output_tokens = int(usage.get("completion_tokens", len(record.token_times_s)))
            record.prompt_tokens = int(usage.get("prompt_tokens", record.prompt_tokens))
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                record.cached_prompt_tokens = int(details["cached_tokens"])
    record.error = "the stream ended without data: [DONE]"


def _message(body) -> str:
    """An OpenAI-style error body's message ({"error": {"message": ...}} or {"error": "..."}), or ''."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or "")
    return str(error or body.get("message") or "") if isinstance(body, dict) else ""


def _error_text(status: int, body: bytes) -> str:
    try:
        message = _message(json.loads(body))
    except ValueError:
        message = ""
    return f"HTTP {status}: {message or body.decode(errors='replace').strip()[:200]}"


def records_frame(records: list[RequestRecord]) -> pd.DataFrame:
    """The records as the simulator's requests frame where a column means the same
    (simulator/fleet/metrics.py: its definitions, vLLM's), plus what only a client sees: send_s,
    token_times_s (every streamed chunk), requested_output_tokens, http_status, and the error as
    reason of a request whose status is "error". A failed request keeps the tokens it got, and its
    finish_s is when the failure was seen. Records of at least one request."""
    rows = []
    for r in sorted(records, key=lambda r: r.request_id):
        first = r.token_times_s[0] if r.token_times_s else math.nan
        output = r.output_tokens if r.output_tokens is not None else len(r.token_times_s)
        gaps = [b - a for a, b in zip(r.token_times_s, r.token_times_s[1:])]
        rows.append({"request_id": r.request_id, "arrival_s": r.arrival_s, "send_s": r.send_s,
                     "prompt_tokens": r.prompt_tokens, "output_tokens": output,
                     "requested_output_tokens": r.requested_output_tokens,
                     "cached_prompt_tokens": r.cached_prompt_tokens, "first_token_s": first,
                     "finish_s": r.finish_s, "itl_max_s": max(gaps) if gaps else math.nan,
                     "token_times_s": list(r.token_times_s), "status": "error" if r.error else "finished",
                     "reason": r.error, "http_status": r.http_status})
    df = pd.DataFrame(rows)
    df["cached_prompt_tokens"] = df["cached_prompt_tokens"].astype("Int64")
    df["http_status"] = df["http_status"].astype("Int64")
    df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    df["e2e_s"] = df["finish_s"] - df["arrival_s"]
    decode_tokens = (df["output_tokens"] - 1).where(df["output_tokens"] > 1)
    df["tpot_s"] = (df["finish_s"] - df["first_token_s"]) / decode_tokens
    return df

