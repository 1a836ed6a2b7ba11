"""One thread steps the engine; the server's requests reach it through a thread-safe queue.

Invariant: only the loop thread touches the LLMEngine. HTTP handlers submit and abort by putting
commands on the queue, and each request's outputs come back through its sink, a callable the loop
calls with every new RequestOutput (or an error string when the engine refused the request). The
sink must not block: the server's sink hands the item to its asyncio queue with
call_soon_threadsafe.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.engine import LLMEngine
    from engine.outputs import RequestOutput

Sink = Callable[["RequestOutput | str"], None]


class Observer(Protocol):
    """Sees every output on the loop thread (the server's metrics), an aborted request's too."""

    def on_output(self, out: "RequestOutput") -> None: ...


@dataclass(frozen=True)
class LoadState:
    """What the loop last saw, for /metrics and the queue limit (read from any thread)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    free_blocks: int = 0


class EngineLoop:
    def __init__(self, engine: "LLMEngine", observer: Observer | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._submitted = 0  # requests put on the queue, not yet finished, aborted or refused
        self._count_lock = threading.Lock()
        self.state = self._read_state()
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    @property
    def started(self) -> bool:
        return self._thread.is_alive()

    @property
    def outstanding(self) -> int:
        """Requests submitted and not yet done (running, waiting, or still on the queue)."""
        return self._submitted

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams, sink: Sink) -> None:
        with self._count_lock:
            self._submitted += 1
        self._commands.put(("add", request_id, prompt, params, sink))

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """Stop a request (a client gone: "abort"; a stop string the server matched: "stop")."""
        self._commands.put(("abort", request_id, reason))

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._commands.put(("wake",))
        self._thread.join(timeout)

    # -- the loop thread ------------------------------------------------------------------------
    def _read_state(self) -> LoadState:
        scheduler = self.engine.scheduler
        manager = scheduler.block_manager
        return LoadState(len(scheduler.running), len(scheduler.waiting), manager.usage, manager.num_free_blocks)

    def _done(self, request_id: str) -> None:
        self._sinks.pop(request_id, None)
        with self._count_lock:
            self._submitted -= 1

    def _apply(self, command: tuple) -> None:
        if command[0] == "add":
            _, request_id, prompt, params, sink = command
            try:
                self.engine.add_request(request_id, prompt, params)
            except ValueError as exc:  # refused: the client hears why, the others are untouched
                sink(str(exc))
                with self._count_lock:
                    self._submitted -= 1
                return
            self._sinks[request_id] = sink
        elif command[0] == "abort":
            _, request_id, reason = command
            if request_id in self._sinks:  # not finished yet: its blocks go back to the pool now
                out = self.engine.abort_request(request_id)
                self._done(request_id)
                if self.observer is not None:
                    self.observer.on_output(replace(out, finish_reason=reason))

    def _run(self) -> None:
        engine = self.engine
        try:
            while not self._stopping:
                block = not engine.has_unfinished_requests()
                try:
                    command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
                    self._apply(command)
                    while True:  # everything queued meanwhile joins this step
                        self._apply(self._commands.get_nowait())
                except queue.Empty:
                    pass
                if engine.has_unfinished_requests():
                    for out in engine.step():
                        if self.observer is not None:
                            self.observer.on_output(out)
                        sink = self._sinks.get(out.request_id)
                        if sink is not None:
                            sink(out)
                        if out.finished:
                            self._done(out.request_id)
                self.state = self._read_state()
        except BaseException as exc:  # a bug in a step: every waiting client hears it, none hangs
            self.error = exc
            for sink in list(self._sinks.values()):
                sink(f"the engine stopped: {exc!r}")
            self._sinks.clear()
            raise
