"""Step-time predictions for any catalog accelerator. No torch.

Where a profile of the device exists, an operator's time comes from its measurements:

* measured       the exact shape is in the profile;
* interpolated   between measured sizes of the same shape family (GEMM rows m; attention context
                 length), piecewise linear in log(size)-log(time) over the running maximum of the
                 measured times, so predictions never decrease with size. Beyond the largest
                 measured size time grows in proportion to size; below the smallest it stays at
                 the smallest measured time.
* fitted         other shapes: roofline x efficiency curves fitted on this profile.

Without a profile: roofline x efficiency curves fitted on other devices' measurements and shipped
in catalog/efficiency.json ("extrapolated"). Every prediction is at least the roofline time.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from simulator.catalog.hardware import Accelerator, canonical_dtype, get_accelerator
from simulator.catalog.models import ModelSpec
from simulator.efficiency import (
    DTYPE_BYTES,
    EfficiencyCurve,
    decode_attention_work,
    elementwise_work,
    gemm_work,
    kv_write_work,
    prefill_attention_work,
)
from simulator.profile import Measurement, Profile

PARAMS_FILE = Path(__file__).parent / "catalog" / "efficiency.json"
FAMILIES = ("gemm", "attention", "memory")
PROVENANCES = ("measured", "interpolated", "fitted", "extrapolated")


@dataclass(frozen=True)
class Prediction:
    time_s: float
    provenance: str
    expected_error: float  # relative (0.1 = 10%)


@dataclass(frozen=True)
class Chunk:
    """One request's share of a step: num_tokens new tokens on top of a context of context_len
    tokens (context_len includes the new ones)."""

    num_tokens: int
    context_len: int
    samples: bool = True


@dataclass
class StepCost:
    total_s: float
    by_operator: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, prediction: Prediction, count: float = 1.0) -> None:
        self.by_operator[name] = self.by_operator.get(name, 0.0) + prediction.time_s * count
        worst = max(self.provenance.get(name, "measured"), prediction.provenance, key=PROVENANCES.index)
        self.provenance[name] = worst
        self.total_s += prediction.time_s * count


class _Series:
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
        return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0))), "interpolated"


class CostModel:
    def __init__(self, accelerator: Accelerator, curves: dict[str, EfficiencyCurve], errors: dict[str, float],
                 profile: Profile | None = None, peak_flops: dict[str, float] | None = None,
                 bandwidth: float | None = None) -> None:
        self.accelerator = accelerator
        self.curves = curves
        self.errors = errors
        self.profile = profile
        self._peaks = peak_flops or {}
        self._bandwidth = bandwidth
        self._series: dict[tuple, _Series] = {}
        self._measured_ops: dict[str, dict[tuple, float]] = defaultdict(dict)
        if profile is not None:
            self._index(profile)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def load(cls, hardware: str, profile: str | Path | Profile | None = None, hardware_file: str | Path | None = None,
             params_file: str | Path = PARAMS_FILE) -> "CostModel":
        accelerator = get_accelerator(hardware, hardware_file)
        if isinstance(profile, (str, Path)):
            profile = Profile.load(profile)
        if profile is not None and profile.hardware != hardware:
            raise ValueError(f"the profile is of {profile.hardware!r}, not {hardware!r}: load it with "
                             f"hardware={profile.hardware!r}")
        if accelerator.profiled and profile is None:
            raise ValueError(f"{hardware} is a profiled local device: pass its profile "
                             "(run `servecast profile` first)")
        shipped = json.loads(Path(params_file).read_text())
        curves = {f: EfficiencyCurve.from_dict(shipped["curves"][f]) for f in FAMILIES}
        errors = {"extrapolated": shipped["expected_error"]["extrapolated"],
                  "fitted": shipped["expected_error"].get("fitted", 0.15),
                  "interpolated": 0.05, "measured": 0.02}
        peaks, bandwidth = {}, None
        if profile is not None and profile.peaks:
            if "matmul_flops" in profile.peaks:
                peaks = {d: profile.peaks["matmul_flops"] for d in DTYPE_BYTES}
            bandwidth = profile.peaks.get("memory_bandwidth")
        model = cls(accelerator, curves, errors, profile, peaks, bandwidth)
        if profile is not None:
            model._fit_to_profile(profile)
        return model

    def _index(self, profile: Profile) -> None:
        points: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
        for m in profile.measurements:
            p = dict(m.params)
            if m.op == "gemm":
                points[("gemm", p["n"], p["k"], p["dtype"])].append((p["m"], m.time_s))
            elif m.op == "attention_prefill":
                key = ("attention_prefill", p["q_len"], p["num_heads"], p["num_kv_heads"], p["head_dim"], p["dtype"])
                points[key].append((p["kv_len"], m.time_s))
            elif m.op == "attention_decode":
                key = ("attention_decode", p["batch"], p["num_heads"], p["num_kv_heads"], p["head_dim"], p["dtype"])
                points[key].append((p["kv_len"], m.time_s))
            elif m.op == "elementwise":
                points[("elementwise", p["name"], p["hidden"], p["dtype"])].append((p["tokens"], m.time_s))
            elif m.op == "kv_write":
                points[("kv_write", p["num_kv_heads"], p["head_dim"], p["dtype"])].append((p["tokens"], m.time_s))
            elif m.op == "sample":
                points[("sample", p["vocab"])].append((p["batch"], m.time_s))
            elif m.op == "step_overhead":
                points[("step_overhead",)].append((p["batch"], m.time_s))
            elif m.op == "all_reduce":
                points[("all_reduce", p["world"])].append((p["nbytes"], m.time_s))
        self._series = {k: _Series(v) for k, v in points.items()}

    def _fit_to_profile(self, profile: Profile) -> None:
        """Refit the efficiency curves on this device's own measurements where it has enough."""
        from calibrate.fit import Sample, fit_curve  # scipy; no torch

        groups: dict[str, list[Sample]] = defaultdict(list)
        for m in profile.measurements:
            family_work = self._work_of(m)
            if family_work is not None:
                family, (flops, nbytes) = family_work
                groups[family].append(Sample(flops, nbytes, m.time_s))
        for family, samples in groups.items():
            if len(samples) >= 8:
                dtype = next(iter(self._peaks), "fp16")
                self.curves[family] = fit_curve(samples, self.peak_flops(dtype), self.bandwidth,
                                                start=self.curves[family])

    @staticmethod
    def _work_of(m: Measurement) -> tuple[str, tuple[float, float]] | None:
        p = dict(m.params)
        if m.op == "gemm":
            return "gemm", gemm_work(p["m"], p["n"], p["k"], canonical_dtype(p["dtype"]))
        if m.op == "attention_prefill":
            return "attention", prefill_attention_work(p["q_len"], p["kv_len"], p["num_heads"], p["num_kv_heads"],
                                                       p["head_dim"], canonical_dtype(p["dtype"]))
        if m.op == "attention_decode":
            return "attention", decode_attention_work([p["kv_len"]] * p["batch"], p["num_heads"],
                                                      p["num_kv_heads"], p["head_dim"], canonical_dtype(p["dtype"]))
        if m.op == "elementwise":
            return "memory", elementwise_work(p["tokens"], p["hidden"], canonical_dtype(p["dtype"]))
        if m.op == "kv_write":
            return "memory", kv_write_work(p["tokens"], p["num_kv_heads"], p["head_dim"], canonical_dtype(p["dtype"]))
        return None

    # -- device facts -------------------------------------------------------------------------
    def peak_flops(self, dtype: str) -> float:
        dtype = canonical_dtype(dtype)
        if dtype in self._peaks:
            return self._peaks[dtype]
        return self.accelerator.peak_flops(dtype)

    @property
    def bandwidth(self) -> float:
        return self._bandwidth if self._bandwidth is not None else self.accelerator.memory_bandwidth

    # -- operators ----------------------------------------------------------------------------
    def _model(self, family: str, flops: float, nbytes: float, dtype: str) -> Prediction:
        t = self.curves[family].time(flops, nbytes, self.peak_flops(dtype), self.bandwidth)
        roofline = max(flops / self.peak_flops(dtype), nbytes / self.bandwidth)
        provenance = "fitted" if self.profile is not None else "extrapolated"
        return Prediction(max(t, roofline), provenance, self.errors[provenance])

    def _lookup(self, key: tuple, size: int, fallback) -> Prediction:
        series = self._series.get(key)
        if series is None:
            return fallback()
        t, provenance = series.at(size)
        return Prediction(t, provenance, self.errors[provenance])

    def predict_gemm(self, m: int, n: int, k: int, dtype: str) -> Prediction:
        dtype = canonical_dtype(dtype)
        return self._lookup(("gemm", n, k, dtype), m, lambda: self._model("gemm", *gemm_work(m, n, k, dtype), dtype))

    def gemm(self, m: int, n: int, k: int, dtype: str) -> float:
        return self.predict_gemm(m, n, k, dtype).time_s

    def predict_attention_prefill(self, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                                  dtype: str) -> Prediction:
        dtype = canonical_dtype(dtype)
        work = prefill_attention_work(q_len, kv_len, num_heads, num_kv_heads, head_dim, dtype)
        return self._lookup(("attention_prefill", q_len, num_heads, num_kv_heads, head_dim, dtype), kv_len,
                            lambda: self._model("attention", *work, dtype))

    def attention_prefill(self, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                          dtype: str) -> float:
        return self.predict_attention_prefill(q_len, kv_len, num_heads, num_kv_heads, head_dim, dtype).time_s

    def predict_attention_decode(self, batch: int, kv_len: int | Sequence[int], num_heads: int, num_kv_heads: int,
                                 head_dim: int, dtype: str) -> Prediction:
        dtype = canonical_dtype(dtype)
        kv_lens = [kv_len] * batch if isinstance(kv_len, int) else list(kv_len)
        if len(kv_lens) != batch:
            raise ValueError(f"attention_decode: {len(kv_lens)} context lengths for a batch of {batch}")
        work = decode_attention_work(kv_lens, num_heads, num_kv_heads, head_dim, dtype)
        # A profile measures equal lengths; unequal ones are looked up at the batch's mean length.
        mean_len = max(1, round(sum(kv_lens) / batch))
        return self._lookup(("attention_decode", batch, num_heads, num_kv_heads, head_dim, dtype), mean_len,
                            lambda: self._model("attention", *work, dtype))

    def attention_decode(self, batch: int, kv_len: int | Sequence[int], num_heads: int, num_kv_heads: int,
                         head_dim: int, dtype: str) -> float:
        return self.predict_attention_decode(batch, kv_len, num_heads, num_kv_heads, head_dim, dtype).time_s

    def predict_elementwise(self, name: str, tokens: int, hidden: int, dtype: str) -> Prediction:
        dtype = canonical_dtype(dtype)
        return self._lookup(("elementwise", name, hidden, dtype), tokens,
                            lambda: self._model("memory", *elementwise_work(tokens, hidden, dtype), dtype))

    def predict_kv_write(self, tokens: int, num_kv_heads: int, head_dim: int, dtype: str) -> Prediction:
        dtype = canonical_dtype(dtype)
        return self._lookup(("kv_write", num_kv_heads, head_dim, dtype), tokens,
                            lambda: self._model("memory", *kv_write_work(tokens, num_kv_heads, head_dim, dtype),
                                                dtype))

    def predict_all_reduce(self, nbytes: int, world: int) -> Prediction:
        if world <= 1:
            return Prediction(0.0, "measured", 0.0)
        link = (self.accelerator.interconnect_gbps or 64) * 1e9

        def ring():  # ring all-reduce: 2 (w-1)/w of the bytes cross each link, plus a latency term
            return Prediction(2 * (world - 1) / world * nbytes / (0.7 * link) + 10e-6 * world, "extrapolated",
                              self.errors["extrapolated"])
        return self._lookup(("all_reduce", world), nbytes, ring)

    def all_reduce(self, nbytes: int, world: int) -> float:
        return self.predict_all_reduce(nbytes, world).time_s

    def predict_step_overhead(self, batch: int) -> Prediction:
        return self._lookup(("step_overhead",), batch, lambda: Prediction(0.0, "extrapolated", 0.0))

    def predict_sample(self, batch: int, vocab: int) -> Prediction:
        return self._lookup(("sample", vocab), batch,
                            lambda: self._model("memory", *elementwise_work(batch, vocab, "fp32"), "fp32"))

    # -- a whole step -------------------------------------------------------------------------
    def step_time(self, chunks: Sequence[Chunk], model: ModelSpec, tp: int = 1, dtype: str = "bf16") -> StepCost:
        """Time of one engine step computing the given chunks: every layer's GEMMs over all tokens,
        attention per chunk (prefill chunks one by one, decodes batched), KV writes, norms, the LM
        head and sampling for the sampled rows, all-reduces under TP, and per-step overhead."""
        dtype = canonical_dtype(dtype)
        cost = StepCost(0.0)
        if not chunks:
            return cost
        tokens = sum(c.num_tokens for c in chunks)
        layers = model.num_layers
        heads, kv_heads = model.num_heads // tp, max(model.num_kv_heads // tp, 1)
        shapes = model.linear_shapes(tp)
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            n, k = shapes[name]
            m = tokens
            count = layers
            if model.num_experts > 1 and name in ("gate_up_proj", "down_proj"):
                # Tokens spread over the experts they route to; every touched expert runs a GEMM.
                touched = min(model.num_experts, tokens * model.experts_per_token)
                m = max(1, math.ceil(tokens * model.experts_per_token / touched))
                count = layers * touched
            cost.add(name, self.predict_gemm(m, n, k, dtype), count)
        decodes = [c for c in chunks if c.num_tokens == 1]
        for c in chunks:
            if c.num_tokens > 1:
                cost.add("attention_prefill", self.predict_attention_prefill(
                    c.num_tokens, c.context_len, heads, kv_heads, model.head_dim, dtype), layers)
        if decodes:
            cost.add("attention_decode", self.predict_attention_decode(
                len(decodes), [c.context_len for c in decodes], heads, kv_heads, model.head_dim, dtype), layers)
        cost.add("kv_write", self.predict_kv_write(tokens, kv_heads, model.head_dim, dtype), layers)
        cost.add("norms", self.predict_elementwise("input_layernorm", tokens, model.hidden_size, dtype), 2 * layers)
        sampled = sum(1 for c in chunks if c.samples)
        if sampled:
            n, k = shapes["lm_head"]
            cost.add("lm_head", self.predict_gemm(sampled, n, k, dtype))
            cost.add("sample", self.predict_sample(sampled, model.vocab_size))
        if tp > 1:
            nbytes = tokens * model.hidden_size * DTYPE_BYTES[dtype]
            cost.add("all_reduce", self.predict_all_reduce(nbytes, tp), 2 * layers)
        cost.add("step_overhead", self.predict_step_overhead(len(chunks)))
        return cost
