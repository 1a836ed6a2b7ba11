"""A replay's figures in the simulator's summary schema, and the replay folder read back.

summarize() gives RunSummary's keys in their order (simulator/fleet/summary.py; DESIGN.md "Summary
JSON"), so `servecast compare` reads a simulation and a replay key by key, with the simulator's own
figures (simulator.fleet.metrics distribution and slo_attainment) computed from the requests frame
alone (calibrate/runs/http.py records_frame): a frame read back gives the same summary. Failed
requests count as the simulator's rejected ones (num_rejected, rejections by error).

What a client cannot observe is null: hardware and parallelism, quant and dtypes, scheduler and
router, queue_s (no first-scheduled time), kv_utilization, preemptions, utilization, time_split_s,
memory, cost, cost_model and speculation; intervals is empty (nothing is predicted).
prefix_cache_hit_rate is the share of prompt tokens the server reported cached
(usage.prompt_tokens_details.cached_tokens, which vLLM sends with --enable-prompt-tokens-details),
null unless every finished request reported it. ITL is over the gaps between the streamed chunks of
finished requests, exact (the simulator bins its gaps: within 0.3 %).

The summary adds a "replay" section: ReplayInfo (what was replayed where) and two checks on the
client, send_delay_s (send - scheduled arrival: the wait for a concurrency slot, or the client
falling behind) and short_outputs (finished requests with fewer tokens than the trace asked for: a
server that ignored min_tokens / ignore_eos).

A replay folder holds REQUESTS_FILE (the frame) and SUMMARY_FILE; read_replay reads one back.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.fleet.metrics import PERCENTILES, distribution, slo_attainment
from simulator.fleet.summary import Goodput, RunSummary, Throughput

REQUESTS_FILE = "requests.parquet"
SUMMARY_FILE = "summary.json"
# The simulator's summary keys, in order (stopped_early appears only when a simulation stopped early).
SUMMARY_KEYS = tuple(f.name for f in fields(RunSummary) if f.init and f.name != "stopped_early")


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


class ChunkGaps:
    """The gaps between consecutive streamed chunks of every finished request, read as
    slo_attainment reads the simulator's ITL histogram (itl_mean, itl_percentile)."""

    def __init__(self, finished: pd.DataFrame) -> None:
        per_request = [np.diff(np.asarray(t, dtype=float)) for t in finished["token_times_s"]]
        self.gaps = np.concatenate(per_request) if per_request else np.empty(0)

    def itl_mean(self) -> float:
        return float(self.gaps.mean()) if len(self.gaps) else math.nan

    def itl_percentile(self, q: float) -> float:
        return float(np.percentile(self.gaps, q)) if len(self.gaps) else math.nan


def summarize(requests: pd.DataFrame, slos: dict[str, float], info: ReplayInfo) -> dict:
    """The replay's summary (see the module docstring): figures as simulator/fleet/summary.py
    computes them, over the same span (first arrival to last finish)."""
    finished = requests[requests["status"] == "finished"]
    failed = requests[requests["status"] != "finished"]
    start = float(requests["arrival_s"].min())
    end = float(finished["finish_s"].max()) if len(finished) else start
    duration = max(end - start, 1e-12)
    output_tokens = int(finished["output_tokens"].sum())
    prompt_tokens = int(finished["prompt_tokens"].sum())
    gaps = ChunkGaps(finished)
    slo = slo_attainment(requests, slos, gaps)
    within = slo.pop("within_slo_mask")
    cached = finished["cached_prompt_tokens"]
    summary = dict.fromkeys(SUMMARY_KEYS)
    summary.update(
        model=info.model, num_requests=int(len(requests)), num_finished=int(len(finished)),
        num_rejected=int(len(failed)), rejections=dict(Counter(failed["reason"])), duration_s=duration,
        throughput=Throughput(len(finished) / duration, output_tokens / duration,
                              (output_tokens + prompt_tokens) / duration).to_dict(),
        goodput=Goodput(float(within.sum()) / duration,
                        float(finished.loc[within[within].index, "output_tokens"].sum()) / duration).to_dict(),
        ttft_s=distribution(finished["ttft_s"]), tpot_s=distribution(finished["tpot_s"]),
        itl_s={"mean": gaps.itl_mean(), **{f"p{p}": gaps.itl_percentile(p) for p in PERCENTILES}},
        e2e_s=distribution(finished["e2e_s"]), slo=slo,
        prefix_cache_hit_rate=float(cached.sum() / prompt_tokens) if prompt_tokens and cached.notna().all() else None,
        intervals={})
    summary["replay"] = {**asdict(info),
                         "send_delay_s": distribution(requests["send_s"] - requests["arrival_s"]),
                         "short_outputs": int((finished["output_tokens"] < finished["requested_output_tokens"]).sum())}
    return summary


@dataclass(frozen=True)
class ReplayRun:
    """A replay folder read back: what was replayed where, its summary, and its requests frame."""

    folder: Path
    info: ReplayInfo
    summary: dict
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
    return ReplayRun(folder, info, summary, pd.read_parquet(paths[0]))
