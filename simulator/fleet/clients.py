"""Closed-loop clients in the simulation (simulator/workload/requests.py's Clients): at most C
requests in flight, the next one sent when a client is free, as `vllm bench serve
--max-concurrency` and concurrency sweeps (aiperf, guidellm's concurrent profile) send them. No torch.

The gate is the replicas' arrival clock too. A steady decode run is planned up to the next arrival
at the cluster (replica_runs.py), which must never be later than the true one. While every client
waits on a request, the next send is unknown: it follows a finish that has not happened. Any finish
comes at or after the moment it is booked, so `now + think + ingress` is a safe lower bound,
read afresh each time (a run planned against it wakes at the end of each step past it and plans
again, as it does for arrivals that go to another replica).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import replace

import simpy

from simulator.workload.requests import Clients, Request


class ClientGate:
    """Sends the requests, in order, through `route` as clients free up; a request's recorded
    arrival is when it was sent. Tell it of every finished or rejected request (done)."""

    def __init__(self, env: simpy.Environment, clients: Clients, requests: list[Request], ingress_s: float) -> None:
        self.env, self.think_s, self.ingress_s, self.requests = env, clients.think_s, ingress_s, requests
        self._free_at = [-math.inf] * clients.concurrency  # when each idle client may send (a heap)
        # The next request's send time as it stands (a finish told later may bring it forward).
        self._next_send_s: float | None = requests[0].arrival_s if requests else None
        self._left = len(requests)  # requests not sent yet
        self._wake: simpy.Event | None = None

    @property
    def next_arrival_s(self) -> float:
        """The next arrival at the cluster, or a lower bound on it (see the module's docstring)."""
        if not self._left:
            return math.inf
        head = self.requests[len(self.requests) - self._left].arrival_s
        if self._next_send_s is not None and self._next_send_s <= head:
            return self._next_send_s + self.ingress_s  # a client was free before the request came
        # The send waits on a client: a finish not told yet may free one from now + think on
        # (a finish is told at the step end it follows, with any output delay after it).
        bound = max(self.env.now + self.think_s, head)
        if self._next_send_s is not None:
            bound = min(bound, self._next_send_s)
        return bound + self.ingress_s

    def done(self, finish_s: float | None = None) -> None:
        """A request finished (at finish_s; None: rejected now): its client is free think_s later."""
        heapq.heappush(self._free_at, (self.env.now if finish_s is None else finish_s) + self.think_s)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def sends(self, route: Callable[[Request], None]):
        """A SimPy process: each request routed when a client is free and its own arrival has come."""
        env = self.env
        for request in self.requests:
            while True:  # finishes are told out of their order (output delays differ): re-read each
                while not self._free_at:
                    self._wake = env.event()
                    yield self._wake
                send_s = max(self._free_at[0], request.arrival_s)
                self._next_send_s = send_s
                if send_s + self.ingress_s <= env.now:
                    break
                self._wake = env.event()
                yield env.timeout(send_s + self.ingress_s - env.now) | self._wake
            heapq.heappop(self._free_at)
            self._next_send_s = None
            self._left -= 1
            route(request if request.arrival_s == send_s else replace(request, arrival_s=send_s))
