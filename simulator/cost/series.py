"""Measured times of one shape family, read at any size. No torch.

A profile's points of one family (the same operator and shape but for one size: GEMM rows m,
attention context length, ...) are read:

* measured       at a measured size;
* interpolated   between measured sizes, piecewise linear in log(size)-log(time) over the running
                 maximum of the measured times, so predictions never decrease with size. Beyond
                 the largest measured size time grows in proportion to size; below the smallest it
                 stays at the smallest measured time.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Sequence

from simulator.catalog.hardware import canonical_dtype
from simulator.cost.profile_format import Measurement


class Series:
    """Measured (size, time) points of one shape family, monotone in size."""

    def __init__(self, points: list[tuple[int, float]]) -> None:
        by_size: dict[int, list[float]] = defaultdict(list)
        for size, t in points:
            by_size[size].append(t)
        sizes = sorted(by_size)
        times, running = [], 0.0
        for s in sizes:
            ts = sorted(by_size[s])
            running = max(running, ts[len(ts) // 2])
            times.append(running)
        self.sizes, self.times = sizes, times

    def at(self, size: int) -> tuple[float, str]:
        i = bisect.bisect_left(self.sizes, size)
        if i < len(self.sizes) and self.sizes[i] == size:
            return self.times[i], "measured"
        if i == 0:
            return self.times[0], "interpolated"
        if i == len(self.sizes):
            return self.times[-1] * size / self.sizes[-1], "interpolated"
        s0, s1, t0, t1 = self.sizes[i - 1], self.sizes[i], self.times[i - 1], self.times[i]
        w = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
        t = math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
        return min(max(t, t0), t1), "interpolated"  # the clamp absorbs exp/log rounding


def index_profile(measurements: Sequence[Measurement]) -> dict[tuple, Series]:
    """Every shape family of a profile's measurements, keyed by series_key."""
    points: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for m in measurements:
        key, size = series_key(m)
        if key is not None:
            points[key].append((size, m.time_s))
    return {k: Series(v) for k, v in points.items()}


def across_counts(counts: Sequence[int], count: float, at: Callable[[int], tuple[float, str]],
                  scale_below: bool) -> tuple[float, str]:
    """(time, provenance) at `count` from series measured at `counts` (ascending; at(c) reads the one
    at c): the measured one; linear between the two around it (interpolated, unless both say the
    same); in proportion past the largest (extrapolated); below the smallest its time, in proportion
    where scale_below."""
    i = bisect.bisect_left(counts, count)
    if i < len(counts) and counts[i] == count:
        return at(counts[i])
    if i == len(counts):
        return at(counts[-1])[0] * count / counts[-1], "extrapolated"
    if i == 0:
        t, provenance = at(counts[0])
        return (t * count / counts[0] if scale_below else t), provenance
    (t0, p0), (t1, p1) = at(counts[i - 1]), at(counts[i])
    return t0 + (t1 - t0) * (count - counts[i - 1]) / (counts[i] - counts[i - 1]), p0 if p0 == p1 else "interpolated"


def series_key(m: Measurement) -> tuple[tuple | None, int]:
    """The shape family of a measurement and its size along the family's interpolation axis."""
    p = dict(m.params)
    if m.op == "gemm":
        return ("gemm", p["n"], p["k"], canonical_dtype(p["dtype"])), p["m"]
    if m.op == "gemm_quant":
        return ("gemm_quant", p["n"], p["k"], canonical_dtype(p["dtype"]), p["weight_dtype"]), p["m"]
    if m.op in ("attention_prefill", "attention_decode"):
        first = p["q_len"] if m.op == "attention_prefill" else p["batch"]
        return (m.op, first, p["num_heads"], p["num_kv_heads"], p["head_dim"], canonical_dtype(p["dtype"])), p["kv_len"]
    if m.op == "elementwise":
        return ("elementwise", p["name"], p["width"], canonical_dtype(p["dtype"])), p["tokens"]
    if m.op == "kv_write":
        return ("kv_write", p["num_kv_heads"], p["head_dim"], canonical_dtype(p["dtype"])), p["tokens"]
    if m.op == "sample":
        return ("sample", p["vocab"]), p["batch"]
    if m.op == "step_overhead":
        return ("step_overhead",), p["batch"]
    if m.op == "idle_wakeup":
        return ("idle_wakeup",), p["idle_ms"]
    if m.op in ("all_reduce", "all_to_all", "kv_ring"):
        return (m.op, p["world"]), p["nbytes"]
    if m.op == "moe_experts":
        return ("moe_experts", p["active"], p["hidden"], p["ffn"], canonical_dtype(p["dtype"])), p["rows"]
    if m.op == "moe_dispatch":
        return ("moe_dispatch", p["experts"], p["top_k"], p["hidden"], canonical_dtype(p["dtype"])), p["tokens"]
    if m.op == "kv_gather":
        return ("kv_gather", p["num_kv_heads"], p["head_dim"], canonical_dtype(p["dtype"]), p["kv_dtype"]), p["tokens"]
    if m.op == "attention_verify":
        return ("attention_verify", p["batch"], p["q_len"], p["num_heads"], p["num_kv_heads"], p["head_dim"],
                canonical_dtype(p["dtype"])), p["kv_len"]
    return None, 0
