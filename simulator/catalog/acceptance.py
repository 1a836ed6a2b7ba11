"""Published speculative-decoding acceptance as presets (acceptance.json; sources in
docs/acceptance-sources.md): chains measured in serving engines, each with its source. No torch.

A preset's per-position rates are used as measured. One that gives only tau (mean accepted
tokens per step with k drafts) is read as one rate per draft, alpha, with
tau = (1 - alpha^(k+1)) / (1 - alpha): positions taken as independent, which measured profiles
are not quite (they are flatter: docs/acceptance-sources.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from scipy.optimize import brentq

PRESETS_FILE = Path(__file__).with_name("acceptance.json")


@dataclass(frozen=True)
class AcceptancePreset:
    id: str
    method: str
    target: str
    drafts: int
    tau: float
    dataset: str
    source: str
    by_position: tuple[float, ...] = ()

    def by_position_or_rate(self) -> list[float]:
        """Cumulative acceptance per draft position, for the preset's own k drafts."""
        if self.by_position:
            return list(self.by_position)
        rate = rate_for(self.tau, self.drafts)
        return [rate ** (i + 1) for i in range(self.drafts)]


def rate_for(tau: float, drafts: int) -> float:
    """The per-draft rate alpha whose chain of `drafts` accepts tau tokens per step on average."""
    if not 1.0 <= tau <= drafts + 1:
        raise ValueError(f"a mean accepted length of {tau} is impossible with {drafts} drafts (1 to {drafts + 1})")
    if tau in (1.0, drafts + 1.0):
        return tau - 1.0 if tau == 1.0 else 1.0
    return brentq(lambda a: sum(a ** i for i in range(drafts + 1)) - tau, 0.0, 1.0)


@lru_cache(maxsize=1)
def presets() -> dict[str, AcceptancePreset]:
    raw = json.loads(PRESETS_FILE.read_text())["presets"]
    return {p["id"]: AcceptancePreset(**{**p, "by_position": tuple(p.get("by_position", ()))}) for p in raw}


def preset(name: str) -> AcceptancePreset:
    try:
        return presets()[name]
    except KeyError:
        raise ValueError(f"unknown acceptance preset {name!r}: use one of {', '.join(presets())}") from None
