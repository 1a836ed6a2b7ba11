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
to second: a speed probe timed before every engine step (calibrate/validation/speed_probe.py) measures it,
and the simulator replays the level at those speeds (calibrate/validation/speed_trace.py).

The pieces: the setup (calibrate/validation/settings.py), one measurement of a level
(calibrate/validation/level_measurement.py), the engine's recorded steps (calibrate/validation/recorded_steps.py), and
the errors and their table (calibrate/validation/results.py).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path

from calibrate.fitting.device import load_cost_model
from calibrate.validation.level_measurement import measure_level
from calibrate.validation.results import LevelResult, Measurement
from calibrate.validation.settings import ValidationSetup, workload_at
from simulator.fleet.run import simulate


def profile_for(setup: ValidationSetup, folder: Path, profile: str | None,
                on_progress: Callable[[str, int, int], None] | None = None) -> str:
    """The given profile, or a fresh profile of the validation model on this device."""
    if profile is not None:
        return profile
    from calibrate.profiling.plan import ProfileGrid
    from calibrate.profiling.profiler import Profiler
    from engine.policy.config import ModelConfig

    path = folder / "validation-profile.jsonl"
    config = ModelConfig.from_hf(setup.model)
    profiler = Profiler(config, device=setup.device, dtype=setup.dtype,
                        grid=ProfileGrid.for_budget(setup.max_num_batched_tokens, setup.max_total_tokens))
    profiler.run(path, on_progress=(lambda d, t: on_progress("profile", d, t)) if on_progress else None)
    return str(path)


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
    capacity_rps = capacity.summary.throughput.requests_per_s
    rates = {name: fraction * capacity_rps for name, fraction in setup.levels.items()}
    workloads = {name: workload_at(lengths, rate, setup.seed + 1, name) for name, rate in rates.items()}
    repeats: dict[str, list[Measurement]] = {name: [] for name in setup.levels}
    for level_index, name, repeat in measurement_order(list(setup.levels), setup.repeats):
        stage = name if setup.repeats == 1 else f"{name} ({repeat + 1}/{setup.repeats})"
        repeats[name].append(measure_level(setup, folder, profile, config, base_model, workloads[name], capacity_rps,
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
