"""Step-time predictions for any catalog accelerator. No torch.

Where a profile of the device exists, an operator's time comes from its measurements (measured at
a profiled size, interpolated between them: simulator/cost/series.py), and other shapes from
roofline x efficiency curves fitted on this profile ("fitted"; the fit is calibrate's, handed in
as FittedTerms). Without a profile: the curves fitted on other devices' measurements and shipped
in catalog/efficiency.json ("extrapolated"). Every prediction is at least the roofline time.

Each operator at one shape has one Source (CostModel.source): the simulator's step timer calls
its time(size), predictions and reports its predict(size) -- one arithmetic. What a step runs is
the StepRecipe's (simulator/cost/recipe.py), assembled into a step's time in one place
(simulator/cost/step_timer.py).

A CostModel is a value: its curves, profile and peaks are fixed when it is made, and what changes
them (with_fitted, with_engine, with_curve) returns a new model, so one handed to the simulator,
the planner or a fit is never changed under its holder.
"""

from __future__ import annotations

import bisect
import copy
import functools
import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine.policy.dtypes import canonical_dtype
from simulator.catalog.engine_defaults import rule_for
from simulator.catalog.engines import EngineProfile
from simulator.catalog.hardware import Accelerator, get_accelerator
from simulator.cost import operators
from simulator.cost.curves import additive, fallback, streams
from simulator.cost.efficiency import EfficiencyCurve, gemm_work
from simulator.cost.fitted import FittedTerms
from simulator.cost.host import FRAMEWORK_TERMS
from simulator.cost.profile_format import Profile
from simulator.cost.readers import READERS
from simulator.cost.series import Series, index_profile
from simulator.cost.sources import Modeled, Source
from simulator.cost.types import Prediction

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
        self._sources: dict[tuple, Source | None] = {}  # (kind, shape) -> its source, built on first use
        self._modeled: dict[tuple, tuple] = {}  # modeled()'s arguments -> a Modeled source's, but its work
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
        # The serving engine whose additions this model carries (with_engine); None: kernels alone.
        self.engine: EngineProfile | None = None
        self.graph_sizes: tuple[int, ...] = ()  # the engine's CUDA-graph sizes for this server's limits
        # Operator family (gemm, ...) -> its speed under the engine on this device (fitted on real runs).
        self.scales: dict[str, float] = {}
        # The catalog accelerator whose own kernel measurements the shipped curves were fitted on:
        # its operators on those curves are "fitted", not "extrapolated".
        self.fitted_device: str | None = None

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
                                 "calibrate.fitting.load_cost_model (the CLI does), or pass fitted=")
            model = model.with_fitted(fitted)
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
        model.fitted_device = shipped.get("fitted_device")
        return model

    def _changed(self, **fields) -> "CostModel":
        """A copy with these attributes replaced and its own (empty) source caches."""
        model = copy.copy(self)
        model.__dict__.update(fields)
        model._sources, model._modeled = {}, {}
        return model

    def with_fitted(self, fitted: FittedTerms) -> "CostModel":
        """This device's model with the curves and framework terms fitted on it."""
        return self._changed(curves={**self.curves, **fitted.curves}, framework=dict(fitted.framework))

    def with_engine(self, engine: EngineProfile, max_num_seqs: int, max_num_batched_tokens: int,
                    tp: int = 1) -> "CostModel":
        """The device's model under a serving engine (simulator/catalog/engines.py): CUDA graphs
        (token counts padded to the capture sizes; no per-kernel launch term t0, which a graph
        replay does not pay and a GPU-bound eager step hides), its all-reduces
        (operators.all_reduce), host terms (those a synchronous engine does not overlap added to
        the fitted ones) and speeds, the floors of its GEMMs among them (a small GEMM's time under
        the engine's kernels on this device: the shipped curves' floors are an A100's, profiled eager)."""
        rule = rule_for(engine.limits, self.accelerator)
        graph_sizes = engine.graph_sizes_for(max_num_seqs, max_num_batched_tokens,
                                             rule.graph_limit(tp) if rule is not None else None)
        curves = {k: replace(c, t0=0.0) for k, c in self.curves.items()} if graph_sizes else self.curves
        scales = engine.speeds_on(self.accelerator.id)
        floor = scales.get("gemm_floor", 1.0)
        if floor != 1.0:  # the engine's GEMM kernels' smallest time on this device, as a share of the curves'
            curves = {k: replace(c, log_fc=c.log_fc + math.log(floor), log_fm=c.log_fm + math.log(floor))
                      if k.startswith("gemm") else c for k, c in curves.items()}
        framework = self.framework
        if engine.framework or engine.host_not_overlapped:
            framework = {**{term: 0.0 for term in FRAMEWORK_TERMS}, "operator_scale": 1.0, **self.framework,
                         **engine.framework}
            if not engine.async_scheduling:
                for term, value in engine.host_not_overlapped.items():
                    framework[term] = framework.get(term, 0.0) + value
        return self._changed(engine=engine, graph_sizes=graph_sizes, curves=curves, framework=framework,
                             scales=scales)

    def with_curve(self, key: str, curve: EfficiencyCurve) -> "CostModel":
        return self._changed(curves={**self.curves, key: curve})

    def with_framework(self, framework: dict[str, float]) -> "CostModel":
        return self._changed(framework=dict(framework))

    def with_collective(self, collective: dict[str, float]) -> "CostModel":
        """The all-reduce model's terms (base_s, per_hop_s, link_efficiency) replaced."""
        return self._changed(collective=dict(collective))

    def graph_tokens(self, tokens: int) -> int:
        """The token count a step of `tokens` runs at: padded to the next CUDA-graph size, or as is
        past the largest (eager)."""
        sizes = self.graph_sizes
        if not sizes or tokens > sizes[-1]:
            return tokens
        return sizes[bisect.bisect_left(sizes, tokens)]

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
        bandwidth = self.bandwidth  # a cost model is a value: its peak bandwidth never changes
        return lambda nbytes: bandwidth

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
        key = (curve_name, dtype, provenance, expected_error, family)
        made = self._modeled.get(key)  # all but the work: a prompt length of its own makes a source of its own
        if made is None:
            used = self.curve_used(curve_name)
            if provenance is None:
                own_curve = used == curve_name or (curve_name.startswith("gemm:") and used == "gemm")
                fitted_here = self.accelerator.id == self.fitted_device and own_curve
                provenance = "fitted" if self.profile is not None or fitted_here else "extrapolated"
            if expected_error is None:
                expected_error = self.expected_error(provenance, curve_name)
            family = family or curve_name.split(":")[0]
            made = self._modeled[key] = (self.curves[used], additive(used), self.peak_flops(dtype),
                                         self.bandwidth_for(curve_name), provenance, expected_error,
                                         self.scales.get(family, 1.0), self.scales.get(f"{family}_compute", 1.0))
        curve, adds, peak, bandwidth_of, provenance, expected_error, scale, compute_speed = made
        return Modeled(curve, adds, peak, bandwidth_of, work, provenance, expected_error, scale, compute_speed)

    # -- predictions -------------------------------------------------------------------------
    def predict(self, kind: str, *args, **params) -> Prediction:
        """Any operator or framework term by its kind (readers.READERS: the profile's operator
        names, plus step_overhead, framework, idle_wakeup and shape_change) and its parameters."""
        reader = READERS.get(kind)
        if reader is None:
            raise ValueError(f"unknown operator {kind!r}; known: {', '.join(READERS)}")
        return reader(self, *args, **params)


@functools.lru_cache(maxsize=4)
def fitted_device(params_file: str | Path = PARAMS_FILE) -> str | None:
    """The catalog accelerator the shipped efficiency curves were fitted on (its kernel profiles)."""
    return json.loads(Path(params_file).read_text()).get("fitted_device")

