"""Fidelity of the simulator against the real engine on this device (`servecast validate`).

The same requests (lengths and arrival times) are served twice at each load level: replayed in
wall-clock time through the real engine, and simulated with this device's profile (cpu-local or
cuda-local) and the engine's exact scheduler settings and KV pool. Load levels are fractions of
the capacity the simulator predicts for the workload (all requests at once): light, near
saturation, overloaded. The error of each metric is predicted / measured - 1.

A shared machine's speed wanders by several percent over tens of seconds. So the framework terms
are fitted, for every replay, on engine steps of *other* requests replayed just before and just
after it (never on the replay's own steps), and each level is measured `repeats` times afresh, in
rounds that measure every level once; a level's error is the median over its repeats, and the
spread is reported with it. Within a replay the speed still changes by several percent from second
to second: a speed probe timed before every engine step (calibrate/speed_probe.py) measures it,
and the simulator replays the level at those speeds (simulator/fleet/speed_trace.py).
"""

from __future__ import annotations

import copy
import json
import math
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from calibrate.speed_probe import ProbedClock, SpeedProbe, slowdowns
from calibrate.fitting import fit_framework, load_cost_model
from simulator.cost.model import CostModel
from simulator.cost.profile_format import Profile
from simulator.fleet.run import SimResult, simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.synthetic import arrival_times
from simulator.workload.requests import LengthPair, Workload, load_length_pairs, make_workload, sample_lengths

if TYPE_CHECKING:
    from simulator.fleet.speed_trace import SpeedTrace
    from simulator.cost.step_timer import StepTimer

LEVELS = {"light": 0.3, "near saturation": 0.9, "overloaded": 1.5}
METRICS = (("throughput", "output_tokens_per_s"), ("ttft", "p50"), ("ttft", "p90"), ("ttft", "p99"),
           ("tpot", "mean"), ("tpot", "p50"), ("tpot", "p99"), ("e2e", "p50"), ("e2e", "p99"))
TARGETS = {"throughput": 0.05, "tpot_mean": 0.05}  # everything else: 0.10
# The calibration replays: (fraction of capacity, share of the calibration requests). A light
# load gives the small batches of light traffic; Poisson loads near and past saturation give the
# mid-size batches and the full batches that admit a prompt chunk while decoding, which a burst
# never has; a burst (all at once) fills the batch outright. Fitted on light and burst alone, the
# near-saturation and overloaded levels' steps came out 3-7 % slower than predicted (six levels
# replayed once, calibrations with and without the Poisson loads fitted on the same steps: mean
# |step-time error| 7.0 % -> 5.8 %, request-level misses 33 -> 22 of 54).
CALIBRATION_LOADS = ((0.3, 0.125), (0.9, 0.25), (1.5, 0.25), (math.inf, 0.375))
# Unrecorded requests served before a measurement, in KV pools' worth of blocks (burn_in).
BURN_IN_POOL_TURNS = 3


def calibration_order(half: int) -> list[tuple[int, tuple[float, float]]]:
    """(index, CALIBRATION_LOADS entry) in the order a half replays them: the half before the level
    in order, the half after it mirrored (the burst on both sides next to the level, the light
    load farthest on both). Each load's two replays then sit equally far before and after the
    level, so a steady drift of the machine's speed over the measurement (calibration before and
    after a level have disagreed by up to 12%) averages out of every kind of step alike, not just
    out of their sum."""
    order = list(enumerate(CALIBRATION_LOADS))
    return order if half == 0 else order[::-1]


def target_of(metric: str) -> float:
    return TARGETS.get(metric, 0.10)


