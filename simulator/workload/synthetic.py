"""Synthetic workloads: length distributions, arrival processes, shared-prefix traffic, and the
parsing of spec options (key=value lists) that simulator/workload/load.py reads `--trace` specs with.
No torch. The spec's forms and keys are listed in simulator/workload/load.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.workload.requests import Workload, WorkloadError, load_length_pairs, make_workload

ARRIVALS = ("poisson", "gamma", "constant")
SYNTHETIC = "synthetic:"


@dataclass(frozen=True)
class LengthDistribution:
    kind: str  # fixed | uniform | lognormal
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str, key: str) -> "LengthDistribution":
        text = text.strip()
        try:
            if text.startswith("uniform(") and text.endswith(")"):
                lo, hi = (int(x) for x in text[8:-1].split(","))
                if not 1 <= lo <= hi:
                    raise ValueError
                return cls("uniform", lo, hi)
            if text.startswith("lognormal(") and text.endswith(")"):
                median, sigma = (float(x) for x in text[10:-1].split(","))
                if median < 1 or sigma < 0:
                    raise ValueError
                return cls("lognormal", median, sigma)
            value = int(text)
            if value < 1:
                raise ValueError
            return cls("fixed", value)
        except ValueError:
            raise WorkloadError(f"{key}={text!r}: use a token count (128), uniform(LO,HI) with 1 <= LO <= HI, "
                                "or lognormal(MEDIAN,SIGMA)") from None

    def sample(self, rng: np.random.Generator, num: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(num, int(self.a), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(self.a), int(self.b) + 1, size=num)
        return np.maximum(1, np.rint(self.a * np.exp(self.b * rng.standard_normal(num)))).astype(np.int64)


def split_spec(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, []
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_options(items: list[str], where: str) -> dict[str, str]:
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise WorkloadError(f"{where}: {item!r} is not key=value")
        options[key.strip()] = value.strip()
    return options


class SpecOptions:
    """Typed access to spec options; every key must be used (unknown keys are an error)."""

    def __init__(self, options: dict[str, str], where: str) -> None:
        self.options, self.where, self.used = options, where, set()

    def get(self, key: str, default=None):
        self.used.add(key)
        return self.options.get(key, default)

    def number(self, key: str, default: float | None = None, integer: bool = False) -> float | None:
        raw = self.get(key)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise WorkloadError(f"{self.where}: {key}={raw!r} is not a number") from None
        if integer:
            if math.isinf(value) or value != int(value) or value < 1:
                raise WorkloadError(f"{self.where}: {key}={raw!r} must be a whole number >= 1")
            return int(value)
        return value

    def check_all_used(self, known: str) -> None:
        unknown = sorted(set(self.options) - self.used)
        if unknown:
            raise WorkloadError(f"{self.where}: unknown option(s) {', '.join(unknown)}; known: {known}")


def arrival_times(num: int, rate: float, process: str, cv: float, rng: np.random.Generator) -> np.ndarray:
    """num arrival times starting at 0, at the given mean rate (requests/s)."""
    if math.isinf(rate):
        return np.zeros(num)
    if not rate > 0:
        raise WorkloadError(f"rate must be > 0 requests/s (or inf), got {rate}")
    if process == "poisson":
        gaps = rng.exponential(1.0 / rate, size=num)
    elif process == "gamma":
        if not cv > 0:
            raise WorkloadError(f"gamma arrivals need cv > 0 (the gaps' coefficient of variation), got {cv}")
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=num)
    elif process == "constant":
        gaps = np.full(num, 1.0 / rate)
    else:
        raise WorkloadError(f"unknown arrival process {process!r}; use {', '.join(ARRIVALS)}")
    gaps[0] = 0.0
    return np.cumsum(gaps)


def spec_arrivals(opts: SpecOptions, num: int, rng: np.random.Generator, default_rate: float | None) -> np.ndarray:
    rate = opts.number("rate", default_rate)
    if rate is None:
        raise WorkloadError(f"{opts.where}: lengths only, no arrival times: add rate=REQUESTS_PER_S (or rate=inf)")
    return arrival_times(num, rate, opts.get("arrival", "poisson"), opts.number("cv", 1.0), rng)


def synthetic_workload(opts: SpecOptions, seed: int) -> Workload:
    rng = np.random.default_rng(int(opts.number("seed", seed)))
    prefixes = opts.number("prefixes", integer=True)
    users = opts.number("users", integer=True)
    prefix_len = opts.number("prefix_len", integer=True)
    if (prefixes is None) != (prefix_len is None) or (users is not None and prefixes is None):
        raise WorkloadError(f"{opts.where}: a shared-prefix workload needs prefixes=N and prefix_len=TOKENS "
                            "(and optionally users=M)")
    default_num = prefixes * (users or 1) if prefixes else 1000
    num = opts.number("num", default_num, integer=True)
    lengths_file = opts.get("lengths")
    if lengths_file is not None:
        pairs = load_length_pairs(lengths_file)
        picks = rng.integers(0, len(pairs), size=num)
        prompt = np.array([pairs[i].prompt_tokens for i in picks])
        output = np.array([pairs[i].output_tokens for i in picks])
    else:
        prompt = LengthDistribution.parse(opts.get("input", "512"), "input").sample(rng, num)
        output = LengthDistribution.parse(opts.get("output", "128"), "output").sample(rng, num)
    arrivals = spec_arrivals(opts, num, rng, math.inf)
    segments: list[tuple[int, ...]] = [()] * num
    if prefixes:
        # Request i belongs to user (i mod users) of system prompt ((i div users) mod prefixes), in a
        # shuffled order, so system prompts recur over time as they would in production.
        order = rng.permutation(num)
        segments = [((int(order[i]) // (users or 1)) % prefixes,) for i in range(num)]
        prompt = prompt + prefix_len  # the system prompt comes before the request's own input
    rows = [(float(a), int(p), int(o), s) for a, p, o, s in zip(arrivals, prompt, output, segments)]
    return make_workload(opts.where, rows, prefix_len or 0)
