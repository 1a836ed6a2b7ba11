"""Replays as measured runs: a `servecast replay --out` folder read as a run to fit an engine
profile on (calibrate/fitting/engine_profile.py) or to validate one against (calibrate/runs/measured.py
MeasuredRun). No torch.

A replay folder says what was sent (its trace spec, seed and rate scale: the same workload is
rebuilt), what the client measured (its summary), and where (its deployment: the server as
SimConfig fields, calibrate/runs/deployment.py). The simulator replays the whole trace, as it was sent
(a replay is not shortened for the fit). TPOT is the mean of the requests' own TPOTs, as both
summaries compute it.

read_run_sources() reads what `--runs` names: runs tables (markdown or CSV, calibrate/runs/tables.py),
replay folders, and folders of replay folders.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from calibrate.runs.deployment import deployment_config
from calibrate.runs.tables import (SATURATED_TTFT_MS, RunsError, milliseconds, model_family, read_runs,
                                 summary_figures)
from calibrate.runs.replay_summary import SUMMARY_FILE, ReplayRun, read_replay
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload
from simulator.workload.requests import Clients, Workload


@dataclass(frozen=True)
class TraceRun:
    """A replay folder as a measured run (MeasuredRun)."""

    id: str
    config: SimConfig
    measured: dict[str, float]  # real_runs.METRICS, ms
    replayed: Workload = field(repr=False, compare=False)  # what was sent, loaded once

    @property
    def hardware(self) -> str:
        return self.config.hardware

    @property
    def tp(self) -> int:
        return self.config.tp

    @property
    def family(self) -> str:
        return model_family(self.config.model)

    @property
    def saturated(self) -> bool:
        return self.measured["ttft_mean"] > SATURATED_TTFT_MS

    @property
    def duration_s(self) -> float:
        return max(self.replayed.duration_s, 1e-9)

    def sim_config(self) -> SimConfig:
        return self.config

    def workload(self, time_scale: float = 1.0) -> Workload:
        """The replayed workload, whole whatever time_scale (a replay is fitted as it was sent)."""
        return self.replayed

    def figures(self, summary) -> dict[str, float]:
        return replay_figures(summary)


def replay_figures(summary) -> dict[str, float]:
    """The METRICS of a summary (a replay's or a simulation's) in ms, TPOT the requests' own mean."""
    return {**summary_figures(summary), "tpot": milliseconds(summary.tpot_s.mean)}


def replay_config(replayed: ReplayRun, default_hardware: str | None = None, default_profile: str | None = None,
                  **extra) -> SimConfig:
    """The SimConfig of the server a replay ran against (its deployment, its workload's seed; extra:
    more fields, e.g. slo, overriding the recorded ones); default_hardware: the device of a replay
    whose deployment names none; default_profile: the servecast profile of the device where the
    deployment gives none (needed for a profiled device such as cpu-local). RunsError naming the folder and the fix."""
    where = str(replayed.folder)
    fields = dict(replayed.info.deployment or {})
    if "hardware" not in fields and default_hardware is not None:
        fields["hardware"] = default_hardware
    if "profile" not in fields and default_profile is not None:
        fields["profile"] = default_profile
    extra = {"seed": replayed.info.seed, **extra}  # extra's fields override the recorded ones
    try:
        config = deployment_config(fields, where, **extra)
        if config.accelerator().profiled and config.profile is None:
            raise ValueError(f"{where} ran on {config.hardware}, a device timed from its own profile: give "
                             f"--profile P.jsonl, made on the machine that served it by `servecast profile --model "
                             f"{config.model} --threads N --out P.jsonl` (N: the server's --threads)")
        config.check()
    except ValueError as exc:
        raise RunsError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
    return config


def trace_run(replayed: ReplayRun, hardware: str | None = None, profile: str | None = None) -> TraceRun:
    """A replay as a run to fit or validate on (replay_config says what hardware and profile are);
    RunsError naming the folder and the fix for a replay that cannot be simulated as measured."""
    info, summary, where = replayed.info, replayed.summary, str(replayed.folder)
    if summary.num_rejected:
        reason = next(iter(summary.rejections or {"?": 0}))
        raise RunsError(f"{where}: {summary.num_rejected} of {summary.num_requests} requests failed ({reason}): "
                        "calibrate on replays the server served whole (a lower rate, a longer --request-timeout)")
    short = summary.replay.short_outputs or 0
    if short:
        raise RunsError(f"{where}: {short} requests got fewer tokens than the trace asked (the server ignored "
                        "min_tokens / ignore_eos): the simulator would generate them all; replay against a server "
                        "that forces output lengths")
    config = replay_config(replayed, hardware, profile)
    try:
        workload = load_workload(info.trace, seed=info.seed, rate_scale=info.rate_scale)
    except ValueError as exc:
        raise RunsError(f"{where}: its trace cannot be read again ({exc})") from None
    if info.max_concurrency is not None and workload.clients is None:  # --max-concurrency: closed-loop clients
        workload = workload.closed_loop(Clients(info.max_concurrency))
    if len(workload) != summary.num_requests:
        raise RunsError(f"{where}: its trace {info.trace} now holds {len(workload)} requests, the replay sent "
                        f"{summary.num_requests}: the trace changed since; point the summary's trace at the one replayed")
    measured = replay_figures(summary)
    bad = [k for k, v in measured.items() if not math.isfinite(v)]
    if bad:
        raise RunsError(f"{where}: the replay measured no {', '.join(bad)} (too few tokens per request?)")
    return TraceRun(replayed.folder.name, config, measured, workload)


def replay_folders(path: Path) -> list[Path]:
    """The replay folders a --runs folder names: itself, or the folders under it that hold a summary
    (in natural order: rate5 before rate20)."""
    if (path / SUMMARY_FILE).is_file():
        return [path]
    natural = lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]  # noqa: E731
    return sorted((p.parent for p in path.glob(f"*/{SUMMARY_FILE}")), key=natural)


def read_run_sources(paths: list[Path], hardware: str | None = None, max_num_batched_tokens: int = 2048,
                     profile: str | None = None) -> list:
    """The runs of every --runs path: runs tables (markdown or CSV; a run without a Hardware column
    runs on `hardware`, default h100-sxm) and replay folders (or folders of them). Run ids are
    unique across them (a repeated id gets its source's name in front)."""
    runs: list = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            folders = replay_folders(path)
            if not folders:
                raise RunsError(f"{path} holds no replay (no {SUMMARY_FILE} in it or in its folders): give replay "
                                "folders (servecast replay --out) or a runs table")
            for folder in folders:
                try:
                    replayed = read_replay(folder)
                except ValueError as exc:
                    raise RunsError(str(exc)) from None
                runs.append((folder, trace_run(replayed, hardware, profile)))
        else:
            runs.extend((path, run) for run in read_runs(path, hardware or "h100-sxm", max_num_batched_tokens))
    seen: dict[str, int] = {}
    for _, run in runs:
        seen[run.id] = seen.get(run.id, 0) + 1
    named = [run if seen[run.id] == 1 else replace(run, id=f"{source.parent.name if source.is_dir() else source.stem}/"
                                                             f"{run.id}") for source, run in runs]
    counts: dict[str, int] = {}
    unique = []
    for run in named:  # still repeated (the same folder twice, or alike paths): numbered
        counts[run.id] = counts.get(run.id, 0) + 1
        unique.append(run if counts[run.id] == 1 else replace(run, id=f"{run.id}#{counts[run.id]}"))
    return unique
