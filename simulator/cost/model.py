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
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.decode_groups import padded_decode_batches
from simulator.catalog.hardware import Accelerator, canonical_dtype, get_accelerator
from simulator.catalog.models import ModelSpec
from simulator.cost.moe import step_load
from simulator.cost.efficiency import (
    DTYPE_BYTES,
    EfficiencyCurve,
    decode_attention_work,
    decode_attention_work_total,
    elementwise_work,
    gemm_work,
    kv_write_work,
    prefill_attention_work,
)
from simulator.cost.profile_format import Measurement, Profile, forward_contexts

# Bytes per stored weight (int4: packed nibbles plus a 16-bit scale and zero point per group of 128).
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5 + 4 / 128}

PARAMS_FILE = Path(__file__).parents[1] / "catalog" / "efficiency.json"
FRAMEWORK_TERMS = ("operator_scale", "step_s", "step_per_chunk_s", "step_per_prefill_s", "step_per_group_s",
                   "step_per_token_s", "layer_s", "layer_per_chunk_s", "layer_per_prefill_s", "layer_per_group_s",
                   "layer_per_token_s")
# A speculative verification step's own overhead (per step and per layer: in situ it follows the
# draft's forwards, which evict the target's weights from the caches). Fitted only where
# verification steps were observed (calibrate/spec_steps.py), zero otherwise.
VERIFY_TERMS = ("step_per_verify_s", "layer_per_verify_s")
# A mixture-of-experts layer's host work beyond its operators (the engine's per-expert loop: Python
# and dispatch per layer and per expert touched). Fitted only where MoE steps were observed.
MOE_TERMS = ("moe_layer_s", "moe_layer_per_expert_s")
# A step whose token count differs from the step just before it (no idle between) takes longer
# than the same step repeated, which is how the profile times its whole forwards. On a 2-core
# CPU, fitted without this term, decodes of 1-3 requests right after a 128-256-token prefill chunk
# ran 16 % over the fit, prefill chunks right after decodes 6 % (18,826 engine steps of six
# `servecast validate` measurements). The cost: a part per halving of the token count (a small
# step after a large one: caches refilled) and a part per doubling (a large step after a small
# one), fitted apart: 0.06-0.15 ms per halving and 0.01-0.34 ms per doubling on those steps. A
# constant per change plus a part per doubling either way, tried first, left decodes after
# prefills 7-9 % over. Fitted only where engine steps were observed in order (the validation's
# calibration replays), zero otherwise.
SHAPE_CHANGE_TERMS = ("step_per_halving_s", "step_per_doubling_s")
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
    # A speculative verification chunk (the last token and its drafts): attended with the other
    # verification chunks in one batch, like decodes, not as a prefill of its own.
    verify: bool = False


@dataclass(frozen=True)
class StepObservation:
    """One measured step: its chunks on a model, and the time of its forward (without the
    scheduler's own overhead, which step_overhead covers)."""

    chunks: Sequence[Chunk]
    model: ModelSpec
    dtype: str
    block_size: int | None
    forward_s: float
    # Tokens of the step just before it, when it followed one without idling (SHAPE_CHANGE_TERMS);
    # None: unknown, after idle, or repeated back to back as the profile's forwards are.
    previous_tokens: int | None = None


@dataclass
class StepCost:
    total_s: float
    by_operator: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)  # the least direct source used
    expected_error: dict[str, float] = field(default_factory=dict)  # the largest expected error

    def add(self, name: str, prediction: Prediction, count: float = 1.0) -> None:
        self.by_operator[name] = self.by_operator.get(name, 0.0) + prediction.time_s * count
        worst = max(self.provenance.get(name, "measured"), prediction.provenance, key=PROVENANCES.index)
        self.provenance[name] = worst
        self.expected_error[name] = max(self.expected_error.get(name, 0.0), prediction.expected_error)
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
        t = math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
        return min(max(t, t0), t1), "interpolated"  # the clamp absorbs exp/log rounding


# When an operator has no curve of its own, the next one down this chain is used.
FALLBACK = {"attention_prefill": "attention", "attention_decode": "attention", "attention": "gemm",
            "kv_write": "memory", "sample": "memory"}


def curve_key(op: str, name: str | None = None, head_dim: int | None = None) -> str:
    if op in ("gemm", "elementwise") and name:
        return f"{op}:{name}"
    if op in ("attention_prefill", "attention_decode") and head_dim:
        return f"{op}:hd{head_dim}"
    return op


def _fallback(key: str) -> str | None:
    if key.startswith("gemm:"):
        return "gemm"
    if key.startswith("elementwise:"):
        return "memory"
    if key.startswith("attention_") and ":" in key:
        return key.split(":")[0]
    return FALLBACK.get(key)


def _additive(key: str) -> bool:
    """The engine's attention gathers K/V and then computes on them: the two sides add up. A GEMM
    streams and computes at once: the slower side decides."""
    return key.startswith("attention")


def work_of(m: Measurement) -> tuple[float, float] | None:
    """(FLOPs, bytes) of a measured operator, or None for ops outside the roofline model."""
    p = dict(m.params)
    dtype = canonical_dtype(p["dtype"]) if "dtype" in p else "fp32"
    if m.op == "gemm":
        return gemm_work(p["m"], p["n"], p["k"], dtype)
    if m.op == "attention_prefill":
        return prefill_attention_work(p["q_len"], p["kv_len"], p["num_heads"], p["num_kv_heads"], p["head_dim"], dtype)
    if m.op == "attention_decode":
        return decode_attention_work([p["kv_len"]] * p["batch"], p["num_heads"], p["num_kv_heads"], p["head_dim"],
                                     dtype)
    if m.op == "elementwise":
        return elementwise_work(p["tokens"], p["width"], dtype)
    if m.op == "kv_write":
        return kv_write_work(p["tokens"], p["num_kv_heads"], p["head_dim"], dtype)
    if m.op == "sample":
        return elementwise_work(p["batch"], p["vocab"], "fp32")
    return None


def curve_keys_of(m: Measurement) -> list[str]:
    """The curves a measurement helps fit: its own, and the family ones it falls back to."""
    params = dict(m.params)
    own = curve_key(m.op, m.name if m.op == "gemm" else params.get("name"), params.get("head_dim"))
    keys = [own]
    while (nxt := _fallback(keys[-1])) is not None and nxt not in keys:
        if nxt == "gemm" and m.op != "gemm":
            break  # attention falls back on the GEMM curve when predicting, but must not train it
        keys.append(nxt)
    return keys


