"""The one candidate grid (simulator/plan/grid.py) gives `servecast plan` and the app's plan page the
candidates, in the order, that each built for itself before."""

from __future__ import annotations

from simulator.plan.capacity import Candidate
from simulator.plan.grid import candidate_grid

HARDWARE, QUANT, TP, PP = ["h100-sxm", "l4"], ["bf16", "fp8"], [1, 2, 4], [1, 2]
SPECULATION = [{}, dict(speculative="ngram", num_speculative_tokens=3, acceptance=0.7)]


def test_the_cli_grid() -> None:
    for placements in (["off"], ["on"], ["off", "on"], ["on", "off"]):
        before = [Candidate(h, q, t, p, **o, expert_parallel=e == "on") for h in HARDWARE for q in QUANT
                  for t in TP for p in PP for o in SPECULATION for e in placements if e == "off" or t > 1]
        assert candidate_grid(HARDWARE, QUANT, TP, PP, SPECULATION, [e == "on" for e in placements]) == before


def test_the_plan_page_grid() -> None:
    for modes in ([False], [True], [False, True]):
        before = [Candidate(h, q, t, expert_parallel=e) for h, q, t, e in
                  ((h, q, t, e) for h in HARDWARE for q in QUANT for t in TP for e in modes if t > 1 or not e)]
        assert candidate_grid(HARDWARE, QUANT, TP, expert_parallel=modes) == before
    assert candidate_grid(["h100-sxm"], ["bf16"], [1], expert_parallel=[True]) == []  # EP needs TP > 1
