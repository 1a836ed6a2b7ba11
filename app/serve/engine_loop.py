"""The engine process's loop: step the engine, take commands between steps, hand out outputs.

Invariant: only this loop touches the LLMEngine. Commands (add, abort, stop) come from `commands`
(anything with get(timeout) / get_nowait() raising queue.Empty: app/serve/engine_process.py
feeds it from a pipe); each request's outputs go to its sink (an opaque key the loop passes
back). The loop hands every step's (sink, item) pairs to `deliver` in one call, where an item is
a RequestOutput, or an error string when the engine refused the request or stopped. Every request
ends with exactly one final item: a finished output (an aborted request's finish reason is the
abort's), or an error string. `on_state` hears every change of the load it reports.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.engine import LLMEngine


@dataclass(frozen=True)
class LoadState:
    """What the loop last saw, for /metrics and the queue limit."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    free_blocks: int = 0


class EngineLoop:
    def __init__(self, engine: "LLMEngine", commands, deliver: Callable[[list[tuple[Any, Any]]], None],
                 on_state: Callable[[LoadState], None] = lambda state: None) -> None:
        self.engine, self.commands, self.deliver, self.on_state = engine, commands, deliver, on_state
        self._sinks: dict[str, Any] = {}
        self._stopping = False
        self.state = self._read_state()

    def _read_state(self) -> LoadState:
        scheduler = self.engine.scheduler
        manager = scheduler.block_manager
        return LoadState(len(scheduler.running), len(scheduler.waiting), manager.usage, manager.num_free_blocks)

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            _, request_id, prompt, params, sink = command
            try:
                self.engine.add_request(request_id, prompt, params)
            except ValueError as exc:  # refused: the client hears why, the others are untouched
                self.deliver([(sink, str(exc))])
                return
            self._sinks[request_id] = sink
        elif kind == "abort":
            _, request_id, reason = command
            sink = self._sinks.pop(request_id, None)
            if sink is not None:  # not finished yet: its blocks go back to the pool now
                self.deliver([(sink, replace(self.engine.abort_request(request_id), finish_reason=reason))])
        elif kind == "stop":
            self._stopping = True

    def run(self) -> None:
        """Step the engine until a stop command (or the commands' source closes: EOFError)."""
        engine = self.engine
        try:
            while not self._stopping:
                try:
                    busy = engine.has_unfinished_requests()
                    self._apply(self.commands.get_nowait() if busy else self.commands.get(timeout=1.0))
                    while True:  # everything queued meanwhile joins this step
                        self._apply(self.commands.get_nowait())
                except queue.Empty:
                    pass
                if engine.has_unfinished_requests():
                    batch = []
                    for out in engine.step():
                        if out.finished:
                            sink = self._sinks.pop(out.request_id, None)
                        else:
                            sink = self._sinks.get(out.request_id)
                        if sink is not None:
                            batch.append((sink, out))
                    if batch:
                        self.deliver(batch)
                state = self._read_state()
                if state != self.state:
                    self.state = state
                    self.on_state(state)
        except EOFError:
            return
        except Exception as exc:  # a bug in a step: every waiting client hears it, none hangs
            self.deliver([(sink, f"the engine stopped: {exc!r}") for sink in self._sinks.values()])
            self._sinks.clear()
            raise
