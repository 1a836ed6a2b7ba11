"""Profile the engine's own operators on the device at hand (`servecast profile`).

Every operator is the engine's code: packed-weight GEMMs (engine/linear.py) for each linear layer
of the model, paged attention (engine/attention.py) for prefill chunks and decode batches, KV-cache
writes, RMSNorm / rotary / SwiGLU / residual adds, sampling, the scheduler's work per step by batch
size, and whole model-runner steps (input preparation + forward + sampling) of uniform, spread and
mixed batches at two depths, from which the cost model fits what the operators leave out. GEMMs
rotate through copies of their weights and whole forwards read a scattered KV pool, as in serving.
Each point: warm-up, then the median of repeated timed calls. Results are appended one line at a time, so an interrupted profile resumes.
Random weights: timing does not depend on their values.

The pieces: what is timed (calibrate/profiling/plan.py), how each operator is built and timed
(calibrate/profiling/operator_timing.py), and the device's fingerprint and peaks (calibrate/profiling/header.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from calibrate.profiling.operator_timing import OperatorTimer
from calibrate.profiling.header import fingerprint, measure_bandwidth_by_size, measure_peaks
from calibrate.profiling.plan import ProfileGrid, attention_shapes, profile_plan
from engine.policy.config import ModelConfig
from engine.linear import Linear
from engine.quant_kernels import KernelChoice, adopt, choice_key
from engine.runner import TORCH_DTYPES
from engine.tp_shard import shard_config
from simulator.catalog.hardware import canonical_dtype
from simulator.cost.profile_format import Measurement, Profile


class Profiler:
    def __init__(self, model: ModelConfig, device: str = "cpu", dtype: str = "float32", hardware: str | None = None,
                 grid: ProfileGrid | None = None, tp: int = 1, cp: int = 1) -> None:
        if tp < 1 or cp < 1:
            raise ValueError(f"tp and cp must be at least 1, got tp={tp}, cp={cp}")
        if tp > 1 and cp > 1:
            raise ValueError("profile one of --tp and --cp at a time (the engine runs context parallelism "
                             "with tensor_parallel_size=1 only)")
        self.tp, self.cp = tp, cp
        # Under tensor parallelism every rank runs the same shard: its operators are what a TP=tp
        # step costs, plus the all-reduces timed across tp processes.
        self.model = model if tp == 1 else shard_config(model, tp)
        self.device = torch.device(device)
        self.torch_dtype = TORCH_DTYPES[dtype]
        self.dtype = canonical_dtype(dtype)
        self.hardware = hardware or ("cuda-local" if self.device.type == "cuda" else "cpu-local")
        self.grid = grid or ProfileGrid()
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self.operators = OperatorTimer(self.model, self.grid, self.device, self.torch_dtype, self.sync, self.plan)

    def header(self) -> Profile:
        calls = self.grid.cuda_calls_per_sample if self.device.type == "cuda" else 1
        prints = fingerprint(self.device, self.dtype, calls)
        if self.grid.weight_quant:
            prints["quant_kernels"] = self.quant_kernels()
        return Profile(self.hardware, prints, {}, "servecast profile")

    def _quant_shapes(self) -> list[tuple[str, int, int, int]]:
        """(mode, n, k, group size) of every quantized GEMM the plan times."""
        points = [p for op, p in self.plan() if op == "gemm_quant"]
        return list(dict.fromkeys((p["weight_dtype"], p["n"], p["k"], p["group_size"]) for p in points))

    def quant_kernels(self) -> dict[str, str]:
        """The kernels the plan's quantized GEMMs run, chosen as the engine chooses them (measured
        in this process, engine/quant_kernels.py): 'mode NxK gG' -> the choice per row bucket."""
        chosen = {}
        for mode, n, k, group in self._quant_shapes():
            layer = Linear(k, n, bias=False, device=self.device, dtype=self.torch_dtype)
            layer.quantize(mode, group)
            chosen[f"{mode} {n}x{k} g{group}"] = layer.quantized.choice.describe()
        return chosen

    def adopt_quant_kernels(self, recorded: dict[str, str]) -> None:
        """Time the kernels a resumed profile recorded, not a new measurement's choice."""
        for mode, n, k, group in self._quant_shapes():
            text = recorded.get(f"{mode} {n}x{k} g{group}")
            if text is not None:
                adopt(choice_key(mode, (n, k), group, self.torch_dtype, self.device), KernelChoice.parse(text))

    # -- the grid -----------------------------------------------------------------------------
    def plan(self) -> list[tuple[str, dict]]:
        """(op, params) of every measurement, in order (calibrate/profiling/plan.py)."""
        return profile_plan(self.model, self.grid, self.dtype, self.tp, self.torch_dtype.itemsize, self.cp)

    def _attention_shapes(self) -> list[dict]:
        """The attention head layouts the plan times (profile_plan.attention_shapes)."""
        return attention_shapes(self.model, self.grid, self.dtype)

    # -- running ------------------------------------------------------------------------------
    def run(self, out: str | Path, on_progress: Callable[[int, int], None] | None = None) -> Profile:
        """Measure every point of the plan not yet in `out` (appending as it goes); return the profile."""
        for finished, total in self.steps(out):
            if on_progress is not None:
                on_progress(finished, total)
        return Profile.load(out)

    def steps(self, out: str | Path) -> Iterator[tuple[int, int]]:
        """Like run(), one operator group at a time: yields (points finished, points planned)."""
        path = Path(out)
        existing = Profile.load(path) if path.exists() and path.stat().st_size > 0 else None
        if existing is not None:
            self.adopt_quant_kernels(existing.fingerprint.get("quant_kernels") or {})
        header = self.header()
        if existing is not None:
            if existing.hardware != header.hardware or existing.fingerprint.get("dtype") != self.dtype:
                raise ValueError(f"{path} is a profile of {existing.hardware} ({existing.fingerprint.get('dtype')}); "
                                 f"this run is {header.hardware} ({self.dtype}): choose another --out")
            done = {m.key for m in existing.measurements}
        else:
            header.peaks = measure_peaks(self.device, self.torch_dtype, self.sync)
            header.bandwidth_by_size = measure_bandwidth_by_size(self.device, self.sync)
            header.save(path)
            done = set()
        plan = self.plan()
        finished = 0
        for group in _groups(plan):
            todo = [(op, params) for op, params in group if Measurement.make(op, 1.0, **params).key not in done]
            times: dict[int, list[float]] = {i: [] for i in range(len(todo))}
            if todo and todo[0][0] in ("all_reduce", "all_to_all", "kv_ring"):
                from calibrate.profiling.collectives import measure_collective

                measured = measure_collective(todo[0][0], todo[0][1]["world"], [p["nbytes"] for _, p in todo],
                                              self.device.type, str(self.torch_dtype).removeprefix("torch."))
                times = {i: [measured[p["nbytes"]]] for i, (_, p) in enumerate(todo)}
                todo_passes = 0
            else:
                todo_passes = self.grid.passes
            for _ in range(todo_passes):
                for i, (op, params) in enumerate(todo):
                    times[i].append(self.operators.measure(op, params))
            for i, (op, params) in enumerate(todo):
                m = Measurement.make(op, statistics.median(times[i]), **params)
                Profile.append(path, m)
                done.add(m.key)
            finished += len(group)
            yield finished, len(plan)
        write_fitted_beside(path)


