"""One measurement of a load level (calibrate/validation/fidelity.py measures every level this way): a
burn-in, calibration replays of other requests before and after the level's own replay through the
real engine, the framework terms fitted on the calibration's steps, and the level simulated on the
fitted cost model (measure_level).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.fitting.device import fit_framework
from calibrate.validation.recorded_steps import record_steps, step_errors, step_observations, validation_timer
from calibrate.validation.speed_probe import SpeedProbe, slowdowns
from calibrate.validation.results import Measurement, metrics_of
from calibrate.validation.settings import ValidationSetup, workload_at
from simulator.cost.model import CostModel
from simulator.cost.profile_format import Profile
from simulator.fleet.run import SimResult, simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.prompt_ids import prompt_ids
from simulator.workload.requests import Workload

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


def engine_requests(workload: Workload, vocab_size: int, seed: int) -> list:
    from engine.replay import TimedRequest
    from engine.policy.sampling_params import SamplingParams

    return [TimedRequest(str(r.request_id), r.arrival_s, prompt_ids(r, vocab_size, seed),
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


def refreshed_profile(setup: ValidationSetup, profile: str, path: Path) -> tuple[str, float]:
    """A copy of the profile whose whole-forward points are measured again now, just before a
    replay: on a shared machine the speed drifts by tens of percent over minutes, and that drift
    between profiling and replay is the machine's, not the simulator's. Returns the new profile
    and the drift (median ratio of the new forward times to the old)."""
    from dataclasses import replace

    from calibrate.profiling.plan import ProfileGrid
    from calibrate.profiling.profiler import Profiler
    from engine.policy.config import ModelConfig

    base = Profile.load(profile)
    Profile(base.hardware, base.fingerprint, base.peaks, base.source,
            [m for m in base.measurements if m.op != "forward"], base.bandwidth_by_size).save(path)
    config = ModelConfig.from_hf(setup.model)
    grid = replace(ProfileGrid.for_budget(setup.max_num_batched_tokens, setup.max_total_tokens), passes=1)
    fresh = Profiler(config, device=setup.device, dtype=setup.dtype, hardware=base.hardware, grid=grid).run(path)
    old = {m.key: m.time_s for m in base.of("forward")}
    ratios = [m.time_s / old[m.key] for m in fresh.of("forward") if m.key in old]
    return str(path), float(np.median(ratios)) if ratios else math.nan


def measure_level(setup: ValidationSetup, folder: Path, profile: str, config: SimConfig, base_model: CostModel,
                  workload: Workload, capacity_rps: float, seed_offset: int, stage: str,
                  on_progress: Callable[[str, int, int], None] | None) -> Measurement:
    """One measurement of a level: re-measure the forward points, calibrate on other requests'
    steps replayed just before and just after the level's replay, then simulate it.

    All replays of a measurement go through one engine, in order: a burn-in (burn_in), calibration,
    the level, more calibration. An engine's KV pool scatters as it serves (sequences get blocks
    from wherever the free list has them), and scattered KV reads are slower; the burn-in brings the
    engine to that steady state before anything is timed, and sharing the engine brackets the
    level's replay in engine age as well as in time.

    With setup.speed_probe, a probe timed before every step (calibrate/validation/speed_probe.py) says how fast
    the machine ran at each moment: the calibration's step times are fitted as they would have been
    at the calibration's usual speed, and the level is simulated at the speed the probe saw during
    it (calibrate/validation/speed_trace.py).
    """
    from engine import LLMEngine
    from engine.replay import replay
    from calibrate.validation.speed_trace import SpeedTrace

    if on_progress:
        on_progress(stage, 0, 1)
    slug = "".join(c if c.isalnum() else "-" for c in stage).strip("-")
    probe = SpeedProbe() if setup.speed_probe else None
    level_profile, drift = refreshed_profile(setup, profile, folder / f"profile-{slug}.jsonl")
    level_config = config.model_copy(update={"profile": level_profile})
    level_model = base_model  # a value: the fit below makes a new one
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
    level_model = level_model.with_framework(fit_framework(level_model, Profile.load(level_profile), calibration))
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
