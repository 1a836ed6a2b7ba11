"""Deciding a run's SLO verdict before it ends. No torch.

The planner only asks whether a fleet meets its SLOs. Under overload that is settled long before
the last request finishes: once enough requests have finished over a percentile's limit, no later
request can bring the percentile back under it. SloWatch counts them as requests finish, and says
so the moment a verdict of "missed" is certain; a run it watches can then stop there. A
request's TTFT is counted when its first token comes (`first_token`) where the run reports it,
not a whole generation later at its finish: under overload that decides runs far sooner.

Percentiles are numpy's (linear interpolation over all N requests' values, as
metrics.slo_attainment computes them): p_q lies at or above the sorted value at index
k = floor(q/100 (N - 1)), so once N - k values exceed the limit, so does p_q. k is taken one lower
when q/100 (N - 1) is within rounding of an integer, so the verdict is never early by a rounding.
Means decide once the sum of finished values exceeds limit x N (values are never negative). A
rejected request decides at once: a fleet that rejects a request meets nothing (search.meets).
TTFT, E2E and TPOT are watched (TPOT over the requests with two or more output tokens, as
metrics.py defines it: counted from the workload, so a request cut short by max_model_len only
makes the verdict later, never early); ITL limits are left for the full run to decide.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

WATCHED = ("ttft", "e2e", "tpot")


@dataclass
class _Limit:
    key: str  # the SLO's name, e.g. "ttft_p99"
    metric: str  # "ttft", "e2e" or "tpot"
    limit_s: float
    needed: int  # values over the limit that decide a percentile (0 for a mean)
    budget_s: float = math.inf  # for a mean: the sum that decides it
    population: int = 1  # the requests the statistic is over
    over: list[float] = field(default_factory=list)  # a min-heap of the `needed` largest values over
    count: int = 0
    total_s: float = 0.0


class SloWatch:
    def __init__(self, slos: dict[str, float], num_requests: int, num_multi_token: int | None = None) -> None:
        """num_multi_token: requests asking for two or more output tokens (TPOT's population;
        default: all of them)."""
        self.num_requests = num_requests
        self.limits: list[_Limit] = []
        for key, limit in slos.items():
            metric, stat = key.split("_")
            if metric not in WATCHED:
                continue
            population = num_requests if metric != "tpot" or num_multi_token is None else num_multi_token
            if population < 1:
                continue
            if stat == "mean":
                self.limits.append(_Limit(key, metric, limit, 0, budget_s=limit * population, population=population))
                continue
            position = float(stat[1:]) / 100 * (population - 1)
            k = math.floor(position)
            if k > 0 and position - k < 1e-9:
                k -= 1
            self.limits.append(_Limit(key, metric, limit, population - k, population=population))
        self.decided: str | None = None  # why the run can no longer meet its SLOs
        self.missed: dict[str, float] = {}  # SLO -> a lower bound on its final value

    def first_token(self, arrival_s: float, first_token_s: float) -> None:
        """A request's first token: its TTFT is final (finished() must then be told ttft_counted)."""
        for lim in self.limits:
            if lim.metric == "ttft":
                self._count(lim, first_token_s - arrival_s)

    def finished(self, arrival_s: float, first_token_s: float, finish_s: float, output_tokens: int = 1,
                 ttft_counted: bool = False) -> None:
        """A finished request; ttft_counted: its first token was already reported (first_token)."""
        for lim in self.limits:
            if lim.metric == "tpot":
                if output_tokens < 2:
                    continue
                value = (finish_s - first_token_s) / (output_tokens - 1)
            elif lim.metric == "ttft":
                if ttft_counted:
                    continue
                value = first_token_s - arrival_s
            else:
                value = finish_s - arrival_s
            self._count(lim, value)

    def _count(self, lim: _Limit, value: float) -> None:
        if lim.needed == 0:
            lim.total_s += value
            if lim.total_s > lim.budget_s and lim.key not in self.missed:
                self.missed[lim.key] = lim.total_s / lim.population
                self._decide(f"{lim.key} is at least {self.missed[lim.key]:.3g} s whatever the rest do "
                             f"(limit {lim.limit_s:.3g} s)")
            return
        if value <= lim.limit_s:
            return
        lim.count += 1
        if len(lim.over) < lim.needed:
            heapq.heappush(lim.over, value)
        else:
            heapq.heappushpop(lim.over, value)
        if lim.count >= lim.needed and lim.key not in self.missed:
            self.missed[lim.key] = lim.over[0]  # the needed-th largest so far: p >= it
            self._decide(f"{lim.key} is at least {lim.over[0]:.3g} s: {lim.count} requests already took "
                         f"over {lim.limit_s:.3g} s")

    def rejected(self, reason: str) -> None:
        self._decide(f"a request was rejected ({reason})")

    def _decide(self, why: str) -> None:
        if self.decided is None:
            self.decided = why
