"""Routers: which replica gets an arriving request. No torch.

* round_robin               replicas in turn
* least_outstanding_tokens  the replica with the fewest prompt + output tokens still to serve
* prefix_affinity           requests that share their first prompt segment (a system prompt, a
                            Mooncake hash block) go to the replica that served that segment before,
                            unless it carries more than twice the least loaded replica's
                            outstanding tokens (plus one request's worth); otherwise least outstanding

To add a policy: write `def policy(router, request) -> replica` (router.replicas: the fleet, two or
more -- one replica gets every request without asking; router.state: a dict the policy may keep its
memory in) and add one line to ROUTER_POLICIES. SimConfig accepts its name from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from simulator.workload.requests import Request


def round_robin(router: "Router", request: Request):
    turn = router.state.get("next", 0)
    router.state["next"] = (turn + 1) % len(router.replicas)
    return router.replicas[turn]


def least_outstanding_tokens(router: "Router", request: Request):
    return min(router.replicas, key=lambda r: r.outstanding_tokens)


def prefix_affinity(router: "Router", request: Request):
    least = least_outstanding_tokens(router, request)
    if not request.segments:
        return least
    home_of = router.state.setdefault("home", {})  # first segment id -> replica index
    home = home_of.get(request.segments[0])
    if home is not None:
        candidate = router.replicas[home]
        slack = request.prompt_tokens + request.output_tokens
        if candidate.outstanding_tokens <= 2 * least.outstanding_tokens + slack:
            return candidate
    home_of[request.segments[0]] = least.index
    return least


# The registry: router name -> its policy. One line per policy.
ROUTER_POLICIES: dict[str, Callable[["Router", Request], Any]] = {
    "round_robin": round_robin,
    "least_outstanding_tokens": least_outstanding_tokens,
    "prefix_affinity": prefix_affinity,
}
ROUTERS = tuple(ROUTER_POLICIES)


class Router:
    def __init__(self, kind: str, replicas: Sequence) -> None:
        if kind not in ROUTER_POLICIES:
            raise ValueError(f"unknown router {kind!r}; use one of {', '.join(ROUTER_POLICIES)}")
        self.kind, self.replicas = kind, replicas
        self._policy = ROUTER_POLICIES[kind]
        self.state: dict[str, Any] = {}

    def route(self, request: Request):
        if len(self.replicas) == 1:
            return self.replicas[0]
        return self._policy(self, request)