@dataclass
class ValidationSetup:
    model: dict | str  # an HF config dict, or a config.json path
    num_requests: int = 120
    length_scale: float = 1 / 8
    max_total_tokens: int = 512
    lengths_file: str | None = None
    block_size: int = 16
    num_blocks: int = 512
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    # CPU threads for torch in both the profile and the engine. One by default: on small shared
    # machines two-thread kernels swing between speeds several times apart from run to run, which
    # would measure the machine's neighbours instead of the simulator.
    threads: int | None = 1
    # Engine steps of this many other requests calibrate the framework terms before each level
    # (0: the profile's forward points only).
    calibration_requests: int = 192
    # Independent measurements of each level (calibration, replay, simulation); errors are their median.
    repeats: int = 3
    # Time a small fixed piece of work before every engine step and simulate each level at the
    # machine speed it shows (calibrate/speed_probe.py); off: at the calibration's average speed.
    speed_probe: bool = True
    levels: dict[str, float] = field(default_factory=lambda: dict(LEVELS))

    def engine_config(self):
        from engine import EngineConfig

        return EngineConfig(block_size=self.block_size, num_blocks=self.num_blocks, max_num_seqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens,
                            max_model_len=self.max_total_tokens, enable_prefix_caching=self.enable_prefix_caching,
                            enable_chunked_prefill=self.enable_chunked_prefill, device=self.device, dtype=self.dtype,
                            seed=self.seed)

    def check(self) -> None:
        """Raise ValueError naming the setting and the fix, before anything is profiled or served."""
        from engine.config import CacheConfig, ModelConfig

        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1 (or unset for torch's choice), got {self.threads}")
        if self.calibration_requests < 0:
            raise ValueError(f"calibration requests must be 0 or more, got {self.calibration_requests}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        if not self.length_scale > 0:
            raise ValueError(f"length scale must be positive, got {self.length_scale}")
        CacheConfig(self.block_size, self.num_blocks)
        model = ModelConfig.from_hf(self.model)
        self.engine_config().scheduler_config(model)  # max_model_len against the model, budget vs length
        self.lengths()  # the lengths file is readable and valid

    def config_path(self, folder: Path) -> str:
        if isinstance(self.model, str):
            return self.model
        path = folder / "validation-model-config.json"
        path.write_text(json.dumps(self.model, indent=2))
        return str(path)

    def sim_config(self, folder: Path, profile: str) -> SimConfig:
        # The profile says which catalog device it measured (a GPU profiled as h200, say).
        hardware = Profile.load(profile).hardware
        quant = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[self.dtype]
        return SimConfig(model=self.config_path(folder), hardware=hardware, profile=profile, quant=quant,
                         block_size=self.block_size, num_gpu_blocks=self.num_blocks, max_num_seqs=self.max_num_seqs,
                         max_num_batched_tokens=self.max_num_batched_tokens, max_model_len=self.max_total_tokens,
                         enable_prefix_caching=self.enable_prefix_caching,
                         enable_chunked_prefill=self.enable_chunked_prefill, seed=self.seed)

    def lengths(self, num: int | None = None, seed: int | None = None) -> list[LengthPair]:
        """num (default num_requests) request lengths drawn with seed (default the setup's)."""
        pairs = load_length_pairs(self.lengths_file) if self.lengths_file else load_length_pairs()
        return sample_lengths(pairs, num or self.num_requests, self.seed if seed is None else seed,
                              self.length_scale, self.max_total_tokens)


def workload_at(lengths: list[LengthPair], rate: float, seed: int, name: str) -> Workload:
    arrivals = arrival_times(len(lengths), rate, "poisson", 1.0, np.random.default_rng(seed))
    return make_workload(name, [(float(a), p.prompt_tokens, p.output_tokens, ()) for a, p in zip(arrivals, lengths)])


def engine_requests(workload: Workload, vocab_size: int, seed: int) -> list:
    from engine.replay import TimedRequest
    from engine.sampling_params import SamplingParams

    rng = random.Random(seed)
    return [TimedRequest(str(r.request_id), r.arrival_s, [rng.randrange(vocab_size) for _ in range(r.prompt_tokens)],
                         SamplingParams(max_tokens=r.output_tokens, temperature=0.0, ignore_eos=True))
            for r in workload.requests]


def measured_frame(outputs: list, start: float) -> pd.DataFrame:
    rows = []
    for o in outputs:
        n = len(o.output_token_ids)
        rows.append({"request_id": int(o.request_id), "arrival_s": o.arrival_time - start,
                     "prompt_tokens": len(o.prompt_token_ids), "output_tokens": n,
                     "queue_s": o.first_scheduled_time - o.arrival_time, "ttft_s": o.first_token_time - o.arrival_time,
                     "e2e_s": o.finish_time - o.arrival_time,
                     "tpot_s": (o.finish_time - o.first_token_time) / (n - 1) if n > 1 else math.nan,
                     "finish_s": o.finish_time - start, "preemptions": o.num_preemptions, "status": "finished"})
    return pd.DataFrame(rows).sort_values("request_id").reset_index(drop=True)


def metrics_of(requests: pd.DataFrame) -> dict[str, float]:
    finished = requests[requests["status"] == "finished"]
    duration = finished["finish_s"].max() - finished["arrival_s"].min()
    out = {"throughput": float(finished["output_tokens"].sum() / duration)}
    for metric, stat in METRICS[1:]:
        values = finished[f"{metric}_s"].dropna().to_numpy(dtype=float)
        out[f"{metric}_{stat}"] = float(values.mean() if stat == "mean" else np.percentile(values, float(stat[1:])))
    return out


@dataclass
class Measurement:
    """One measurement of a level: the engine's replay, its simulation and their step times."""

    measured: dict[str, float]
    predicted: dict[str, float]
    measured_requests: pd.DataFrame
    predicted_requests: pd.DataFrame
    steps: dict = field(default_factory=dict)  # step-time fidelity on the engine's own steps

    @property
    def errors(self) -> dict[str, float]:
        return {k: self.predicted[k] / self.measured[k] - 1 for k in self.measured}


@dataclass
class LevelResult:
    """A load level over its repeats: metrics, errors and step ratios are medians over them."""

    level: str
    rate_per_s: float
    repeats: list[Measurement]

    def _median(self, values: list[dict[str, float]]) -> dict[str, float]:
        return {k: float(np.median([v[k] for v in values])) for k in values[0]}

    @property
    def measured(self) -> dict[str, float]:
        return self._median([r.measured for r in self.repeats])

    @property
    def predicted(self) -> dict[str, float]:
        return self._median([r.predicted for r in self.repeats])

    @property
    def errors(self) -> dict[str, float]:
        return self._median([r.errors for r in self.repeats])

    @property
    def error_range(self) -> dict[str, tuple[float, float]]:
        return {k: (min(r.errors[k] for r in self.repeats), max(r.errors[k] for r in self.repeats))
                for k in self.repeats[0].errors}

    @property
    def engine_spread(self) -> dict[str, float]:
        """The engine against itself: how far the farthest repeat's measured value lies from the
        repeats' median (relative). Every repeat replays the same requests at the same times, so
        this is the machine's noise floor for that metric; 0 with one repeat."""
        return {k: float(max(abs(r.measured[k] / m - 1) for r in self.repeats)) if m else math.nan
                for k, m in self.measured.items()}

    @property
    def steps(self) -> dict:
        numeric = [{k: v for k, v in r.steps.items() if isinstance(v, (int, float))} for r in self.repeats]
        keys = set.intersection(*(set(n) for n in numeric))
        return {k: float(np.median([n[k] for n in numeric])) for k in sorted(keys)}

    @property
    def measured_requests(self) -> pd.DataFrame:  # the first repeat's, for per-request plots
        return self.repeats[0].measured_requests

    @property
    def predicted_requests(self) -> pd.DataFrame:
        return self.repeats[0].predicted_requests


def profile_for(setup: ValidationSetup, folder: Path, profile: str | None,
                on_progress: Callable[[str, int, int], None] | None = None) -> str:
    """The given profile, or a fresh profile of the validation model on this device."""
    if profile is not None:
        return profile
    from calibrate.profiler import Profiler, ProfileGrid
    from engine.config import ModelConfig

    path = folder / "validation-profile.jsonl"
    config = ModelConfig.from_hf(setup.model)
    profiler = Profiler(config, device=setup.device, dtype=setup.dtype,
                        grid=ProfileGrid.for_budget(setup.max_num_batched_tokens, setup.max_total_tokens))
    profiler.run(path, on_progress=(lambda d, t: on_progress("profile", d, t)) if on_progress else None)
    return str(path)


def refreshed_profile(setup: ValidationSetup, profile: str, path: Path) -> tuple[str, float]:
    """A copy of the profile whose whole-forward points are measured again now, just before a
    replay: on a shared machine the speed drifts by tens of percent over minutes, and that drift
    between profiling and replay is the machine's, not the simulator's. Returns the new profile
    and the drift (median ratio of the new forward times to the old)."""
    from dataclasses import replace

    from calibrate.profiler import Profiler, ProfileGrid
    from engine.config import ModelConfig

    base = Profile.load(profile)
    Profile(base.hardware, base.fingerprint, base.peaks, base.source,
            [m for m in base.measurements if m.op != "forward"], base.bandwidth_by_size).save(path)
    config = ModelConfig.from_hf(setup.model)
    grid = replace(ProfileGrid.for_budget(setup.max_num_batched_tokens, setup.max_total_tokens), passes=1)
    fresh = Profiler(config, device=setup.device, dtype=setup.dtype, hardware=base.hardware, grid=grid).run(path)
    old = {m.key: m.time_s for m in base.of("forward")}
    ratios = [m.time_s / old[m.key] for m in fresh.of("forward") if m.key in old]
    return str(path), float(np.median(ratios)) if ratios else math.nan


def run_validation(setup: ValidationSetup, folder: Path | None = None, profile: str | None = None,
                   on_progress: Callable[[str, int, int], None] | None = None) -> tuple[list[LevelResult], dict]:
    """Profile (unless given), find the capacity, then replay and simulate each load level."""
    if setup.threads is not None:
        import torch

        torch.set_num_threads(setup.threads)
    folder = Path(folder or tempfile.mkdtemp(prefix="servecast-validate-"))
    folder.mkdir(parents=True, exist_ok=True)
    profile = profile_for(setup, folder, profile, on_progress)
    config = setup.sim_config(folder, profile)
    lengths = setup.lengths()
    # Curves are fitted once on the full profile; each level refits only the framework terms on
    # its freshly measured forwards.
    base_model = load_cost_model(config.hardware, profile=config.profile)
    capacity = simulate(config, workload_at(lengths, math.inf, setup.seed, "capacity"), cost_model=base_model)
    capacity_rps = capacity.summary["throughput"]["requests_per_s"]
    rates = {name: fraction * capacity_rps for name, fraction in setup.levels.items()}
    workloads = {name: workload_at(lengths, rate, setup.seed + 1, name) for name, rate in rates.items()}
    repeats: dict[str, list[Measurement]] = {name: [] for name in setup.levels}
    for level_index, name, repeat in measurement_order(list(setup.levels), setup.repeats):
        stage = name if setup.repeats == 1 else f"{name} ({repeat + 1}/{setup.repeats})"
        repeats[name].append(_measure_level(setup, folder, profile, config, base_model, workloads[name], capacity_rps,
                                            1000 + 100 * level_index + 10 * repeat, stage, on_progress))
    results = [LevelResult(name, rates[name], repeats[name]) for name in setup.levels]
    info = {"capacity_requests_per_s": capacity_rps, "profile": profile, "folder": str(folder),
            "num_requests": setup.num_requests, "model": config.model, "threads": setup.threads,
            "calibration_requests": setup.calibration_requests, "repeats": setup.repeats}
    return results, info


def measurement_order(levels: list[str], repeats: int) -> list[tuple[int, str, int]]:
    """(level index, level, repeat) in the order they are measured: round by round, every level
    once per round. The machine's speed wanders over minutes; measured level by level, a slow
    stretch could take all of one level's repeats, and their median could not outvote it."""
    return [(index, name, repeat) for repeat in range(repeats) for index, name in enumerate(levels)]


def _measure_level(setup: ValidationSetup, folder: Path, profile: str, config: SimConfig, base_model: CostModel,
                   workload: Workload, capacity_rps: float, seed_offset: int, stage: str,
                   on_progress: Callable[[str, int, int], None] | None) -> Measurement:
    """One measurement of a level: re-measure the forward points, calibrate on other requests'
    steps replayed just before and just after the level's replay, then simulate it.

    All replays of a measurement go through one engine, in order: a burn-in (burn_in), calibration,
    the level, more calibration. An engine's KV pool scatters as it serves (sequences get blocks
    from wherever the free list has them), and scattered KV reads are slower; the burn-in brings the
    engine to that steady state before anything is timed, and sharing the engine brackets the
    level's replay in engine age as well as in time.

    With setup.speed_probe, a probe timed before every step (calibrate/speed_probe.py) says how fast
    the machine ran at each moment: the calibration's step times are fitted as they would have been
    at the calibration's usual speed, and the level is simulated at the speed the probe saw during
    it (simulator/fleet/speed_trace.py).
    """
    from engine import LLMEngine
    from engine.replay import replay
    from simulator.fleet.speed_trace import SpeedTrace

    if on_progress:
        on_progress(stage, 0, 1)
    slug = "".join(c if c.isalnum() else "-" for c in stage).strip("-")
    probe = SpeedProbe() if setup.speed_probe else None
    level_profile, drift = refreshed_profile(setup, profile, folder / f"profile-{slug}.jsonl")
    level_config = config.model_copy(update={"profile": level_profile})
    level_model = copy.copy(base_model)
    engine = LLMEngine.from_config(setup.model, setup.engine_config(), seed=setup.seed)
    engine.generate([[1, 2, 3, 4]] * 2, None)  # warm-up: first-call allocations stay out of the timings
    burn_in(engine, setup, setup.seed + seed_offset + 50)
    steps = record_steps(engine, probe)

    def calibration_replays(half: int) -> slice:
        """Replays engine steps of other requests (other seeds) at each CALIBRATION_LOADS load;
        returns where their steps are in `steps`."""
        first = len(steps)
        for k, (load, share) in calibration_order(half) if setup.calibration_requests else ():
            count = max(2, round(setup.calibration_requests * share / 2))  # half before, half after
            lengths_k = setup.lengths(count, setup.seed + seed_offset + 2 * k + half)
            calibration = workload_at(lengths_k, load * capacity_rps, setup.seed + seed_offset + 7, "calibration")
            replay(engine, engine_requests(calibration, engine.model_config.vocab_size, setup.seed + 7))
        return slice(first, len(steps))

    before = calibration_replays(0)
    requests = engine_requests(workload, engine.model_config.vocab_size, setup.seed)
    # No callback during the replay: anything the harness does between steps lands in the timings.
    outputs = replay(engine, requests)
    level = slice(before.stop, len(steps))
    start = min(o.arrival_time for o in outputs) - workload.requests[0].arrival_s
    measured = measured_frame(outputs, start)
    after = calibration_replays(1)
    halves = {"before": before, "after": after}
    # How much slower than during its calibration the machine ran at each step (1 without a probe).
    slowdown = np.ones(len(steps))
    if probe is not None:
        is_calibration = np.zeros(len(steps), dtype=bool)
        is_calibration[before] = is_calibration[after] = True
        slowdown = slowdowns(np.array([s.probe_s for s in steps]), is_calibration)
    calibration = [o for half in halves.values()
                   for o in step_observations(steps[half], level_config, level_model, slowdown[half])]
    # The profile's forward points enter the fit as timed: a probe timed beside them (back to back,
    # its data in cache) ran 0.6-0.86 times as long as between engine steps, so it cannot say how
    # fast the machine was then.
    fit_framework(level_model, Profile.load(level_profile), calibration)
    timer, speed = None, {}
    if probe is not None:
        # The level's steps on the simulator's timeline (seconds since its first arrival).
        trace = SpeedTrace(tuple(s.start_s - start for s in steps[level]), tuple(slowdown[level]))
        speed["level_slowdown"] = trace.mean()
        timer = validation_timer(level_config, level_model, trace)
    predicted: SimResult = simulate(level_config, workload, cost_model=level_model, timer=timer)
    if on_progress:
        on_progress(stage, 1, 1)
    # The fitted model on each calibration half alone: how far the machine's speed moved across
    # the measurement, and whether the level ran at the speed of the calibration around it.
    brackets = {f"calibration_{name}_total_ratio":
                step_errors(level_config, steps[half], level_model, slowdown[half])["total_ratio"]
                for name, half in halves.items() if half.stop > half.start}
    return Measurement(metrics_of(measured), metrics_of(predicted.requests), measured, predicted.requests,
                       {**step_errors(level_config, steps[level], level_model, slowdown[level]),
                        "machine_drift": drift, **brackets, **speed})


def burn_in(engine, setup: ValidationSetup, seed: int) -> int:
    """Serve, unrecorded and all at once, requests that need BURN_IN_POOL_TURNS times the KV pool's
    blocks between them; returns how many. A fresh engine hands out its free blocks in order, and
    its steps ran about 4% faster over its first hundred or so requests than afterwards (three
    engines, ten replays of 36 requests each: 1.000-1.041 predicted/measured over the first three,
    0.85-1.06 and 0.98 on average after), so without this the calibration before a level would
    time a faster engine than the level and the calibration after it."""
    from engine.replay import replay

    block_manager = engine.scheduler.block_manager
    need, blocks, chosen = BURN_IN_POOL_TURNS * setup.num_blocks, 0, []
    for pair in setup.lengths(need, seed):  # far more than needed: every request takes a block
        chosen.append(pair)
        blocks += block_manager.blocks_needed(pair.prompt_tokens + pair.output_tokens)
        if blocks >= need:
            break
    replay(engine, engine_requests(workload_at(chosen, math.inf, seed, "burn-in"), engine.model_config.vocab_size,
                                   seed))
    return len(chosen)


class RecordedStep(NamedTuple):
    """One engine step as record_steps saw it; times on the engine's clock."""

    chunks: list
    seconds: float
    idle_s: float  # how long the engine had been idle before it (0 when the step before left work)
    probe_s: float = 0.0  # the speed probe's time just before it (0: no probe)
    start_s: float = 0.0


def record_steps(engine, probe: SpeedProbe | None = None) -> list[RecordedStep]:
    """Wrap engine.step to record each step's scheduled chunks, wall time, and how long the engine
    had been idle before it. With a probe, time it before every step on a clock that stops meanwhile
    (given to the engine, so replays and requests never see the probe's time)."""
    steps: list[RecordedStep] = []
    scheduler, step = engine.scheduler, engine.step
    schedule = scheduler.schedule
    last: list = [None]
    previous: dict = {"end": None, "left_work": True}
    clock = engine.clock = ProbedClock() if probe is not None else engine.clock

    def recording_schedule(now: float = 0.0):
        last[0] = schedule(now)
        return last[0]

    def timed_step():
        probe_s = clock.probe(probe) if probe is not None else 0.0
        started = clock()
        idle_s = 0.0 if previous["left_work"] or previous["end"] is None else started - previous["end"]
        outputs = step()
        ended = clock()
        if last[0] is not None and not last[0].is_empty:
            steps.append(RecordedStep(list(last[0].chunks), ended - started, idle_s, probe_s, started))
            previous["end"], previous["left_work"] = ended, engine.has_unfinished_requests()
        return outputs

    scheduler.schedule = recording_schedule
    engine.step = timed_step
    return steps


def step_observations(steps: Sequence[RecordedStep], config: SimConfig, cost_model: CostModel,
                      slowdown: Sequence[float] | None = None) -> list:
    """Recorded engine steps as StepObservations. Forward time: the step (divided by the machine's
    slowdown at it, if given) less the scheduler's time and, after idle, less the wakeup the
    simulator adds on its own (CostModel.predict_idle_wakeup): left in, the fit would charge every
    step of the shapes that follow idle with it."""
    from simulator.cost.types import Chunk, StepObservation

    model = config.model_spec()
    slowdown = np.ones(len(steps)) if slowdown is None else slowdown
    out = []
    for step, previous_tokens, factor in zip(steps, previous_step_tokens(steps), slowdown):
        cs = [Chunk(c.num_tokens, c.start + c.num_tokens, c.samples) for c in step.chunks]
        host = cost_model.predict_step_overhead(len(cs)).time_s
        if step.idle_s > 0:
            host += cost_model.predict_idle_wakeup(step.idle_s).time_s
        out.append(StepObservation(cs, model, config.compute_dtype, config.block_size, step.seconds / factor - host,
                                   previous_tokens))
    return out


def previous_step_tokens(steps: Sequence[RecordedStep]) -> list[int | None]:
    """For each recorded step, the tokens of the step just before it, None where it came first or
    after idle (the simulator's StepTimer.shape_change convention)."""
    out, previous = [], None
    for step in steps:
        out.append(None if step.idle_s > 0 else previous)
        previous = sum(c.num_tokens for c in step.chunks)
    return out


def validation_timer(config: SimConfig, cost_model: CostModel, trace: SpeedTrace | None = None) -> StepTimer:
    """The StepTimer the validation times engine steps with (one replica, tp 1, unquantized
    weights); with a SpeedTrace, one that scales each step by the trace at the step's start. The
    level's simulation and its step-time errors use the same one, so they agree on every step."""
    from simulator.fleet.speed_trace import SpeedTracedTimer
    from simulator.cost.step_timer import StepTimer

    model, _, _ = config.check()
    args = (cost_model, model, 1, 1, config.compute_dtype, None, config.cache_dtype, config.block_size)
    return StepTimer(*args) if trace is None else SpeedTracedTimer(*args, trace=trace)


def step_errors(config: SimConfig, steps: Sequence[RecordedStep], cost_model: CostModel,
                slowdown: Sequence[float] | None = None) -> dict:
    """The cost model's step time (with the wakeup after idle and the shape change, as the
    simulator adds them, and times the machine's slowdown at the step if given) against every step
    the engine took: how much of the request-level error is step time (rather than scheduling
    dynamics)."""
    timer = validation_timer(config, cost_model)
    measured = np.array([s.seconds for s in steps])
    factors = np.ones(len(steps)) if slowdown is None else np.asarray(slowdown, dtype=float)
    predicted = factors * np.array([timer.step(s.chunks) + timer.wakeup(s.idle_s)
                                    + timer.shape_change(previous, sum(c.num_tokens for c in s.chunks))
                                    for s, previous in zip(steps, previous_step_tokens(steps))])
    decode = np.array([all(c.num_tokens == 1 for c in s.chunks) for s in steps])
    after_idle = np.array([s.idle_s > 0 for s in steps])
    out = {"steps": int(len(steps)), "total_ratio": float(predicted.sum() / measured.sum()),
           "median_ratio": float(np.median(predicted / measured))}
    if decode.any():
        out["decode_median_ratio"] = float(np.median(predicted[decode] / measured[decode]))
    if (~decode).any():
        out["prefill_median_ratio"] = float(np.median(predicted[~decode] / measured[~decode]))
    if after_idle.any():
        out["after_idle_median_ratio"] = float(np.median(predicted[after_idle] / measured[after_idle]))
        out["after_idle_steps"] = int(after_idle.sum())
    return out


def error_table(results: list[LevelResult]) -> pd.DataFrame:
    """One row per level and metric: medians over the repeats, the errors' range, and the engine's
    own spread over the repeats (LevelResult.engine_spread), and whether the error lies within the
    target and within that spread."""
    rows = []
    for r in results:
        measured, predicted, spread, engine_spread = r.measured, r.predicted, r.error_range, r.engine_spread
        for metric, error in r.errors.items():
            rows.append({"level": r.level, "rate_per_s": r.rate_per_s, "metric": metric, "measured": measured[metric],
                         "predicted": predicted[metric], "error": error, "error_min": spread[metric][0],
                         "error_max": spread[metric][1], "engine_spread": engine_spread[metric],
                         "repeats": len(r.repeats), "target": target_of(metric),
                         "within_target": abs(error) <= target_of(metric),
                         # No larger than the engine's own spread: the machine's noise could account
                         # for it (never with one repeat, which has no spread).
                         "within_engine_spread": len(r.repeats) > 1 and abs(error) <= engine_spread[metric]})
    return pd.DataFrame(rows)
