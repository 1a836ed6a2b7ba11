"""Speculative decoding in the simulator: accepted drafts and the draft's cost. No torch.

The replica's scheduler is the engine's, with num_lookahead_tokens = gamma, so verification
chunks (the last token plus draft slots) are scheduled exactly as the engine schedules them, from
the step's spare budget and blocks. What the model runner would decide is drawn here:

- accepted drafts: from the acceptance profile -- cumulative[i] = P(the first i + 1 drafts are all
  accepted), the engine's SpecStats.acceptance_by_position -- with one uniform draw per
  verification (a = number of positions i < k with u < cumulative[i]), seeded per replica. Where
  the measurement has each request's acceptance (request_acceptance), requests differ as measured
  instead: each simulated request takes one measured request's per-token rate r and accepts its
  first i drafts with probability r^i. Rates are dealt in turn from a seeded shuffle of the
  measured ones (stratified: any run of as many requests as were measured has the measured mix).
  Pooled rates would have every request advance at the mean pace; measured, a predictable text
  accepts nearly every draft and another a few, and in a batch the slow ones decide when it ends.
- the draft's time (speculative=draft): one draft forward over every chunk of the step (it
  mirrors the target's prompt chunks and catches up on the last token), then gamma - 1 one-token
  forwards of the requests being verified, each from the cost model with the draft's shapes. An
  n-gram proposer costs nothing on the device.

The verification itself is in the target's step: a (k + 1)-token chunk over the cached context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.policy.scheduler import ScheduledChunk, SchedulerOutput


def acceptance_profile(rate: float | None = None, path: str | None = None, gamma: int = 8,
                       preset: str | None = None) -> list[float]:
    """Cumulative acceptance per draft position (non-increasing), from a per-token rate, an
    engine-measured profile or a published one (simulator/catalog/acceptance.py); positions beyond
    the measured ones repeat its conditional rate."""
    if preset is not None:
        from simulator.catalog.acceptance import preset as published

        return _extended(list(published(preset).by_position_or_rate()), gamma)
    if path is not None:
        try:
            raw = json.loads(Path(path).read_text())
            # Per slot where measured (the simulator fills every slot), else per proposed draft.
            measured = [float(x) for x in raw.get("acceptance_by_slot") or raw["acceptance_by_position"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"acceptance file {path}: {exc}; give the acceptance.json written by "
                             "`servecast train-pair` or `servecast acceptance --json`") from None
        if not measured or not all(0.0 <= x <= 1.0 for x in measured):
            raise ValueError(f"acceptance file {path}: acceptance_by_position must hold rates in [0, 1]")
        return _extended(measured, gamma)
    if rate is None:
        raise ValueError("an acceptance rate or file is needed")
    return [rate ** (i + 1) for i in range(gamma)]


def _extended(measured: list[float], gamma: int) -> list[float]:
    """Measured cumulative acceptance made non-increasing and carried to gamma positions with its
    last conditional rate."""
    cumulative = list(np.minimum.accumulate(measured))
    while len(cumulative) < gamma:  # extrapolate with the last conditional rate
        last = cumulative[-1]
        ratio = last / cumulative[-2] if len(cumulative) > 1 and cumulative[-2] > 0 else last
        cumulative.append(last * ratio)
    return cumulative[:gamma]


def request_rates(path: str | None) -> tuple[float, ...]:
    """Per-token acceptance rates of the measured requests in an acceptance file (empty if it has
    no request_acceptance): the rate r whose first drafts r, r^2, ... r^g (g the measured gamma)
    accept, on average, the share of drafts the request had accepted."""
    if path is None:
        return ()
    raw = json.loads(Path(path).read_text())
    pairs = raw.get("request_acceptance") or []
    gamma = len(raw.get("acceptance_by_position") or []) or int(raw.get("num_speculative_tokens", 1))
    try:
        shares = [float(accepted) / float(proposed) for proposed, accepted in pairs]
    except (TypeError, ValueError, ZeroDivisionError):
        raise ValueError(f"acceptance file {path}: request_acceptance must hold [proposed, accepted] pairs "
                         "with proposed > 0") from None
    if not all(0.0 <= x <= 1.0 for x in shares):
        raise ValueError(f"acceptance file {path}: a request accepted more drafts than it was proposed")
    return tuple(_per_token_rate(x, gamma) for x in shares)


def _per_token_rate(share: float, gamma: int) -> float:
    """r in [0, 1] with (r + r^2 + ... + r^gamma) / gamma = share (bisection: the sum grows with r)."""
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        if sum(mid ** (i + 1) for i in range(gamma)) / gamma < share:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass
class Speculation:
    cumulative: list[float]
    seed: int = 0
    draft_timer: object | None = None  # simulator.cost.step_timer.StepTimer of the draft model, or None (n-gram)
    # Measured requests' per-token acceptance rates (request_rates); empty: every request draws from cumulative.
    request_rates: tuple[float, ...] = ()
    verifications: int = 0
    proposed: int = 0
    accepted_tokens: int = 0
    draft_s: float = 0.0
    _rng: np.random.Generator = field(init=False)
    _deck: list[float] = field(init=False)  # request_rates in a seeded order, dealt in turn
    _dealt: int = field(init=False, default=0)
    _rate_of: dict[str, float] = field(init=False, default_factory=dict)  # live requests' rates

    def counts(self) -> dict:
        """This replica's tallies, as plain data (the run's summary adds them up)."""
        return {"cumulative": list(self.cumulative), "verifications": self.verifications, "proposed": self.proposed,
                "accepted_tokens": self.accepted_tokens, "draft_s": self.draft_s}

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._deck = [self.request_rates[i] for i in np.random.default_rng(self.seed).permutation(
            len(self.request_rates))]

    def forget(self, request_id: str) -> None:
        """A request finished: its rate is no longer needed."""
        self._rate_of.pop(request_id, None)

    def _rate(self, request_id: str) -> float:
        rate = self._rate_of.get(request_id)
        if rate is None:
            rate = self._rate_of[request_id] = self._deck[self._dealt % len(self._deck)]
            self._dealt += 1
        return rate

    def accepted(self, out: SchedulerOutput, requests) -> dict[str, list[int]]:
        """Accepted drafts (stand-in tokens) for every verification chunk of the step."""
        result = {}
        for c in out.chunks:
            slots = c.draft_slots(len(requests[c.request_id].token_ids))
            if slots <= 0:
                continue
            u = self._rng.random()
            a = 0
            if self.request_rates:
                rate = self._rate(c.request_id)
                bound = rate
                while a < slots and u < bound:
                    a += 1
                    bound *= rate
            else:
                while a < slots and u < self.cumulative[a]:
                    a += 1
            result[c.request_id] = [0] * a
            self.verifications += 1
            self.proposed += slots
            self.accepted_tokens += a
        return result

    def draft_time(self, out: SchedulerOutput, requests) -> float:
        """Seconds the draft model spends proposing for this step (0 for n-gram lookup)."""
        if self.draft_timer is None:
            return 0.0
        first: list[ScheduledChunk] = []
        extra: list[tuple[int, int]] = []  # (position of the first draft, further drafts)
        for c in out.chunks:
            known = len(requests[c.request_id].token_ids)
            slots = c.draft_slots(known)
            if slots > 0:
                first.append(ScheduledChunk(c.request_id, c.start, 1, False, True))
                extra.append((known, slots - 1))
            else:
                first.append(c)
        total = self.draft_timer.step(first)
        for j in range(1, max((n for _, n in extra), default=0) + 1):
            chunks = [ScheduledChunk("", position + j - 1, 1, False, True) for position, n in extra if n >= j]
            total += self.draft_timer.step(chunks)
        self.draft_s += total
        return total
