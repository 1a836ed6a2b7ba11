"""Step-time predictions for any catalog accelerator. No torch.

Where a profile of the device exists, an operator's time comes from its measurements (measured at
a profiled size, interpolated between them: simulator/cost/series.py), and other shapes from
roofline x efficiency curves fitted on this profile ("fitted"; the fit is calibrate's, handed in
as FittedTerms). Without a profile: the curves fitted on other devices' measurements and shipped
in catalog/efficiency.json ("extrapolated"). Every prediction is at least the roofline time.

Each operator at one shape has one Source (CostModel.source): the simulator's step timer calls
its time(size), predictions and reports its predict(size) -- one arithmetic. What a step runs is
the StepRecipe's (simulator/cost/recipe.py).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from engine.policy.decode_groups import padded_decode_batches
from engine.policy.dtypes import canonical_dtype
from simulator.catalog.engines import EngineProfile
from simulator.catalog.hardware import Accelerator, get_accelerator
from simulator.catalog.models import ModelSpec
from simulator.cost import operators
from simulator.cost.curves import additive, fallback, streams
from simulator.cost.efficiency import EfficiencyCurve, gemm_work
from simulator.cost.fitted import FittedTerms
from simulator.cost.host import FRAMEWORK_TERMS, framework_overhead, host_features, moe_host_features, shape_change_features
from simulator.cost.profile_format import Profile
from simulator.cost.recipe import Op, StepRecipe
from simulator.cost.series import Series, index_profile
from simulator.cost.sources import Modeled, Source
from simulator.cost.types import Chunk, Prediction, StepCost

PARAMS_FILE = Path(__file__).parents[1] / "catalog" / "efficiency.json"


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
        self._series: dict[tuple, Series] = index_profile(profile.measurements) if profile is not None else {}
        self._sources: dict[tuple, Source | None] = {}  # (kind, shape) -> its source; cleared when curves change
        # A smaller working set is never slower to read: the measured curve's running maximum from
        # the large end (small reads are timed with call overhead that belongs to t0, not to bandwidth).
        self._bandwidth_envelope: list[tuple[int, float]] = []
        for size, bw in reversed(profile.bandwidth_by_size if profile is not None else []):
            best = max(bw, self._bandwidth_envelope[0][1]) if self._bandwidth_envelope else bw
            self._bandwidth_envelope.insert(0, (size, best))
        # All-reduce model (fitted on measured collectives, calibrate/fitting/curve.py); defaults are a guess.
        self.collective: dict[str, float] = {"base_s": 20e-6, "per_hop_s": 2e-6, "link_efficiency": 0.5}
        self.framework: dict[str, float] = {}  # host.FRAMEWORK_TERMS and others, fitted in calibrate/
        # A profile of servecast's own engine: its attention pads decodes in groups (engine/policy/decode_groups.py).
        self.pads_decodes = profile is not None and profile.source.startswith("servecast")
        # The serving engine whose additions this model carries (use_engine); None: kernels alone.
        self.engine: EngineProfile | None = None
        self.graph_sizes: tuple[int, ...] = ()  # the engine's CUDA-graph sizes for this server's limits
        # Operator family (gemm, ...) -> its speed under the engine on this device (fitted on real runs).
        self.scales: dict[str, float] = {}

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def load(cls, hardware: str, profile: str | Path | Profile | None = None, hardware_file: str | Path | None = None,
             params_file: str | Path = PARAMS_FILE, fitted: FittedTerms | None = None) -> "CostModel":
        """The cost model of a catalog accelerator, or of a profiled one with the terms fitted on its
        profile: `fitted` as given, else the fit file beside the profile (FittedTerms.beside). A
        profile without either is refused: calibrate.fitting.device.load_cost_model fits one."""
        model = cls.unfitted(hardware, profile, hardware_file, params_file)
        if model.profile is not None:
            fitted = fitted if fitted is not None else FittedTerms.beside(profile)
            if fitted is None:
                raise ValueError(f"the profile of {hardware} has no fitted terms: fit it with "
                                 "calibrate.fitting.device.load_cost_model (the CLI does), or pass fitted=")
            model.apply(fitted)
        return model

    @classmethod
    def unfitted(cls, hardware: str, profile: str | Path | Profile | None = None,
                 hardware_file: str | Path | None = None, params_file: str | Path = PARAMS_FILE) -> "CostModel":
        """The shipped curves over a profile's measurements, before any fit to the profile."""
        accelerator = get_accelerator(hardware, hardware_file)
        profile = Profile.load(profile) if isinstance(profile, (str, Path)) else profile
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
        return model

    def apply(self, fitted: FittedTerms) -> None:
        """Take the curves and framework terms fitted on this device."""
        self.curves.update(fitted.curves)
        self.framework = dict(fitted.framework)
        self._sources.clear()

    def use_engine(self, engine: EngineProfile, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """Carry a serving engine's additions (simulator/catalog/engines.py): CUDA graphs (token counts
        padded to the capture sizes; no per-kernel launch term t0, which a graph replay does not pay
        and a GPU-bound eager step hides), its all-reduces (operators.all_reduce), host terms, speeds."""
        self.engine = engine
        self.graph_sizes = engine.graph_sizes_for(max_num_seqs, max_num_batched_tokens)
        if self.graph_sizes:
            self.curves = {k: replace(c, t0=0.0) for k, c in self.curves.items()}
        self.scales = {**engine.scales, **engine.device_scales.get(self.accelerator.id, {})}
        if engine.framework:
            self.framework = {**{term: 0.0 for term in FRAMEWORK_TERMS}, "operator_scale": 1.0, **self.framework,
                              **engine.framework}
        self._sources.clear()

    def graph_tokens(self, tokens: int) -> int:
        """The token count a step of `tokens` runs at: padded to the next CUDA-graph size, or as is
        past the largest (eager)."""
        sizes = self.graph_sizes
        if not sizes or tokens > sizes[-1]:
            return tokens
        return sizes[bisect.bisect_left(sizes, tokens)]

    def set_curve(self, key: str, curve: EfficiencyCurve) -> None:
        self.curves[key] = curve
        self._sources.clear()

    # -- device facts -------------------------------------------------------------------------
    def peak_flops(self, dtype: str) -> float:
        if self._peak is not None:
            return self._peak
        return self.accelerator.peak_flops(dtype)

    @property
    def bandwidth(self) -> float:
        return self._bandwidth if self._bandwidth is not None else self.accelerator.memory_bandwidth

    def bandwidth_for(self, key: str) -> Callable[[float], float]:
        """The bandwidth an operator on curve `key` sees for a working set (curves.streams)."""
        if streams(key):
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
        k: str | None = key
        while k is not None:
            if k in self.curves:
                return k
            k = fallback(k)
        raise ValueError(f"no efficiency curve for {key!r} (nor its fallbacks): the parameter file is incomplete")

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

    @property
    def unvalidated_error(self) -> float:
        return self.errors.get("unvalidated", 0.5)

    # -- sources ------------------------------------------------------------------------------
    def source(self, kind: str, shape: tuple) -> Source | None:
        """The source of operator `kind` at `shape` (simulator/cost/operators.py), built once;
        None only where the kind may have none (attention_verify without its measurements)."""
        key = (kind, shape)
        if key not in self._sources:
            self._sources[key] = operators.BUILDERS[kind](self, *shape)
        return self._sources[key]

    def series(self, key: tuple) -> Series | None:
        return self._series.get(key)

    def series_keys(self):
        return self._series.keys()

    def modeled(self, curve_name: str, dtype: str, work: Callable[[int], tuple[float, float]],
                provenance: str | None = None, expected_error: float | None = None,
                family: str | None = None) -> Modeled:
        """Roofline x efficiency on the curve serving `curve_name`: fitted on this device's profile
        where there is one, else the shipped extrapolation; at the engine's fitted speed of its
        operator family (the curve name's first part unless given): its bandwidth speed cm.scales[family]
        and arithmetic speed cm.scales[family + "_compute"] (sources.Modeled)."""
        used = self.curve_used(curve_name)
        if provenance is None:
            provenance = "fitted" if self.profile is not None else "extrapolated"
        if expected_error is None:
            expected_error = self.expected_error(provenance, curve_name)
        family = family or curve_name.split(":")[0]
        return Modeled(self.curves[used], additive(used), self.peak_flops(dtype), self.bandwidth_for(curve_name), work,
                       provenance, expected_error, self.scales.get(family, 1.0), self.scales.get(f"{family}_compute", 1.0))

    # -- operators ----------------------------------------------------------------------------
    def predict_gemm(self, m: int, n: int, k: int, dtype: str, name: str | None = None,
                     weight_dtype: str | None = None) -> Prediction:
        """name: the layer ('qkv_proj', 'lm_head', ...) when known, to use its own curve.
        weight_dtype: weights stored narrower than the compute dtype (weight-only quantization)."""
        return self.source("gemm", (n, k, canonical_dtype(dtype), name, weight_dtype)).predict(m)

    def predict_attention_prefill(self, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                                  dtype: str) -> Prediction:
        shape = (q_len, num_heads, num_kv_heads, head_dim, canonical_dtype(dtype))
        return self.source("attention_prefill", shape).predict(kv_len)

    def predict_attention_decode(self, batch: int, kv_len: int | Sequence[int], num_heads: int, num_kv_heads: int,
                                 head_dim: int, dtype: str) -> Prediction:
        """Decode attention of `batch` requests: the work depends on no more than their total context,
        and a profile (equal lengths) is read at the batch's mean length."""
        kv_lens = [kv_len] * batch if isinstance(kv_len, int) else list(kv_len)
        if len(kv_lens) != batch:
            raise ValueError(f"attention_decode: {len(kv_lens)} context lengths for a batch of {batch}")
        shape = (batch, num_heads, num_kv_heads, head_dim, canonical_dtype(dtype))
        return self.source("attention_decode", shape).predict(sum(kv_lens))

    def predict_attention_verify(self, batch: int, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int,
                                 head_dim: int, dtype: str) -> Prediction:
        """`batch` verification chunks of q_len queries, each ending at context kv_len: measured
        (attention_verify) where profiled, otherwise read like a batch of decodes over the same keys."""
        source = self.verify_source(q_len, num_heads, num_kv_heads, head_dim, dtype)
        return source.predict((batch, batch * kv_len))

    def verify_source(self, queries: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: str) -> Source:
        """Sizes (chunks, their total context): operators.attention_verify, or decode attention."""
        dtype = canonical_dtype(dtype)
        source = self.source("attention_verify", (queries, num_heads, num_kv_heads, head_dim, dtype))
        return source if source is not None else operators.VerifyAsDecodes(self, num_heads, num_kv_heads, head_dim, dtype)

    def predict_elementwise(self, name: str, tokens: int, width: int, dtype: str) -> Prediction:
        return self.source("elementwise", (name, width, canonical_dtype(dtype))).predict(tokens)

    def predict_kv_write(self, tokens: int, num_kv_heads: int, head_dim: int, dtype: str) -> Prediction:
        return self.source("kv_write", (num_kv_heads, head_dim, canonical_dtype(dtype))).predict(tokens)

    def predict_sample(self, batch: int, vocab: int, dtype: str = "bf16") -> Prediction:
        """Sampling over float32 logits; dtype picks the compute peak (the op is bandwidth-bound)."""
        return self.source("sample", (vocab, canonical_dtype(dtype))).predict(batch)

    def predict_all_reduce(self, nbytes: int, world: int) -> Prediction:
        return self.source("all_reduce", (world,)).predict(nbytes)

    def predict_collective(self, kind: str, nbytes: int, world: int) -> Prediction:
        """all_to_all (each rank sends nbytes, an even share to each) or kv_ring (a CP ring hop: nbytes to the next)."""
        return self.source(kind, (world,)).predict(nbytes)

    def predict_moe_experts(self, rows_per_expert: float, active: float, hidden: int, ffn: int, dtype: str,
                            weight_dtype: str | None = None) -> Prediction:
        return operators.moe_experts_prediction(self, rows_per_expert, active, hidden, ffn, canonical_dtype(dtype),
                                                weight_dtype)

    def predict_moe_dispatch(self, tokens: int, num_experts: int, top_k: int, hidden: int, dtype: str) -> Prediction:
        return self.source("moe_dispatch", (num_experts, top_k, hidden, canonical_dtype(dtype))).predict(tokens)

    def kv_dequant_timer(self, kv_dtype: str | None, num_kv_heads: int, head_dim: int,
                         dtype: str) -> Callable[[int], float] | None:
        return operators.kv_dequant_timer(self, kv_dtype, num_kv_heads, head_dim, canonical_dtype(dtype))

    def predict_step_overhead(self, batch: int) -> Prediction:
        # Without a profile the host-side cost is unknown; it is hidden behind GPU work in a
        # well-pipelined engine, so it counts as zero there.
        return self.source("step_overhead", ()).predict(batch)

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
        t = (f["operator_scale"] - 1.0) * operators_s + framework_overhead(
            f, num_chunks, prefill_chunks, decode_groups, tokens, layers, verifying, moe)
        return Prediction(t, "fitted", self.errors.get("fitted", 0.15))

    def predict_shape_change(self, previous_tokens: int | None, tokens: int) -> Prediction:
        """Extra time of a step of `tokens` tokens right after one of previous_tokens
        (host.SHAPE_CHANGE_TERMS); zero where they were not fitted, or without a previous step."""
        f = self.framework
        if "step_per_halving_s" not in f:
            return Prediction(0.0, "extrapolated", 0.0)
        halvings, doublings = shape_change_features(previous_tokens, tokens)
        return Prediction(halvings * f["step_per_halving_s"] + doublings * f["step_per_doubling_s"],
                          "fitted", self.errors.get("fitted", 0.15))

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
    def add_ops(self, cost: StepCost, ops: Sequence[Op], rows: int) -> None:
        """A recipe's token or head operators for a step of `rows` rows."""
        for op in ops:
            cost.add(op.name, self.source(op.kind, op.shape).predict(op.size(rows)), op.count)

    def step_time(self, chunks: Sequence[Chunk], model: ModelSpec, tp: int = 1, dtype: str = "bf16",
                  include_host: bool = True, block_size: int | None = None, expert_parallel: bool = False,
                  routing_skew: float = 0.0, weight_dtype: str | None = None) -> StepCost:
        """Time of one engine step computing the given chunks: the recipe's token operators over all
        tokens, attention per chunk (prefill chunks one by one, decodes batched -- in the engine's
        padded batches where block_size is given and the profile is of servecast's engine --
        verification chunks together), the LM head and sampling for the rows that sample, and
        (include_host) the scheduler's overhead and the framework overhead that the operators
        leave out (fitted on whole-forward measurements where the profile has them)."""
        cost = StepCost(0.0)
        if not chunks:
            return cost
        recipe = StepRecipe.of(model, tp, dtype, weight_dtype, expert_parallel, routing_skew)
        dtype, layers, hd = recipe.dtype, recipe.layers, model.head_dim
        self.add_ops(cost, recipe.token_ops, self.graph_tokens(sum(c.num_tokens for c in chunks)))
        for c in chunks:
            if c.num_tokens > 1 and not c.verify:
                cost.add("attention_prefill", self.predict_attention_prefill(
                    c.num_tokens, c.context_len, recipe.heads, recipe.kv_heads, hd, dtype), layers)
        decodes = [c.context_len for c in chunks if c.num_tokens == 1]
        if decodes:
            batches = padded_decode_batches(decodes, block_size) if block_size is not None and self.pads_decodes \
                else [(len(decodes), decodes)]
            for batch, contexts in batches:
                cost.add("attention_decode", self.predict_attention_decode(
                    batch, contexts, recipe.heads, recipe.kv_heads, hd, dtype), layers)
        verifying = [c for c in chunks if c.num_tokens > 1 and c.verify]
        if verifying:
            source = self.verify_source(max(c.num_tokens for c in verifying), recipe.heads, recipe.kv_heads, hd, dtype)
            cost.add(source.name, source.predict((len(verifying), sum(c.context_len for c in verifying))), layers)
        # Every verified row goes through the LM head (and is compared), not only the sampled one.
        sampled = sum((c.num_tokens if c.verify else 1) for c in chunks if c.samples)
        if sampled:
            self.add_ops(cost, recipe.head_ops, sampled)
        if include_host:
            operators_s = cost.total_s
            cost.add("step_overhead", self.predict_step_overhead(len(chunks)))
            num_chunks, tokens, prefills, groups, verify = host_features(chunks, block_size)
            cost.add("framework", self.predict_framework(num_chunks, tokens, layers, operators_s, prefills,
                                                         groups, verify, moe_host_features(model, tokens)))
        return cost
