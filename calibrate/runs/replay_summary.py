"""A replay's figures in the simulator's summary schema, and the replay folder read back.

summarize() gives a ReplaySummary: a RunSummary (simulator/fleet/summary.py; docs/summary.md), so
`servecast compare` reads a simulation and a replay key by key, its per-request figures the
simulator's own (simulator.fleet.metrics served) computed from the requests frame alone
(calibrate/runs/http.py records_frame): a frame read back gives the same summary. Failed
requests count as the simulator's rejected ones (num_rejected, rejections by error).

What a client cannot observe is None (UNOBSERVED): hardware and parallelism, quant and dtypes,
scheduler and router, queue_s (no first-scheduled time), kv_utilization, preemptions, utilization,
time_split_s, memory, cost, cost_model, speculation, kv_offload and disaggregation; intervals is
empty (nothing is predicted).
prefix_cache_hit_rate is the share of prompt tokens the server reported cached
(usage.prompt_tokens_details.cached_tokens, which vLLM sends with --enable-prompt-tokens-details),
null unless every finished request reported it. ITL is over the gaps between the streamed chunks of
finished requests, exact (the simulator bins its gaps: within 0.3 %).

The summary adds a "replay" section (ReplaySection): ReplayInfo (what was replayed where) and two
checks on the client, send_delay_s (send - scheduled arrival: the wait for a concurrency slot, or
the client falling behind) and short_outputs (finished requests with fewer tokens than the trace
asked for: a server that ignored min_tokens / ignore_eos).

A replay folder holds REQUESTS_FILE (the frame) and SUMMARY_FILE; read_replay reads one back, its
summary as a ReplaySummary again.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import pandas as pd

from simulator.fleet.metrics import TokenGaps, distribution, served
from simulator.fleet.summary import Distribution, RunSummary
from simulator.fleet.summary_parts import Part

REQUESTS_FILE = "requests.parquet"
SUMMARY_FILE = "summary.json"
# RunSummary's fields a client cannot observe: None in a replay's summary.
UNOBSERVED = ("hardware", "tp", "pp", "cp", "replicas", "quant", "compute_dtype", "kv_dtype", "scheduler", "router",
              "queue_s", "kv_utilization", "preemptions", "utilization", "time_split_s", "cost", "memory",
              "cost_model", "speculation", "kv_offload", "disaggregation")


@dataclass(frozen=True)
class ReplayInfo:
    """What was replayed where: the summary's "replay" section."""

    url: str
    model: str
    trace: str  # the --trace spec, loaded with seed and rate_scale
    seed: int  # the workload's (lengths, arrivals)
    rate_scale: float
    max_concurrency: int | None
    tokenizer: str | None  # text prompts through this tokenizer folder; None: token ids
    vocab_size: int  # token ids drawn from [0, vocab_size)
    started_at: str  # ISO 8601, UTC
    server: dict | None  # what GET {url}/models returned
    # The server as the simulator sees it (calibrate/runs/deployment.py: SimConfig fields), as far as it
    # was reported or stated; what `servecast calibrate --runs` simulates the replay on.
    deployment: dict | None = None
    prompt_seed: int | None = None  # the prompts' token ids' (None: seed, as replays before it drew them)

    @classmethod
    def from_dict(cls, section: dict) -> "ReplayInfo":
        missing = [f.name for f in fields(cls) if f.name not in section and f.default is MISSING]
        if missing:
            raise ValueError(f"the replay section lacks {', '.join(missing)}")
        return cls(**{f.name: section[f.name] for f in fields(cls) if f.name in section})


@dataclass(frozen=True)
class ReplaySection(ReplayInfo, Part):
    """The summary's "replay" section: ReplayInfo's fields, then the client's two checks."""

    send_delay_s: Distribution | None = field(default=None, kw_only=True)  # send - scheduled arrival
    short_outputs: int | None = field(default=None, kw_only=True)  # finished with fewer tokens than asked

    @classmethod
    def from_dict(cls, section: dict) -> "ReplaySection":
        info = ReplayInfo.from_dict(section)
        delay = section.get("send_delay_s")
        return cls(**{f.name: getattr(info, f.name) for f in fields(ReplayInfo)},
                   send_delay_s=Distribution.from_dict(delay) if isinstance(delay, dict) else None,
                   short_outputs=section.get("short_outputs"))


@dataclass(frozen=True)
class ReplaySummary(RunSummary):
    """A replay's summary: a RunSummary (UNOBSERVED None) and its "replay" section, last."""

    replay: ReplaySection = field(default=None, kw_only=True)


def summarize(requests: pd.DataFrame, slos: dict[str, float], info: ReplayInfo) -> ReplaySummary:
    """The replay's summary (see the module docstring): the per-request figures as a simulation's
    (simulator.fleet.metrics served), ITL over the streamed chunks' exact gaps."""
    figures = served(requests, slos, TokenGaps(requests.loc[requests["status"] == "finished", "token_times_s"]))
    finished, prompt_tokens = figures.finished, figures.prompt_tokens
    cached = finished["cached_prompt_tokens"]
    section = ReplaySection(**{f.name: getattr(info, f.name) for f in fields(ReplayInfo)},
                            send_delay_s=distribution(requests["send_s"] - requests["arrival_s"]),
                            short_outputs=int((finished["output_tokens"] < finished["requested_output_tokens"]).sum()))
    return ReplaySummary(
        model=info.model, **{**figures.summary_fields(), **dict.fromkeys(UNOBSERVED)},
        prefix_cache_hit_rate=float(cached.sum() / prompt_tokens) if prompt_tokens and cached.notna().all() else None,
        intervals={}, predicted={}, extrapolated_across=[], replay=section)


@dataclass(frozen=True)
class ReplayRun:
    """A replay folder read back: what was replayed where, its summary, and its requests frame."""

    folder: Path
    info: ReplayInfo
    summary: ReplaySummary
    requests: pd.DataFrame


def read_replay(folder: str | Path) -> ReplayRun:
    """The replay written to folder (`servecast replay --out`); ValueError naming what is missing."""
    folder = Path(folder)
    paths = [folder / REQUESTS_FILE, folder / SUMMARY_FILE]
    absent = [p.name for p in paths if not p.is_file()]
    if absent:
        raise ValueError(f"{folder} is not a replay folder: no {' or '.join(absent)} (servecast replay --out writes them)")
    try:
        summary = json.loads(paths[1].read_text())
    except ValueError as exc:
        raise ValueError(f"{paths[1]} is not JSON ({exc})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("replay"), dict):
        raise ValueError(f"{paths[1]} has no replay section: not written by servecast replay")
    try:
        info = ReplayInfo.from_dict(summary["replay"])
    except ValueError as exc:
        raise ValueError(f"{paths[1]}: {exc}") from None
    return ReplayRun(folder, info, ReplaySummary.from_dict(summary), pd.read_parquet(paths[0]))