class CostModel:
    def __init__(self, accelerator: Accelerator, curves: dict[str, EfficiencyCurve], errors: dict,
                 profile: Profile | None = None, peak_flops: float | None = None,
                 bandwidth: float | None = None) -> None:
        self.accelerator = accelerator
        self.curves = curves
        self.errors = errors
        self.profile = profile
        self._peak = peak_flops
        self._bandwidth = bandwidth
        self._series: dict[tuple, _Series] = {}
        self._verify_timers: dict[tuple, Callable[[int, int], float] | None] = {}  # verify_attention_timer's
        # A smaller working set is never slower to read: the measured curve's running maximum from
        # the large end (small reads are timed with call overhead that belongs to t0, not to bandwidth).
        self._bandwidth_envelope: list[tuple[int, float]] = []
        for size, bw in reversed(profile.bandwidth_by_size if profile is not None else []):
            best = max(bw, self._bandwidth_envelope[0][1]) if self._bandwidth_envelope else bw
            self._bandwidth_envelope.insert(0, (size, best))
        # All-reduce model (fitted on measured collectives, calibrate/fit.py); defaults are a guess.
        self.collective: dict[str, float] = {"base_s": 20e-6, "per_hop_s": 2e-6, "link_efficiency": 0.5}
        self.framework: dict[str, float] = {}  # FRAMEWORK_TERMS, fitted by fit_framework
        # A profile of servecast's own engine: its attention pads decodes in groups (engine/decode_groups.py).
        self.pads_decodes = profile is not None and profile.source.startswith("servecast")
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
        if accelerator.profiled and (profile is None or not profile.peaks):
            raise ValueError(f"{hardware} is a profiled local device: pass its profile "
                             "(run `servecast profile` first)")
        shipped = json.loads(Path(params_file).read_text())
        curves = {k: EfficiencyCurve.from_dict(v) for k, v in shipped["curves"].items()}
        errors = dict(shipped["expected_error"])
        errors.setdefault("by_curve", shipped.get("held_out_by_curve", {}))
        errors.setdefault("interpolated", 0.05)
        errors.setdefault("measured", 0.02)
        peak = bandwidth = None
        if profile is not None and profile.peaks:
            # The header's peak is one short benchmark; a profiled GEMM that ran faster proves the
            # device can, and the roofline must never be slower than what was measured.
            achieved = [gemm_work(m.get("m"), m.get("n"), m.get("k"), canonical_dtype(m.get("dtype")))[0] / m.time_s
                        for m in profile.of("gemm")]
            peak = max([profile.peaks.get("matmul_flops", 0.0), *achieved]) or None
            bandwidth = profile.peaks.get("memory_bandwidth")
        model = cls(accelerator, curves, errors, profile, peak, bandwidth)
        model.collective = shipped.get("all_reduce", model.collective)
        if profile is not None:
            model.fit_to(profile)
            model.fit_framework(profile)
        return model

    def _index(self, profile: Profile) -> None:
        points: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
        for m in profile.measurements:
            key, size = _series_key(m)
            if key is not None:
                points[key].append((size, m.time_s))
        self._series = {k: _Series(v) for k, v in points.items()}
        self._verify_timers = {}

    def fit_to(self, profile: Profile, min_points: int = 6) -> None:
        """Fit this device's own efficiency curves on a profile, per operator and per family."""
        from calibrate.fit import Sample, fit_curve  # scipy; no torch

        groups: dict[str, list[tuple[Sample, str]]] = defaultdict(list)
        for m in profile.measurements:
            work = work_of(m)
            if work is None:
                continue
            for key in curve_keys_of(m):
                groups[key].append((Sample(*work, m.time_s), m.get("dtype") if "dtype" in dict(m.params) else "fp32"))
        # Families first (many points, full curve), then each operator's own levels on its family's shape.
        families = [k for k in groups if ":" not in k]
        for key in sorted(groups, key=lambda k: (k not in families, k)):
            samples = groups[key]
            if len(samples) < min_points:
                continue
            dtype = samples[0][1]
            family = _fallback(key) if key not in families else None
            shape = self.curves.get(family) if family in groups else None
            self.curves[key] = fit_curve([s for s, _ in samples], self.peak_flops(dtype), self._bandwidth_for(key),
                                         start=None if key in families else self.curves.get(key), shape_from=shape,
                                         additive=_additive(key))

    # -- device facts -------------------------------------------------------------------------
    def peak_flops(self, dtype: str) -> float:
        if self._peak is not None:
            return self._peak
        return self.accelerator.peak_flops(dtype)

    @property
    def bandwidth(self) -> float:
        return self._bandwidth if self._bandwidth is not None else self.accelerator.memory_bandwidth

    def _bandwidth_for(self, key: str):
        """GEMMs and streaming ops (norms, adds, KV writes, sampling) read working sets whose size
        decides whether they come from cache or DRAM: they see the size-dependent bandwidth.
        Attention gathers then computes at step sizes dominated by per-call costs that the curves'
        overhead term carries: the single bandwidth."""
        if key.startswith(("gemm", "elementwise")) or key in ("kv_write", "memory", "sample"):
            return self.bandwidth_at
        return lambda nbytes: self.bandwidth

    def bandwidth_at(self, nbytes: float) -> float:
        """Bandwidth for a working set of nbytes: from the profile's measured curve where it has
        one (log-log interpolation, flat beyond its ends), else the single peak bandwidth."""
        curve = self._bandwidth_envelope
        if not curve:
            return self.bandwidth
        sizes = [c[0] for c in curve]
        i = bisect.bisect_left(sizes, nbytes)
        if i == 0:
            return curve[0][1]
        if i == len(curve):
            return curve[-1][1]
        (s0, b0), (s1, b1) = curve[i - 1], curve[i]
        w = (math.log(nbytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
        return math.exp(math.log(b0) + w * (math.log(b1) - math.log(b0)))

    def curve_used(self, key: str) -> str:
        """The curve that serves an operator: its own, or the first fallback that exists."""
        # Remembered while the set of curves is unchanged (curves are added or refitted, never removed).
        version = (id(self.curves), len(self.curves))
        memo = self.__dict__.get("_curve_used_memo")
        if memo is None or memo[0] != version:
            memo = self._curve_used_memo = (version, {})
        used = memo[1].get(key)
        if used is None:
            used = memo[1][key] = self._resolve_curve(key)
        return used

    def _resolve_curve(self, key: str) -> str:
        k: str | None = key
        while k is not None:
            if k in self.curves:
                return k
            k = _fallback(k)
        raise ValueError(f"no efficiency curve for {key!r} (nor its fallbacks): the parameter file is incomplete")

    def curve(self, key: str) -> EfficiencyCurve:
        return self.curves[self.curve_used(key)]

    # -- operators ----------------------------------------------------------------------------
    def _model(self, key: str, flops: float, nbytes: float, dtype: str) -> Prediction:
        peak = self.peak_flops(dtype)
        bandwidth = self._bandwidth_for(key)(nbytes)
        used = self.curve_used(key)
        t = self.curves[used].time(flops, nbytes, peak, bandwidth, _additive(used))
        roofline = max(flops / peak, nbytes / bandwidth)
        provenance = "fitted" if self.profile is not None else "extrapolated"
        return Prediction(max(t, roofline), provenance, self.expected_error(provenance, key))

    def expected_error(self, provenance: str, key: str | None = None) -> float:
        """Relative error to expect: held-out figures per curve where the parameter file has them;
        an operator with no validated curve of its own gets the 'unvalidated' figure."""
        if provenance == "extrapolated" and key is not None:
            used = self.curve_used(key)
            same_family = used == key or (key.startswith("gemm:") and used == "gemm")
            by_curve = self.errors.get("by_curve", {})
            if same_family and used in by_curve:
                return by_curve[used]
            return self.errors.get("unvalidated", 0.5)
        return self.errors[provenance]

    def _lookup(self, key: tuple, size: int, fallback) -> Prediction:
        series = self._series.get(key)
        if series is None:
            return fallback()
        t, provenance = series.at(size)
        return Prediction(t, provenance, self.errors[provenance])

    def predict_gemm(self, m: int, n: int, k: int, dtype: str, name: str | None = None,
                     weight_dtype: str | None = None) -> Prediction:
        """name: the layer ('qkv_proj', 'lm_head', ...) when known, to use its own curve.
        weight_dtype: weights stored narrower than the compute dtype (weight-only quantization):
        the same curve over fewer weight bytes, never a profile's point of other weights."""
        dtype = canonical_dtype(dtype)
        if weight_dtype is not None and weight_dtype != dtype:
            series = self._series.get(("gemm_quant", n, k, dtype, weight_dtype))
            if series is not None:  # measured with the engine's quantized kernels (gemm_quant)
                t, provenance = series.at(m)
                return Prediction(t, provenance, self.errors[provenance])
            flops, nbytes = gemm_work(m, n, k, dtype)
            nbytes -= k * n * (DTYPE_BYTES[dtype] - WEIGHT_BYTES[weight_dtype])
            prediction = self._model(curve_key("gemm", name), flops, nbytes, dtype)
            return Prediction(prediction.time_s, "extrapolated", self.errors.get("unvalidated", 0.5))
        return self._lookup(("gemm", n, k, dtype), m,
                            lambda: self._model(curve_key("gemm", name), *gemm_work(m, n, k, dtype), dtype))

    def gemm(self, m: int, n: int, k: int, dtype: str) -> float:
        return self.predict_gemm(m, n, k, dtype).time_s

    def predict_attention_prefill(self, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                                  dtype: str) -> Prediction:
        dtype = canonical_dtype(dtype)
        work = prefill_attention_work(q_len, kv_len, num_heads, num_kv_heads, head_dim, dtype)
        return self._lookup(("attention_prefill", q_len, num_heads, num_kv_heads, head_dim, dtype), kv_len,
                            lambda: self._model(curve_key("attention_prefill", head_dim=head_dim), *work, dtype))

    def attention_prefill(self, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                          dtype: str) -> float:
        return self.predict_attention_prefill(q_len, kv_len, num_heads, num_kv_heads, head_dim, dtype).time_s

    def predict_attention_decode(self, batch: int, kv_len: int | Sequence[int], num_heads: int, num_kv_heads: int,
                                 head_dim: int, dtype: str) -> Prediction:
        kv_lens = [kv_len] * batch if isinstance(kv_len, int) else list(kv_len)
        if len(kv_lens) != batch:
            raise ValueError(f"attention_decode: {len(kv_lens)} context lengths for a batch of {batch}")
        return self.predict_attention_decode_total(batch, sum(kv_lens), num_heads, num_kv_heads, head_dim, dtype)

    def predict_attention_decode_total(self, batch: int, total_kv: int, num_heads: int, num_kv_heads: int,
                                       head_dim: int, dtype: str) -> Prediction:
        """Decode attention of `batch` requests attending to total_kv keys in all: the work depends
        on no more than that, and a profile (equal lengths) is read at the batch's mean length."""
        dtype = canonical_dtype(dtype)
        key = ("attention_decode", batch, num_heads, num_kv_heads, head_dim, dtype)
        time_of = self.attention_decode_timer(batch, num_heads, num_kv_heads, head_dim, dtype)
        series = self._series.get(key)
        if series is not None:
            provenance = series.at(max(1, round(total_kv / batch)))[1]
            return Prediction(time_of(total_kv), provenance, self.errors[provenance])
        provenance = "fitted" if self.profile is not None else "extrapolated"
        return Prediction(time_of(total_kv), provenance,
                          self.expected_error(provenance, curve_key("attention_decode", head_dim=head_dim)))

    def predict_attention_verify(self, batch: int, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int,
                                 head_dim: int, dtype: str) -> Prediction:
        """`batch` verification chunks of q_len queries, each ending at context kv_len."""
        prediction = self.predict_attention_verify_total(batch, q_len, batch * kv_len, num_heads, num_kv_heads,
                                                         head_dim, dtype)
        if prediction is None:  # read like a batch of decodes over the same keys
            return self.predict_attention_decode_total(batch, batch * kv_len, num_heads, num_kv_heads, head_dim, dtype)
        return prediction

    def predict_attention_verify_total(self, batch: int, queries: int, total_kv: int, num_heads: int,
                                       num_kv_heads: int, head_dim: int, dtype: str) -> Prediction | None:
        time_of = self.verify_attention_timer(queries, num_heads, num_kv_heads, head_dim, dtype)
        if time_of is None:
            return None
        series = self._series.get(("attention_verify", batch, queries, num_heads, num_kv_heads, head_dim,
                                   canonical_dtype(dtype)))
        provenance = series.at(max(1, round(total_kv / batch)))[1] if series is not None else "interpolated"
        return Prediction(time_of(batch, total_kv), provenance, self.errors[provenance])

    def kv_dequant_timer(self, kv_dtype: str | None, num_kv_heads: int, head_dim: int,
                         dtype: str) -> Callable[[int], float] | None:
        """Extra seconds of reading `tokens` tokens' K and V of one layer from a quantized cache
        (int8 / fp8: gather and dequantize) over reading them from a plain one, from the profile's
        kv_gather points; None when the cache is not quantized or the profile lacks them."""
        if kv_dtype not in ("int8", "fp8"):
            return None
        dtype = canonical_dtype(dtype)
        quantized = self._series.get(("kv_gather", num_kv_heads, head_dim, dtype, kv_dtype))
        plain = self._series.get(("kv_gather", num_kv_heads, head_dim, dtype, "none"))
        if quantized is None or plain is None:
            return None
        return lambda tokens: max(0.0, quantized.at(max(1, tokens))[0] - plain.at(max(1, tokens))[0])

    def verify_attention_timer(self, queries: int, num_heads: int, num_kv_heads: int, head_dim: int,
                               dtype: str) -> Callable[[int, int], float] | None:
        """Seconds of one speculative-verification attention call (engine/attention.py VerifyBatch:
        chunks of `queries` tokens, padded to the longest) as a function of (chunks, their total
        context), from the profile's attention_verify points: the smallest measured query count
        that holds `queries`, linear in the chunk count between measured counts (proportional past
        the largest), each count read at the chunks' mean context. None where the profile has no
        such points (the caller then reads verification like a batch of decodes)."""
        dtype = canonical_dtype(dtype)
        memo_key = (queries, num_heads, num_kv_heads, head_dim, dtype)
        if memo_key not in self._verify_timers:  # built once: a simulation asks for it every new step
            self._verify_timers[memo_key] = self._verify_attention_timer(*memo_key)
        return self._verify_timers[memo_key]

    def _verify_attention_timer(self, queries: int, num_heads: int, num_kv_heads: int, head_dim: int,
                                dtype: str) -> Callable[[int, int], float] | None:
        by_q: dict[int, dict[int, _Series]] = defaultdict(dict)
        for key, series in self._series.items():
            if key[0] == "attention_verify" and key[3:] == (num_heads, num_kv_heads, head_dim, dtype):
                by_q[key[2]][key[1]] = series
        if not by_q:
            return None
        fitting = [q for q in by_q if q >= queries]
        per_batch = by_q[min(fitting) if fitting else max(by_q)]
        batches = sorted(per_batch)

        def time_of(batch: int, total_kv: int) -> float:
            kv = max(1, round(total_kv / batch))
            return across_counts(batches, batch, lambda b: per_batch[b].at(kv), scale_below=False)[0]
        return time_of

    def attention_decode_timer(self, batch: int, num_heads: int, num_kv_heads: int, head_dim: int,
                               dtype: str) -> Callable[[int], float]:
        """Seconds of one decode-attention call over `batch` requests as a function of their total
        context, with everything that does not depend on the context looked up once (the
        simulator calls it every step)."""
        dtype = canonical_dtype(dtype)
        series = self._series.get(("attention_decode", batch, num_heads, num_kv_heads, head_dim, dtype))
        if series is not None:
            return lambda total_kv: series.at(max(1, round(total_kv / batch)))[0]
        key = curve_key("attention_decode", head_dim=head_dim)
        peak, bandwidth_of = self.peak_flops(dtype), self._bandwidth_for(key)
        used = self.curve_used(key)
        curve, additive = self.curves[used], _additive(used)

        def time_of(total_kv: int) -> float:  # _model's arithmetic, term for term
            flops, nbytes = decode_attention_work_total(total_kv, batch, num_heads, num_kv_heads, head_dim, dtype)
            bandwidth = bandwidth_of(nbytes)
            t = curve.time(flops, nbytes, peak, bandwidth, additive)
            return max(t, max(flops / peak, nbytes / bandwidth))
        return time_of

    def attention_decode(self, batch: int, kv_len: int | Sequence[int], num_heads: int, num_kv_heads: int,
                         head_dim: int, dtype: str) -> float:
        return self.predict_attention_decode(batch, kv_len, num_heads, num_kv_heads, head_dim, dtype).time_s

    def predict_elementwise(self, name: str, tokens: int, width: int, dtype: str) -> Prediction:
        dtype = canonical_dtype(dtype)
        return self._lookup(("elementwise", name, width, dtype), tokens,
                            lambda: self._model(curve_key("elementwise", name),
                                                *elementwise_work(tokens, width, dtype), dtype))

    def predict_kv_write(self, tokens: int, num_kv_heads: int, head_dim: int, dtype: str) -> Prediction:
        dtype = canonical_dtype(dtype)
        return self._lookup(("kv_write", num_kv_heads, head_dim, dtype), tokens,
                            lambda: self._model("kv_write", *kv_write_work(tokens, num_kv_heads, head_dim, dtype),
                                                dtype))

    def predict_sample(self, batch: int, vocab: int, dtype: str = "bf16") -> Prediction:
        """Sampling over float32 logits; dtype picks the compute peak (the op is bandwidth-bound)."""
        return self._lookup(("sample", vocab), batch,
                            lambda: self._model("sample", *elementwise_work(batch, vocab, "fp32"),
                                                canonical_dtype(dtype)))

    def predict_all_reduce(self, nbytes: int, world: int) -> Prediction:
        if world <= 1:
            return Prediction(0.0, "measured", 0.0)
        link = (self.accelerator.interconnect_gbps or 64) * 1e9
        c = self.collective

        def ring() -> Prediction:
            # Ring all-reduce: 2 (w-1)/w of the bytes cross each link, plus fixed and per-hop latency.
            t = c["base_s"] + c["per_hop_s"] * (world - 1) + 2 * (world - 1) / world * nbytes / (
                c["link_efficiency"] * link)
            return Prediction(t, "extrapolated", self.errors.get("by_curve", {}).get(
                "all_reduce", self.errors.get("unvalidated", 0.5)))
        return self._lookup(("all_reduce", world), nbytes, ring)

    def all_reduce(self, nbytes: int, world: int) -> float:
        return self.predict_all_reduce(nbytes, world).time_s

    def predict_step_overhead(self, batch: int) -> Prediction:
        # Without a profile the host-side cost is unknown; it is hidden behind GPU work in a
        # well-pipelined engine, so it counts as zero there.
        return self._lookup(("step_overhead",), batch, lambda: Prediction(0.0, "extrapolated", 0.0))

    def predict_idle_wakeup(self, idle_s: float) -> Prediction:
        """Extra time of the first step after idle_s seconds without work: interpolated from the
        profile's measurements (none below the shortest idle measured); zero without them."""
        series = self._series.get(("idle_wakeup",))
        idle_ms = idle_s * 1e3
        if series is None or idle_ms < series.sizes[0]:
            return Prediction(0.0, "extrapolated" if series is None else "interpolated", 0.0)
        t, provenance = series.at(max(1, round(idle_ms)))
        return Prediction(t if idle_ms < series.sizes[-1] else series.times[-1], provenance,
                          self.errors[provenance])

    def predict_framework(self, num_chunks: int, tokens: int, layers: int, operators_s: float = 0.0,
                          prefill_chunks: int = 0, decode_groups: int = 0, verifying: int = 0,
                          moe: tuple[float, float] = (0.0, 0.0)) -> Prediction:
        """What a whole step costs beyond the sum of its operators (operators_s): input
        preparation, Python and framework dispatch per layer and per step, and the operators'
        in-situ speed relative to their isolated timings (operator_scale). Zero without
        whole-forward measurements."""
        f = self.framework
        if not f:
            return Prediction(0.0, "extrapolated", 0.0)
        t = (f["operator_scale"] - 1.0) * operators_s + framework_overhead(f, num_chunks, prefill_chunks, decode_groups, tokens,
                                                                         layers, verifying, moe)
        return Prediction(t, "fitted", self.errors.get("fitted", 0.15))

    def predict_shape_change(self, previous_tokens: int | None, tokens: int) -> Prediction:
        """Extra time of a step of `tokens` tokens right after one of previous_tokens
        (SHAPE_CHANGE_TERMS); zero where they were not fitted, or without a previous step."""
        f = self.framework
        if "step_per_halving_s" not in f:
            return Prediction(0.0, "extrapolated", 0.0)
        halvings, doublings = shape_change_features(previous_tokens, tokens)
        return Prediction(halvings * f["step_per_halving_s"] + doublings * f["step_per_doubling_s"],
                          "fitted", self.errors.get("fitted", 0.15))

    def fit_framework(self, profile: Profile, steps: Sequence[StepObservation] = ()) -> None:
        """Non-negative least squares of measured whole steps -- the profile's forward points, and
        any engine steps observed on this device (steps) -- on the sum of their operators'
        predictions (scaled) plus per-step and per-layer terms in chunks, prefill chunks, decode
        attention groups and tokens; and where steps were observed in order (previous_tokens), what
        a change of step shape costs (SHAPE_CHANGE_TERMS)."""
        from scipy.optimize import nnls

        observations = list(steps)
        for m in profile.of("forward"):
            p = dict(m.params)
            spec = ModelSpec(name="profiled", model_type="llama", num_layers=p["layers"], hidden_size=p["hidden"],
                             intermediate_size=p["ffn"], num_heads=p["num_heads"], num_kv_heads=p["num_kv_heads"],
                             head_dim=p["head_dim"], vocab_size=p["vocab"], max_position_embeddings=p["kv_len"],
                             num_experts=max(1, p["experts"]), experts_per_token=max(1, p["top_k"]),
                             moe_intermediate_size=p["moe_ffn"], shared_expert_intermediate_size=p["shared_ffn"],
                             num_dense_layers=p["dense_layers"])
            step = [Chunk(p["q_len"], kv) for kv in forward_contexts(p)] + (
                [Chunk(p["extra_q"], p["extra_kv"])] if p["extra_q"] else [])
            observations.append(StepObservation(step, spec, p["dtype"], p["block_size"], m.time_s))
        rows, measured, has_prefill, chunk_counts, verify_rows, moe_rows, shape_rows = [], [], [], [], [], [], []
        for o in observations:
            ops = self.step_time(o.chunks, o.model, 1, o.dtype, include_host=False, block_size=o.block_size).total_s
            chunks, tokens, prefills, groups, verifying = host_features(o.chunks, o.block_size)
            layers = o.model.num_layers
            features = [1.0, chunks, prefills, groups, tokens]
            rows.append([ops, *features, *(layers * x for x in features)])
            verify_rows.append([verifying, layers * verifying])
            moe_rows.append(list(moe_host_features(o.model, tokens)))
            shape_rows.append(list(shape_change_features(o.previous_tokens, tokens)))
            measured.append(o.forward_s)
            has_prefill.append(prefills > 0)
            chunk_counts.append(chunks)
        terms = FRAMEWORK_TERMS
        if any(v for v, _ in verify_rows):
            rows = [row + v for row, v in zip(rows, verify_rows)]
            terms = terms + VERIFY_TERMS
        if any(m for m, _ in moe_rows):
            rows = [row + m for row, m in zip(rows, moe_rows)]
            terms = terms + MOE_TERMS
        if any(halvings or doublings for halvings, doublings in shape_rows):
            rows = [row + c for row, c in zip(rows, shape_rows)]
            terms = terms + SHAPE_CHANGE_TERMS
        if len(rows) < 2 * len(FRAMEWORK_TERMS):
            return
        # Relative errors (each row divided by its time): small decode steps, which set TPOT, weigh
        # as much as large prefill steps. Any replay is mostly small all-decode steps, so each kind
        # of step -- with or without a prefill chunk (those set TTFT), at its batch size to within
        # a factor of two -- gets equal total weight (weights enter squared).
        kinds = [(prefill, max(n, 1).bit_length()) for prefill, n in zip(has_prefill, chunk_counts)]
        per_kind = Counter(kinds)
        balance = np.array([1.0 / np.sqrt(per_kind[kind]) for kind in kinds])
        a, b = np.array(rows), np.array(measured)
        weights = balance / b
        coefficients, _ = nnls(a * weights[:, None], b * weights)
        # Dividing by the measured time favours predicting low: a step that happened to run slow
        # weighs less than one that ran fast, so the fit lands below the typical step by about the
        # square of the noise (several percent on a shared machine), and every request-level sum of
        # step times inherits it. Reweighting by the *predicted* time (twice, from the first fit)
        # keeps relative weights but makes each step shape's fit its mean.
        for _ in range(2):
            predicted = np.maximum(a @ coefficients, 1e-9)
            weights = balance / predicted
            coefficients, _ = nnls(a * weights[:, None], b * weights)
        self.framework = dict(zip(terms, (float(c) for c in coefficients)))

    def predict(self, op: str, **params) -> Prediction:
        """Any operator by its profile name and keys (as in simulator/cost/profile_format.py)."""
        methods = {"gemm": self.predict_gemm, "attention_prefill": self.predict_attention_prefill,
                   "attention_decode": self.predict_attention_decode,
                   "attention_verify": self.predict_attention_verify, "elementwise": self.predict_elementwise,
                   "kv_write": self.predict_kv_write, "sample": self.predict_sample,
                   "all_reduce": self.predict_all_reduce, "step_overhead": self.predict_step_overhead,
                   "framework": self.predict_framework, "idle_wakeup": self.predict_idle_wakeup,
                   "shape_change": self.predict_shape_change}
        if op not in methods:
            raise ValueError(f"unknown operator {op!r}; known: {', '.join(methods)}")
        return methods[op](**params)

    # -- a whole step -------------------------------------------------------------------------
    def step_time(self, chunks: Sequence[Chunk], model: ModelSpec, tp: int = 1, dtype: str = "bf16",
                  include_host: bool = True, block_size: int | None = None, expert_parallel: bool = False,
                  routing_skew: float = 0.0) -> StepCost:
        """Time of one engine step computing the given chunks: every layer's GEMMs over all tokens,
        attention per chunk (prefill chunks one by one, decodes batched), KV writes, norms, rotary,
        activation and residual adds, the LM head and sampling for the sampled rows, all-reduces
        under TP (decodes in the engine's padded batches where block_size is given and the profile
        is of servecast's engine), and (include_host) the scheduler's overhead and the framework overhead that the
        operators leave out (fitted on whole-forward measurements where the profile has them)."""
        cost = StepCost(0.0)
        if not chunks:
            return cost
        self.add_token_ops(cost, sum(c.num_tokens for c in chunks), model, tp, dtype,
                           expert_parallel=expert_parallel, routing_skew=routing_skew)
        for c in chunks:
            if c.num_tokens > 1 and not c.verify:
                self.add_prefill_attention(cost, c.num_tokens, c.context_len, model, tp, dtype)
        decodes = [c.context_len for c in chunks if c.num_tokens == 1]
        if decodes:
            self.add_decode_attention(cost, decodes, model, tp, dtype, block_size=block_size)
        verifying = [c for c in chunks if c.num_tokens > 1 and c.verify]
        if verifying:
            self.add_verify_attention(cost, len(verifying), max(c.num_tokens for c in verifying),
                                      sum(c.context_len for c in verifying), model, tp, dtype)
        # Every verified row goes through the LM head (and is compared), not only the sampled one.
        self.add_head(cost, sum((c.num_tokens if c.verify else 1) for c in chunks if c.samples), model, tp, dtype)
        if include_host:
            operators_s = cost.total_s
            cost.add("step_overhead", self.predict_step_overhead(len(chunks)))
            num_chunks, tokens, prefills, groups, verifying = host_features(chunks, block_size)
            cost.add("framework", self.predict_framework(num_chunks, tokens, model.num_layers, operators_s, prefills,
                                                         groups, verifying, moe_host_features(model, tokens)))
        return cost

    # The parts of a step, each a function of few integers so that the simulator can cache them.
    def add_token_ops(self, cost: StepCost, tokens: int, model: ModelSpec, tp: int, dtype: str,
                      layers: int | None = None, weight_dtype: str | None = None, expert_parallel: bool = False,
                      routing_skew: float = 0.0) -> None:
        """Operators whose work follows the step's token count, over `layers` layers (default all):
        the linear layers, KV writes, norms, rotary, activation, residual adds and TP all-reduces;
        for a mixture-of-experts model, its MoE layers' feed-forward as add_moe costs it."""
        dtype = canonical_dtype(dtype)
        layers = model.num_layers if layers is None else layers
        moe_layers = round(layers * model.num_moe_layers / model.num_layers)
        dense_layers = layers - moe_layers
        heads, kv_heads = model.num_heads // tp, max(model.num_kv_heads // tp, 1)
        shapes = model.linear_shapes(tp)
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            n, k = shapes[name]
            count = dense_layers if name in ("gate_up_proj", "down_proj") else layers
            if count:
                cost.add(name, self.predict_gemm(tokens, n, k, dtype, name, weight_dtype), count)
        cost.add("kv_write", self.predict_kv_write(tokens, kv_heads, model.head_dim, dtype), layers)
        widths = {"rms_norm": model.hidden_size, "rope": (heads + kv_heads) * model.head_dim,
                  "swiglu": model.intermediate_size // tp, "add": model.hidden_size}
        for name, width in widths.items():
            per_layer = 2 if name in ("rms_norm", "add") else 1
            count = per_layer * (dense_layers if name == "swiglu" else layers)
            if count:
                cost.add(name, self.predict_elementwise(name, tokens, width, dtype), count)
        if tp > 1:
            # After attention and after the MLP of every layer, and (whole model) after the
            # vocabulary-parallel embedding. (An expert-parallel MoE layer's exchange is add_moe's.)
            nbytes = tokens * model.hidden_size * DTYPE_BYTES[dtype]
            count = 2 * layers + (1 if layers == model.num_layers else 0) - (moe_layers if expert_parallel else 0)
            cost.add("all_reduce", self.predict_all_reduce(nbytes, tp), count)
        if moe_layers:
            self.add_moe(cost, tokens, model, tp, dtype, moe_layers, weight_dtype, expert_parallel, routing_skew)

    def token_ops_timer(self, model: ModelSpec, tp: int, dtype: str,
                        weight_dtype: str | None = None) -> Callable[[int], tuple[float, float]] | None:
        """tokens -> (total seconds, all-reduce seconds) of add_token_ops over all layers, the same
        sums term for term, with everything that does not depend on the token count looked up
        once (the simulator asks at every step with a new token count). None for mixture-of-experts
        models: add_token_ops serves them."""
        if model.num_moe_layers:
            return None
        dtype = canonical_dtype(dtype)
        layers = model.num_layers
        heads, kv_heads = model.num_heads // tp, max(model.num_kv_heads // tp, 1)
        shapes = model.linear_shapes(tp)
        ops: list[tuple[Callable[[int], float], int]] = []  # in add_token_ops' order
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            n, k = shapes[name]
            ops.append((self._gemm_timer(n, k, dtype, name, weight_dtype), layers))
        ops.append((self._op_timer(("kv_write", kv_heads, model.head_dim, dtype), "kv_write", dtype,
                                   lambda t: kv_write_work(t, kv_heads, model.head_dim, dtype)), layers))
        widths = {"rms_norm": model.hidden_size, "rope": (heads + kv_heads) * model.head_dim,
                  "swiglu": model.intermediate_size // tp, "add": model.hidden_size}
        for name, width in widths.items():
            ops.append((self._op_timer(("elementwise", name, width, dtype), curve_key("elementwise", name), dtype,
                                       lambda t, w=width: elementwise_work(t, w, dtype)),
                        (2 if name in ("rms_norm", "add") else 1) * layers))
        element = DTYPE_BYTES[dtype]

        def time_of(tokens: int) -> tuple[float, float]:
            total = 0.0
            for op_time, count in ops:
                total += op_time(tokens) * count
            if tp == 1:
                return total, 0.0
            all_reduce = self.predict_all_reduce(tokens * model.hidden_size * element, tp).time_s * (2 * layers + 1)
            return total + all_reduce, 0.0 + all_reduce
        return time_of

    def _op_timer(self, series_key: tuple | None, curve: str, dtype: str,
                  work: Callable[[int], tuple[float, float]]) -> Callable[[int], float]:
        """size -> the time of _lookup(series_key, size, _model(curve, *work(size), dtype)) (no
        series_key: _model's alone)."""
        series = self._series.get(series_key) if series_key is not None else None
        if series is not None:
            return lambda size: series.at(size)[0]
        peak, bandwidth_of = self.peak_flops(dtype), self._bandwidth_for(curve)
        used = self.curve_used(curve)
        fitted, additive = self.curves[used], _additive(used)

        def time_of(size: int) -> float:  # _model's arithmetic, term for term
            flops, nbytes = work(size)
            bandwidth = bandwidth_of(nbytes)
            t = fitted.time(flops, nbytes, peak, bandwidth, additive)
            return max(t, max(flops / peak, nbytes / bandwidth))
        return time_of

    def _gemm_timer(self, n: int, k: int, dtype: str, name: str, weight_dtype: str | None) -> Callable[[int], float]:
        """m -> predict_gemm(m, n, k, dtype, name, weight_dtype).time_s."""
        if weight_dtype is None or weight_dtype == dtype:
            return self._op_timer(("gemm", n, k, dtype), curve_key("gemm", name), dtype, lambda m: gemm_work(m, n, k, dtype))
        series = self._series.get(("gemm_quant", n, k, dtype, weight_dtype))
        if series is not None:
            return lambda m: series.at(m)[0]
        saved = k * n * (DTYPE_BYTES[dtype] - WEIGHT_BYTES[weight_dtype])

        def narrower(m: int) -> tuple[float, float]:
            flops, nbytes = gemm_work(m, n, k, dtype)
            return flops, nbytes - saved
        return self._op_timer(None, curve_key("gemm", name), dtype, narrower)

    def add_moe(self, cost: StepCost, tokens: int, model: ModelSpec, tp: int, dtype: str, layers: int,
                weight_dtype: str | None = None, expert_parallel: bool = False, routing_skew: float = 0.0) -> None:
        """The feed-forward of `layers` MoE layers for a step of `tokens` tokens (engine/moe.py):
        - router, dispatch and combine (moe_dispatch: measured where profiled);
        - the routed experts: the expected experts touched and rows per expert at this token count
          (simulator/cost/moe.py) -- few tokens touch few experts and read only their weights,
          many touch all and run them compute-bound; on the most loaded rank under expert
          parallelism (every rank waits for it). Measured (moe_experts) where profiled, otherwise
          grouped GEMMs over the touched experts (predict_moe_experts);
        - the shared expert, every token;
        - under expert parallelism, the all-to-all out and back of each rank's share of the rows
          and the gather of the token shares; under tensor parallelism, the shared expert's own
          all-reduce (the routed experts' is the per-layer one of add_token_ops)."""
        element = DTYPE_BYTES[dtype]
        ranks = tp if expert_parallel else 1
        load = step_load(tokens, model.num_experts, model.experts_per_token, routing_skew, ranks)
        shapes = model.expert_shapes(tp, expert_parallel)
        cost.add("moe_dispatch", self.predict_moe_dispatch(tokens, model.num_experts, model.experts_per_token,
                                                           model.hidden_size, dtype), layers)
        cost.add("moe_experts", self.predict_moe_experts(load.rows_per_expert, load.active_experts, model.hidden_size,
                                                         shapes["expert_down"][1], dtype, weight_dtype), layers)
        if "shared_gate_up" in shapes:
            for name in ("shared_gate_up", "shared_down"):
                n, k = shapes[name]
                cost.add(name, self.predict_gemm(tokens, n, k, dtype, "gate_up_proj" if "gate_up" in name
                                                 else "down_proj", weight_dtype), layers)
            cost.add("swiglu", self.predict_elementwise("swiglu", tokens, shapes["shared_down"][1], dtype), layers)
            if tp > 1:
                cost.add("all_reduce", self.predict_all_reduce(tokens * model.hidden_size * element, tp), layers)
        if expert_parallel and tp > 1:
            share = -(-tokens // tp)
            rows_bytes = share * model.experts_per_token * (model.hidden_size + 1) * element
            cost.add("all_to_all", self.predict_all_to_all(rows_bytes, tp), 2 * layers)
            # The token shares gathered back: a ring all-gather moves about what an all-reduce of
            # half the bytes does.
            cost.add("all_reduce", self.predict_all_reduce(tokens * model.hidden_size * element // 2, tp), layers)

    def predict_moe_experts(self, rows_per_expert: float, active: float, hidden: int, ffn: int, dtype: str,
                            weight_dtype: str | None = None) -> Prediction:
        """Seconds of one MoE layer's routed experts: `active` experts each computing its SwiGLU MLP
        (hidden -> ffn -> hidden) over rows_per_expert rows. Measured (moe_experts, per number of
        active experts over rows per expert, interpolated between measured expert counts) where
        the profile has this shape in this dtype -- servecast's engine runs a GEMM per expert;
        otherwise grouped GEMMs over all the experts' rows."""
        dtype = canonical_dtype(dtype)
        if active <= 0:
            return Prediction(0.0, "measured", 0.0)
        rows = max(1.0, rows_per_expert)  # fractional: some experts get one row more than others
        shape = (hidden, ffn, dtype)  # the numbers of active experts measured at this shape, ascending
        measured = sorted(key[1] for key in self._series if key[0] == "moe_experts" and key[2:] == shape) \
            if weight_dtype in (None, dtype) else None
        if measured:
            t, provenance = across_counts(
                measured, active, lambda a: self._series[("moe_experts", a, hidden, ffn, dtype)].at(rows),
                scale_below=True)
            return Prediction(t, provenance, self.errors[provenance])
        # Serving stacks run a layer's experts as grouped GEMMs (vLLM's fused_moe: one kernel over
        # every expert's rows), not a kernel per expert: two operators whose work is all the rows'
        # FLOPs and the touched experts' weights.
        total_rows = rows_per_expert * active
        weight_bytes = WEIGHT_BYTES.get(weight_dtype or dtype, DTYPE_BYTES[dtype])
        element = DTYPE_BYTES[dtype]
        t = 0.0
        for name, (n, k) in (("gate_up_proj", (2 * ffn, hidden)), ("down_proj", (hidden, ffn))):
            flops = 2.0 * total_rows * n * k
            nbytes = active * n * k * weight_bytes + total_rows * (n + k) * element
            t += self._model(curve_key("gemm", name), flops, nbytes, dtype).time_s
        t += self.predict_elementwise("swiglu", max(1, round(total_rows)), ffn, dtype).time_s
        return Prediction(t, "extrapolated", self.errors.get("unvalidated", 0.5))

    def predict_moe_dispatch(self, tokens: int, num_experts: int, top_k: int, hidden: int, dtype: str) -> Prediction:
        """Router scores, top-k, grouping the (token, expert) rows by expert and the weighted sum back
        (engine/moe.py without the experts): measured where profiled, otherwise the router GEMM and
        two passes over the rows."""
        dtype = canonical_dtype(dtype)

        def modeled() -> Prediction:
            t = (self.predict_gemm(tokens, num_experts, hidden, dtype, "router").time_s
                 + 2 * self.predict_elementwise("add", tokens * top_k, hidden, dtype).time_s)
            return Prediction(t, "extrapolated", self.errors.get("unvalidated", 0.5))
        return self._lookup(("moe_dispatch", num_experts, top_k, hidden, dtype), tokens, modeled)

    def predict_all_to_all(self, nbytes: int, world: int) -> Prediction:
        """One all-to-all in which each rank sends nbytes in all (an even share to every rank):
        measured (all_to_all) where profiled, otherwise (w-1)/w of the bytes over each link plus the
        all-reduce's fixed and per-hop latency."""
        if world <= 1:
            return Prediction(0.0, "measured", 0.0)
        link = (self.accelerator.interconnect_gbps or 64) * 1e9
        c = self.collective

        def modeled() -> Prediction:
            t = c["base_s"] + c["per_hop_s"] * (world - 1) + (world - 1) / world * nbytes / (
                c["link_efficiency"] * link)
            return Prediction(t, "extrapolated", self.errors.get("by_curve", {}).get(
                "all_reduce", self.errors.get("unvalidated", 0.5)))
        return self._lookup(("all_to_all", world), nbytes, modeled)

    def add_prefill_attention(self, cost: StepCost, num_tokens: int, context_len: int, model: ModelSpec, tp: int,
                              dtype: str, layers: int | None = None) -> None:
        heads, kv_heads = model.num_heads // tp, max(model.num_kv_heads // tp, 1)
        cost.add("attention_prefill", self.predict_attention_prefill(
            num_tokens, context_len, heads, kv_heads, model.head_dim, dtype),
            model.num_layers if layers is None else layers)

    def add_decode_attention(self, cost: StepCost, context_lens: Sequence[int], model: ModelSpec, tp: int, dtype: str,
                             layers: int | None = None, block_size: int | None = None) -> None:
        """Decode attention of one step. On a device profiled with servecast's engine, given the
        block size, decodes are attended as the engine does it: in padded batches of similar
        context (engine/decode_groups.py); elsewhere as one batch of exact lengths (paged kernels)."""
        heads, kv_heads = model.num_heads // tp, max(model.num_kv_heads // tp, 1)
        layers = model.num_layers if layers is None else layers
        if block_size is not None and self.pads_decodes:
            for batch, padded in padded_decode_batches(context_lens, block_size):
                cost.add("attention_decode", self.predict_attention_decode(
                    batch, padded, heads, kv_heads, model.head_dim, dtype), layers)
            return
        cost.add("attention_decode", self.predict_attention_decode(
            len(context_lens), context_lens, heads, kv_heads, model.head_dim, dtype), layers)

    def add_decode_attention_total(self, cost: StepCost, batch: int, total_context: int, model: ModelSpec, tp: int,
                                   dtype: str) -> None:
        """add_decode_attention of one batch of paged decodes, given only their number and total context
        (all the work depends on)."""
        heads, kv_heads = model.num_heads // tp, max(model.num_kv_heads // tp, 1)
        cost.add("attention_decode", self.predict_attention_decode_total(
            batch, total_context, heads, kv_heads, model.head_dim, dtype), model.num_layers)

    def add_verify_attention(self, cost: StepCost, batch: int, queries: int, total_context: int, model: ModelSpec,
                             tp: int, dtype: str) -> None:
        """Speculative verification chunks attended together: measured (attention_verify) where the
        profile has it, otherwise read like one batch of decodes (bound by its KV reads)."""
        heads, kv_heads = model.num_heads // tp, max(model.num_kv_heads // tp, 1)
        prediction = self.predict_attention_verify_total(batch, queries, total_context, heads, kv_heads,
                                                         model.head_dim, dtype)
        name = "attention_verify" if prediction is not None else "attention_decode"
        if prediction is None:
            prediction = self.predict_attention_decode_total(batch, total_context, heads, kv_heads, model.head_dim,
                                                             dtype)
        cost.add(name, prediction, model.num_layers)

    def add_head(self, cost: StepCost, sampled: int, model: ModelSpec, tp: int, dtype: str) -> None:
        """The LM head and sampling over the rows that sample a token."""
        if sampled:
            n, k = model.linear_shapes(tp)["lm_head"]
            cost.add("lm_head", self.predict_gemm(sampled, n, k, dtype, "lm_head"))
            cost.add("sample", self.predict_sample(sampled, model.vocab_size, dtype))
            if tp > 1:  # the logits gathered from the vocabulary shards: a ring all-gather moves about
                # what an all-reduce of half the bytes does
                cost.add("all_reduce", self.predict_all_reduce(sampled * model.vocab_size * 4 // 2, tp))


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


def framework_overhead(f: dict[str, float], num_chunks: int, prefill_chunks: int, decode_groups: int, tokens: int,
                       layers: int, verifying: int = 0, moe: tuple[float, float] = (0.0, 0.0)) -> float:
    """The additive terms of CostModel.framework (per step, and per layer); moe: moe_host_features."""
    t = (f["step_s"] + f["step_per_chunk_s"] * num_chunks + f["step_per_prefill_s"] * prefill_chunks
         + f["step_per_group_s"] * decode_groups + f["step_per_token_s"] * tokens
         + layers * (f["layer_s"] + f["layer_per_chunk_s"] * num_chunks + f["layer_per_prefill_s"] * prefill_chunks
                     + f["layer_per_group_s"] * decode_groups + f["layer_per_token_s"] * tokens))
    if verifying and "step_per_verify_s" in f:
        t += f["step_per_verify_s"] + layers * f["layer_per_verify_s"]
    if moe[0] and "moe_layer_s" in f:
        t += f["moe_layer_s"] * moe[0] + f["moe_layer_per_expert_s"] * moe[1]
    return t


def shape_change_features(previous_tokens: int | None, tokens: int) -> tuple[float, float]:
    """What SHAPE_CHANGE_TERMS scale with: (halvings, doublings) of the token count from the
    previous step's, one of them zero; (0, 0) without a previous step or without a change."""
    if previous_tokens is None or previous_tokens == tokens or previous_tokens <= 0 or tokens <= 0:
        return 0.0, 0.0
    if previous_tokens > tokens:
        return math.log2(previous_tokens / tokens), 0.0
    return 0.0, math.log2(tokens / previous_tokens)


def moe_host_features(model: ModelSpec, tokens: int) -> tuple[float, float]:
    """What MOE_TERMS scale with: the MoE layers, and those layers times the experts a step of
    `tokens` tokens is expected to touch (uniform routing). (0, 0) for a dense model."""
    if not model.is_moe:
        return 0.0, 0.0
    active = step_load(tokens, model.num_experts, model.experts_per_token).active_experts
    return float(model.num_moe_layers), model.num_moe_layers * active


def host_features(chunks: Sequence[Chunk], block_size: int | None) -> tuple[int, int, int, int, int]:
    """What the framework terms scale with: (chunks, tokens, prefill chunks, attention groups,
    whether the step verifies drafts) -- verification chunks are attended in one batch like
    decodes, so they add a group, not prefills."""
    prefills = sum(1 for c in chunks if c.num_tokens > 1 and not c.verify)
    verifying = any(c.num_tokens > 1 and c.verify for c in chunks)
    return (len(chunks), sum(c.num_tokens for c in chunks), prefills,
            decode_group_count(chunks, block_size) + (1 if verifying else 0), int(verifying))


def decode_group_count(chunks: Sequence[Chunk], block_size: int | None) -> int:
    """Attention calls the engine makes for the step's decodes (engine/decode_groups.py)."""
    decodes = [c.context_len for c in chunks if c.num_tokens == 1]
    if not decodes:
        return 0
    return len(padded_decode_batches(decodes, block_size)) if block_size else 1


def _series_key(m: Measurement) -> tuple[tuple | None, int]:
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
    if m.op in ("all_reduce", "all_to_all"):
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
