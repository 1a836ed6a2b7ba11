"""Routers: which replica gets an arriving request. No torch.

* round_robin               replicas in turn
* least_outstanding_tokens  the replica with the fewest prompt + output tokens still to serve
* prefix_affinity           requests that share their first prompt segment (a system prompt, a
                            Mooncake hash block) go to the replica that served that segment before,
                            unless it carries more than twice the least loaded replica's
                            outstanding tokens (plus one request's worth); otherwise least outstanding
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.workload.requests import Request

ROUTERS = ("round_robin", "least_outstanding_tokens", "prefix_affinity")


class Router:
    def __init__(self, kind: str, replicas: Sequence) -> None:
        if kind not in ROUTERS:
            raise ValueError(f"unknown router {kind!r}; use one of {', '.join(ROUTERS)}")
        self.kind, self.replicas = kind, replicas
        self._next = 0
        self._home: dict[int, int] = {}  # first segment id -> replica index

    def route(self, request: Request):
        replicas = self.replicas
        if len(replicas) == 1:
            return replicas[0]
        if self.kind == "round_robin":
            replica = replicas[self._next]
            self._next = (self._next + 1) % len(replicas)
            return replica
        least = min(replicas, key=lambda r: r.outstanding_tokens)
        if self.kind == "least_outstanding_tokens" or not request.segments:
            return least
        home = self._home.get(request.segments[0])
        if home is not None:
            candidate = replicas[home]
            slack = request.prompt_tokens + request.output_tokens
            if candidate.outstanding_tokens <= 2 * least.outstanding_tokens + slack:
                return candidate
        self._home[request.segments[0]] = least.index
        return least