def _groups(plan: list[tuple[str, dict]]) -> Iterator[list[tuple[str, dict]]]:
    """Consecutive points of the same operator (and layer / elementwise name)."""
    group: list[tuple[str, dict]] = []
    for point in plan:
        if group and (group[0][0], group[0][1].get("name")) != (point[0], point[1].get("name")):
            yield group
            group = []
        group.append(point)
    if group:
        yield group


def profile_side_by_side(jobs: list[tuple["Profiler", Path]]) -> list[Profile]:
    """Profile several models in alternation, one operator group of each in turn, so that a
    shared machine's slow and fast spells fall on all of them alike (for comparisons between them)."""
    runs = [profiler.steps(path) for profiler, path in jobs]
    while runs:
        runs = [r for r in runs if next(r, None) is not None]
    return [Profile.load(path) for _, path in jobs]


def write_fitted_beside(path: Path) -> Path | None:
    """Fit the cost model on a finished profile and keep the terms beside it (FittedTerms), so the
    simulator reads them instead of fitting; a resumed profile that measured nothing new keeps its
    current terms. None where the device is not in the catalog (users' own hardware files: the CLI
    fits in memory then)."""
    from calibrate.fitting.device import fit_profile
    from simulator.cost.fitted import FittedTerms
    from simulator.cost.model import CostModel

    if FittedTerms.beside(path) is not None:  # fitted on this very file (its digest)
        return FittedTerms.path_beside(path)
    profile = Profile.load(path)
    try:
        model = CostModel.unfitted(profile.hardware, profile)
    except ValueError:
        return None
    return fit_profile(model, profile).save_beside(path)
