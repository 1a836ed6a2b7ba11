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


def parse_stages(text: str, where: str) -> list[tuple[float, float]]:
    """stages=RATExSECONDS+RATExSECONDS...: back-to-back stages of (requests/s, seconds)."""
    stages = []
    for part in text.split("+"):
        rate, sep, seconds = part.strip().partition("x")
        try:
            stage = (float(rate), float(seconds))
        except ValueError:
            stage = None
        if not sep or stage is None or not (0 < stage[0] < math.inf and 0 < stage[1] < math.inf):
            raise WorkloadError(f"{where}: stages={text!r}: use RATExSECONDS stages joined by +, e.g. "
                                "stages=8x600+20x600 (8 requests/s for 600 s, then 20 for 600 s)")
        stages.append(stage)
    return stages


def staged_arrivals(stages: list[tuple[float, float]], process: str, cv: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Arrivals of back-to-back stages, each at its own rate for its own seconds (a constant
    stage: rate x seconds requests evenly spaced from the stage's start, as inference-perf's
    ConstantLoadTimer sends them)."""
    times, start = [], 0.0
    for rate, seconds in stages:
        expected = max(1, round(rate * seconds))
        if process == "constant":
            times.append(start + np.arange(expected) / rate)
        else:  # draw generously, keep those inside the stage
            drawn = arrival_times(int(expected * 1.5) + 20, rate, process, cv, rng)
            times.append(start + drawn[drawn < seconds])
        start += seconds
    return np.concatenate(times)


def synthetic_workload(opts: SpecOptions, seed: int) -> Workload:
    rng = np.random.default_rng(int(opts.number("seed", seed)))
    prefixes = opts.number("prefixes", integer=True)
    users = opts.number("users", integer=True)
    prefix_len = opts.number("prefix_len", integer=True)
    if (prefixes is None) != (prefix_len is None) or (users is not None and prefixes is None):
        raise WorkloadError(f"{opts.where}: a shared-prefix workload needs prefixes=N and prefix_len=TOKENS "
                            "(and optionally users=M)")
    stages_text = opts.get("stages")
    arrivals = None
    if stages_text is not None:
        if opts.get("rate") is not None or opts.get("num") is not None:
            raise WorkloadError(f"{opts.where}: stages= sets the rate and the number of requests: "
                                "drop rate= and num=")
        arrivals = staged_arrivals(parse_stages(stages_text, opts.where), opts.get("arrival", "poisson"),
                                   opts.number("cv", 1.0), rng)
    default_num = prefixes * (users or 1) if prefixes else 1000
    num = len(arrivals) if arrivals is not None else opts.number("num", default_num, integer=True)
    # Fixed prompts (users=M): every user sends the same question each time, so it has its lengths
    # drawn once (inference-perf's shared_prefix generator: N x M fixed prompts, cycled).
    draws = prefixes * users if users else num
    lengths_file = opts.get("lengths")
    if lengths_file is not None:
        pairs = load_length_pairs(lengths_file)
        picks = rng.integers(0, len(pairs), size=draws)
        prompt = np.array([pairs[i].prompt_tokens for i in picks])
        output = np.array([pairs[i].output_tokens for i in picks])
    else:
        prompt = LengthDistribution.parse(opts.get("input", "512"), "input").sample(rng, draws)
        output = LengthDistribution.parse(opts.get("output", "128"), "output").sample(rng, draws)
    if arrivals is None:
        arrivals = spec_arrivals(opts, num, rng, math.inf)
    segments: list[tuple[int, ...]] = [()] * num
    if prefixes and users:
        # Request i is prompt perm[i mod N*M] (a shuffled cycle, as inference-perf sends them): user
        # u of system prompt u // M, whose question is segments of its own after the system prompt.
        perm = rng.permutation(prefixes * users)
        per_user = -(-int(prompt.max()) // prefix_len)  # segments a question may need
        user_of = perm[np.arange(num) % (prefixes * users)]
        segments = [(int(u) // users, *range(prefixes + int(u) * per_user,
                                              prefixes + int(u) * per_user + -(-int(prompt[u]) // prefix_len)))
                    for u in user_of]
        prompt, output = prompt[user_of], output[user_of]
    elif prefixes:
        # Each request: a system prompt drawn at random, then an input of its own.
        segments = [(int(p),) for p in rng.integers(0, prefixes, size=num)]
    if prefixes:
        prompt = prompt + prefix_len  # the system prompt comes before the request's own input
    rows = [(float(a), int(p), int(o), s) for a, p, o, s in zip(arrivals, prompt, output, segments)]
    return make_workload(opts.where, rows, prefix_len or 0)
