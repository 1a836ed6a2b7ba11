"""The engine in a process of its own, and the server's handle on it (EngineClient).

Why a process: the engine's step is many small torch calls, each giving up and taking back the
GIL, so any Python thread beside it (the HTTP event loop) slows it down: on this 2-core machine a
thread busy 10 % of the time cut the engine's throughput by a third. vLLM's V1 splits its API
server from its engine core for the same reason. Commands go down one pipe; each step's outputs
(only the new tokens) and load changes come up another, read by one thread of the server that
sleeps in recv meanwhile.

The server checks requests itself (engine/policy/admission.py) against a copy of the engine's scheduler
that never schedules, so a bad request is refused without a round trip.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.serve.engine_loop import EngineLoop, LoadState
from engine.policy.admission import checked_sequence
from engine.outputs import RequestOutput
from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import Scheduler


@dataclass(frozen=True)
class EngineFacts:
    """What the server needs from the engine process: who it is and what it admits."""

    described: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    scheduler_config: Any
    cache_config: Any
    state: LoadState  # at the start


@dataclass(frozen=True)
class Progress:
    """One request's news from a step: its new tokens and where it stands."""

    request_id: str
    new_tokens: list[int]
    new_times: list[float]
    finished: bool
    finish_reason: str | None
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_preemptions: int
    num_cached_prompt_tokens: int


class _PipeCommands:
    """A connection read as the loop's command queue."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def get(self, timeout: float):
        if not self.conn.poll(timeout):
            raise queue.Empty
        return self.conn.recv()

    def get_nowait(self):
        return self.get(0.0)


def engine_main(make_engine: Callable[[], tuple[Any, str]], commands, outputs) -> None:
    """The engine process: build the engine, say so (or why not), then run its loop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which drains, then stops us
    try:
        engine, described = make_engine()
    except ValueError as exc:
        outputs.send(("failed", str(exc)))
        return
    sent: dict[str, int] = {}  # tokens already sent, per request

    def deliver(batch) -> None:
        news = []
        for request_id, item in batch:
            if isinstance(item, str):
                news.append((request_id, item))
                continue
            have = sent.get(request_id, 0)
            news.append((request_id, Progress(
                request_id, item.output_token_ids[have:], item.token_times[have:], item.finished, item.finish_reason,
                item.first_scheduled_time, item.first_token_time, item.finish_time, item.num_preemptions,
                item.num_cached_prompt_tokens)))
            if item.finished:
                sent.pop(request_id, None)
            else:
                sent[request_id] = len(item.output_token_ids)
        outputs.send(("outputs", news))  # the load after this step follows as a "state" message

    loop = EngineLoop(engine, _PipeCommands(commands), deliver, lambda state: outputs.send(("state", state)))
    outputs.send(("ready", EngineFacts(described, engine.model_config.vocab_size, engine.model_config.eos_token_ids,
                                       engine.scheduler_config, engine.cache_config, loop.state)))
    try:
        loop.run()
    finally:
        engine.close()


def call_each(batch: list) -> None:
    """Hand each (sink, item) pair's item to its sink, on the calling thread."""
    for sink, item in batch:
        sink(item)


@dataclass
class _Request:
    prompt: list[int]
    arrival_time: float
    sink: Callable
    tokens: list[int]
    times: list[float]


class EngineClient:
    """The server's side: submit, abort, check, and each request's outputs (whole RequestOutputs,
    rebuilt from the news) handed to `deliver` with their sinks, one call a step. `observer`
    (the metrics) sees every output first, on the reading thread."""

    def __init__(self, make_engine: Callable[[], tuple[Any, str]], observer=None, start_timeout: float = 600.0):
        context = multiprocessing.get_context("spawn")
        self._commands, child_commands = context.Pipe(duplex=False)[::-1]
        parent_outputs, child_outputs = context.Pipe(duplex=False)
        self.process = context.Process(target=engine_main, args=(make_engine, child_commands, child_outputs),
                                       name="servecast-engine", daemon=True)
        self.process.start()
        child_commands.close()
        child_outputs.close()
        self._outputs = parent_outputs
        if not parent_outputs.poll(start_timeout):
            self.process.kill()
            raise ValueError(f"the engine did not start within {start_timeout:.0f} s")
        try:
            kind, payload = parent_outputs.recv()
        except EOFError:
            raise ValueError(f"the engine process died while starting (exit code {self.process.exitcode})") from None
        if kind == "failed":
            self.process.join()
            raise ValueError(payload)
        self.facts: EngineFacts = payload
        self._check = Scheduler(payload.scheduler_config, payload.cache_config, payload.eos_token_ids)
        self.max_model_len: int = payload.scheduler_config.max_model_len
        self.observer = observer
        self.deliver: Callable[[list], None] = call_each
        self.state: LoadState = payload.state
        self.error: str | None = None
        self._requests: dict[str, _Request] = {}
        self._lock = threading.Lock()  # _requests: the handlers' thread adds, the reader removes
        self._reader = threading.Thread(target=self._read, name="engine-outputs", daemon=True)
        self._reader.start()

    @property
    def outstanding(self) -> int:
        """Requests submitted and not yet ended."""
        return len(self._requests)

    def check_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        checked_sequence(self._check, self.facts.vocab_size, request_id, prompt, params, 0.0)

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams, sink: Callable,
               arrival_time: float) -> None:
        with self._lock:
            self._requests[request_id] = _Request(prompt, arrival_time, sink, [], [])
        self._commands.send(("add", request_id, prompt, params, request_id))

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """Stop a request (a client gone: "abort"; a stop string the server matched: "stop")."""
        if request_id in self._requests:
            self._commands.send(("abort", request_id, reason))

    def stop(self, timeout: float = 30.0) -> None:
        try:
            self._commands.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()

    def _read(self) -> None:
        while True:
            try:
                kind, *payload = self._outputs.recv()
            except (EOFError, OSError):
                break
            if kind == "state":
                self.state = payload[0]
                continue
            (news,) = payload
            batch = []
            for request_id, item in news:
                out = self._rebuild(request_id, item)
                if out is not None:
                    batch.append(out)
            if batch:
                self.deliver(batch)
        if self.error is None and self.process.exitcode not in (0, None):
            self.error = f"the engine process exited with code {self.process.exitcode}"
        with self._lock:
            ended, self._requests = self._requests, {}
        if ended:
            self.deliver([(r.sink, self.error or "the engine stopped") for r in ended.values()])

    def _rebuild(self, request_id: str, item: "Progress | str"):
        request = self._requests.get(request_id)
        if request is None:
            return None
        if isinstance(item, str):
            with self._lock:
                del self._requests[request_id]
            if item.startswith("the engine stopped"):
                self.error = item
            return request.sink, item
        request.tokens.extend(item.new_tokens)
        request.times.extend(item.new_times)
        out = RequestOutput(request_id, request.prompt, list(request.tokens), item.finished, item.finish_reason,
                            request.arrival_time, item.first_scheduled_time, item.first_token_time, item.finish_time,
                            list(request.times), item.num_preemptions, item.num_cached_prompt_tokens)
        if self.observer is not None:
            self.observer.on_output(out)
        if item.finished:
            with self._lock:
                del self._requests[request_id]
        return request.sink, out
