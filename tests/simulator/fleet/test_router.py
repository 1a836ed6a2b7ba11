"""The router registry: SimConfig takes exactly its names; a policy is one function and one line."""

from __future__ import annotations

from types import SimpleNamespace
from typing import get_args

import pytest

from simulator.fleet import router as router_module
from simulator.fleet.router import ROUTER_POLICIES, ROUTERS, Router
from simulator.fleet.sim_config import SimConfig


def test_sim_config_accepts_the_registry_names() -> None:
    assert get_args(SimConfig.model_fields["router"].annotation) == ROUTERS == tuple(ROUTER_POLICIES)
    assert ROUTERS == ("round_robin", "least_outstanding_tokens", "prefix_affinity")
    with pytest.raises(ValueError, match="unknown router 'random'; use one of round_robin, "
                                         "least_outstanding_tokens, prefix_affinity"):
        Router("random", [])


def test_a_new_policy_is_one_function_and_one_line(monkeypatch) -> None:
    replicas = [SimpleNamespace(index=i, outstanding_tokens=t) for i, t in enumerate([5, 1, 9])]

    def busiest(router, request):
        return max(router.replicas, key=lambda r: r.outstanding_tokens)

    monkeypatch.setitem(router_module.ROUTER_POLICIES, "busiest", busiest)
    assert Router("busiest", replicas).route(SimpleNamespace(segments=())).index == 2
    rr = Router("round_robin", replicas)
    assert [rr.route(None).index for _ in range(4)] == [0, 1, 2, 0]
    assert Router("least_outstanding_tokens", replicas).route(None).index == 1
