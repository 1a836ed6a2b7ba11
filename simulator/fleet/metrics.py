"""What a simulation measures: per-request rows, time series, and what the rows come to (Served:
the per-request figures of every summary, a simulation's, a replay's or the engine's). No torch.

The recorder keeps one row per finished (or rejected) request and nothing else per request, so
memory grows with the metric rows only; inter-token latencies of all requests go into a
logarithmic histogram (ITL_BINS_PER_DECADE bins per factor of 10: percentiles within 0.3%).

Definitions (vLLM's): queueing delay = first scheduled - arrival; TTFT = first token - arrival;
TPOT = (finish - first token) / (output tokens - 1), the mean time per output token after the
first; ITL = gaps between consecutive tokens of a request; E2E = finish - arrival.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections import Counter
from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from engine.policy.sequence import Sequence
from simulator.fleet.summary_parts import Distribution, Goodput, Slo, Throughput

PERCENTILES = (50, 90, 95, 99)
ITL_BINS_PER_DECADE = 400
ITL_MIN_S = 1e-7
ITL_DECADES = 11  # 1e-7 s ... 1e4 s


# Per-request columns and their typecodes: compact arrays, 8 bytes a value, since a million-request
# run keeps a million rows.
COLUMNS = {"request_id": "q", "replica": "q", "arrival_s": "d", "prompt_tokens": "q", "output_tokens": "q",
           "first_scheduled_s": "d", "first_token_s": "d", "finish_s": "d", "preemptions": "q",
           "cached_prompt_tokens": "q", "itl_max_s": "d"}


@dataclass
class Recorder:
    columns: dict[str, array] = field(default_factory=lambda: {k: array(t) for k, t in COLUMNS.items()})
    rejected: list[tuple[int, float, int, int, str]] = field(default_factory=list)
    itl_counts: np.ndarray = field(default_factory=lambda: np.zeros(ITL_BINS_PER_DECADE * ITL_DECADES + 2, np.int64))
    timeseries: dict[str, list] = field(default_factory=lambda: {
        "time_s": [], "replica": [], "waiting": [], "running": [], "tokens_in_flight": [], "kv_utilization": [],
        "batch_tokens": [], "finished": [], "output_tokens": []})

    # Token times of finished requests not yet binned: their gaps and itl_max_s are computed a few
    # thousand requests at a time (one numpy pass, not one per request).
    _pending_times: list = field(default_factory=list)
    # Told of every first token, finish and rejection when a run may stop once its SLOs are missed
    # (slo_watch.py); the requests whose first token it was told of, until they finish.
    watch: object | None = None
    # Told when each request finishes (its finish time) or is rejected (None): closed-loop clients.
    on_request_done: object | None = None
    _first_tokens_told: set = field(default_factory=set)

    def flush_gaps(self) -> None:
        pending = self._pending_times
        if not pending:
            return
        self._pending_times = []
        lengths = np.fromiter(map(len, pending), np.int64, len(pending))
        times = np.fromiter(itertools.chain.from_iterable(pending), np.float64, int(lengths.sum()))
        ends = np.cumsum(lengths)
        starts = ends - lengths
        gaps = np.diff(times)
        # Gap j joins times j and j + 1: it crosses into the next request when j + 1 starts one.
        inside = np.ones(len(gaps), bool)
        crossing = starts[(starts > 0) & (starts < len(times))] - 1
        inside[crossing] = False
        self.itl_counts += np.bincount(_itl_bins(gaps[inside]), minlength=len(self.itl_counts))
        itl_max = np.full(len(pending), math.nan)
        multi = lengths > 1
        if multi.any():
            masked = np.where(inside, gaps, -np.inf)
            # Each multi-token request's segment runs to the next one's start: its own gaps, then
            # crossing gaps (-inf) and single-token requests (no gaps of their own).
            itl_max[multi] = np.maximum.reduceat(masked, starts[multi])
        self.columns["itl_max_s"].extend(itl_max.tolist())

    def on_progress(self, callback, every: int = 1) -> None:
        """callback(number of requests done) after every `every` finished or rejected requests (None: stop)."""
        self._progress, self._progress_every = callback, every

    def merge(self, other: "Recorder") -> None:
        """Add another recorder's rows, samples and gap counts (replicas simulated apart)."""
        self.flush_gaps()
        other.flush_gaps()
        for key, column in self.columns.items():
            column.extend(other.columns[key])
        self.rejected.extend(other.rejected)
        self.itl_counts += other.itl_counts
        for key, values in self.timeseries.items():
            values.extend(other.timeseries[key])

    def _done(self) -> None:
        callback = getattr(self, "_progress", None)
        if callback is not None:
            done = len(self.columns["request_id"]) + len(self.rejected)
            if done % self._progress_every == 0:
                callback(done)

    def finish(self, seq: Sequence, replica: int) -> None:
        c = self.columns
        times = seq.token_times
        c["request_id"].append(seq.request_id)
        c["replica"].append(replica)
        c["arrival_s"].append(seq.arrival_time)
        c["prompt_tokens"].append(seq.num_prompt_tokens)
        c["output_tokens"].append(seq.num_output_tokens)
        c["first_scheduled_s"].append(seq.first_scheduled_time)
        c["first_token_s"].append(seq.first_token_time)
        c["finish_s"].append(seq.finish_time)
        c["preemptions"].append(seq.num_preemptions)
        c["cached_prompt_tokens"].append(seq.num_cached_prompt_tokens)
        self._pending_times.append(times)
        if len(self._pending_times) >= 512:  # binned in batches small enough to reuse their memory
            self.flush_gaps()
        if self.watch is not None:
            counted = seq.request_id in self._first_tokens_told
            self._first_tokens_told.discard(seq.request_id)
            self.watch.finished(seq.arrival_time, seq.first_token_time, seq.finish_time, seq.num_output_tokens,
                                ttft_counted=counted)
        if self.on_request_done is not None:
            self.on_request_done(seq.finish_time)
        self._done()

    def first_token(self, seq: Sequence) -> None:
        """A request's first token, told to the watch at once (replica.py calls it when one is watching)."""
        self._first_tokens_told.add(seq.request_id)
        self.watch.first_token(seq.arrival_time, seq.first_token_time)

    def reject(self, request_id: int, arrival_s: float, prompt: int, output: int, reason: str) -> None:
        self.rejected.append((request_id, arrival_s, prompt, output, reason))
        if self.watch is not None:
            self.watch.rejected(reason)
        if self.on_request_done is not None:
            self.on_request_done(None)
        self._done()

    def sample(self, time_s: float, replica: int, waiting: int, running: int, tokens_in_flight: int,
               kv_utilization: float, batch_tokens: int, finished: int, output_tokens: int) -> None:
        ts = self.timeseries
        for key, value in (("time_s", time_s), ("replica", replica), ("waiting", waiting), ("running", running),
                           ("tokens_in_flight", tokens_in_flight), ("kv_utilization", kv_utilization),
                           ("batch_tokens", batch_tokens),
                           ("finished", finished), ("output_tokens", output_tokens)):
            ts[key].append(value)

    # -- tables ---------------------------------------------------------------------------------
    def requests_frame(self) -> pd.DataFrame:
        self.flush_gaps()
        df = pd.DataFrame({k: np.frombuffer(v, dtype=np.int64 if v.typecode == "q" else np.float64).copy()
                           for k, v in self.columns.items()})
        df["status"] = "finished"
        df["reason"] = ""
        if self.rejected:
            rej = pd.DataFrame(self.rejected, columns=["request_id", "arrival_s", "prompt_tokens", "output_tokens",
                                                       "reason"])
            rej["status"] = "rejected"
            rej["replica"] = -1
            # With every request rejected, theirs are the only rows (the finished rows' columns empty).
            df = pd.concat([df, rej], ignore_index=True) if len(df) else rej.reindex(columns=df.columns)
        df = df.sort_values("request_id", kind="stable").reset_index(drop=True)
        df["queue_s"] = df["first_scheduled_s"] - df["arrival_s"]
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        df["e2e_s"] = df["finish_s"] - df["arrival_s"]
        decode_tokens = (df["output_tokens"] - 1).where(df["output_tokens"] > 1)
        df["tpot_s"] = (df["finish_s"] - df["first_token_s"]) / decode_tokens
        return df

    def timeseries_frame(self) -> pd.DataFrame:
        """Samples in time order (replicas sample as their steps end, not in one global order)."""
        frame = pd.DataFrame(self.timeseries)
        return frame.sort_values(["time_s", "replica"], kind="stable").reset_index(drop=True)

    def itl_percentile(self, q: float) -> float:
        self.flush_gaps()
        total = self.itl_counts.sum()
        if total == 0:
            return math.nan
        index = int(np.searchsorted(np.cumsum(self.itl_counts), q / 100.0 * total))
        return _itl_bin_center(index)

    def itl_mean(self) -> float:
        self.flush_gaps()
        total = self.itl_counts.sum()
        if total == 0:
            return math.nan
        centers = np.array([_itl_bin_center(i) for i in range(len(self.itl_counts))])
        return float((centers * self.itl_counts).sum() / total)


def _itl_bins(gaps: np.ndarray) -> np.ndarray:
    # log10(max(gap, ITL_MIN_S) / ITL_MIN_S) * ITL_BINS_PER_DECADE, + 1, capped: in place (a
    # flush bins a few hundred thousand gaps).
    logs = np.maximum(gaps, ITL_MIN_S)
    logs /= ITL_MIN_S
    np.log10(logs, out=logs)
    logs *= ITL_BINS_PER_DECADE
    bins = logs.astype(np.int64)
    bins += 1
    return np.minimum(bins, ITL_BINS_PER_DECADE * ITL_DECADES + 1, out=bins)


def _itl_bin_center(index: int) -> float:
    if index == 0:
        return 0.0
    return ITL_MIN_S * 10 ** ((index - 0.5) / ITL_BINS_PER_DECADE)


def distribution(values) -> Distribution:
    """The mean and PERCENTILES of the values (a Series or any sequence), NaN and None left out;
    every figure NaN where none are left. The one distribution of the project's summaries: JSON
    writes NaN as null (app/common.py jsonable), at the edge."""
    v = pd.Series(values, dtype=float).dropna().to_numpy()
    if len(v) == 0:
        return Distribution(math.nan, *(math.nan for _ in PERCENTILES))
    return Distribution(float(v.mean()), *(float(np.percentile(v, p)) for p in PERCENTILES))


class TokenGaps:
    """The exact gaps between consecutive token times of each request (a replay's streamed chunks,
    the engine's tokens), read as the ITL source the simulator's Recorder is (itl_mean, itl_percentile)."""

    def __init__(self, token_times) -> None:
        per_request = [np.diff(np.asarray(t, dtype=float)) for t in token_times]
        self.gaps = np.concatenate(per_request) if per_request else np.empty(0)

    def itl_mean(self) -> float:
        return float(self.gaps.mean()) if len(self.gaps) else math.nan

    def itl_percentile(self, q: float) -> float:
        return float(np.percentile(self.gaps, q)) if len(self.gaps) else math.nan


def itl_distribution(itl) -> Distribution:
    """ITL of an ITL source (Recorder: binned, within 0.3 %; TokenGaps: exact)."""
    return Distribution(itl.itl_mean(), *(itl.itl_percentile(p) for p in PERCENTILES))


def slo_attainment(requests: pd.DataFrame, slos: dict[str, float], itl=None) -> tuple[Slo, pd.Series]:
    """Each SLO's measured value and whether it is met; the share of requests meeting all per-request
    limits, and which finished requests do (goodput counts those). itl: an ITL source (Recorder, TokenGaps)."""
    finished = requests[requests["status"] == "finished"]
    measured, met = {}, {}
    ok = pd.Series(True, index=finished.index)
    for key, limit in slos.items():
        metric, stat = key.split("_")
        if metric == "itl" and itl is not None:
            value = itl.itl_mean() if stat == "mean" else itl.itl_percentile(float(stat[1:]))
        else:
            series = finished[f"{metric}_s"].dropna()
            value = float(series.mean()) if stat == "mean" else float(np.percentile(series, float(stat[1:]))) \
                if len(series) else math.nan
        measured[key] = value
        met[key] = bool(value <= limit)
        if metric in ("ttft", "tpot", "e2e"):
            ok &= finished[f"{metric}_s"].fillna(0.0) <= limit
    slo = Slo(dict(slos), measured, met, all(met.values()) if slos else True,
              float(ok.mean()) if len(finished) else math.nan)
    return slo, ok


@dataclass(frozen=True)
class Served:
    """What a run's per-request rows come to: the figures a simulation (simulator/fleet/summary.py),
    a measured replay (calibrate/runs/replay_summary.py) and the engine's outputs (app/report.py) share,
    under RunSummary's names. Rows: status ("finished", else rejected or failed), reason, arrival_s,
    finish_s, prompt_tokens, output_tokens, ttft_s, tpot_s, e2e_s, and queue_s where known (a client
    sees no first-scheduled time: queue_s None without it). Over the span from the first arrival to
    the last finish."""

    num_requests: int
    num_finished: int
    num_rejected: int
    rejections: dict[str, int]
    duration_s: float
    throughput: Throughput
    goodput: Goodput
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    queue_s: Distribution | None
    slo: Slo
    # Not summary keys: what the callers' own figures are made of.
    prompt_tokens: int  # of the finished requests
    output_tokens: int
    finished: pd.DataFrame = field(repr=False, compare=False)

    def summary_fields(self) -> dict:
        """These figures as RunSummary's keyword arguments."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in SERVED_OWN}


SERVED_OWN = ("prompt_tokens", "output_tokens", "finished")


def served(requests: pd.DataFrame, slos: dict[str, float], itl) -> Served:
    """The per-request rows' figures (Served); slos: SLO key -> limit in seconds; itl: the ITL source
    (Recorder, TokenGaps) of the finished requests."""
    finished = requests[requests["status"] == "finished"]
    rejected = requests[requests["status"] != "finished"]
    start = float(requests["arrival_s"].min())
    end = float(finished["finish_s"].max()) if len(finished) else start
    duration = max(end - start, 1e-12)
    output_tokens = int(finished["output_tokens"].sum())
    prompt_tokens = int(finished["prompt_tokens"].sum())
    slo, within = slo_attainment(requests, slos, itl)
    return Served(
        num_requests=int(len(requests)), num_finished=int(len(finished)), num_rejected=int(len(rejected)),
        rejections=dict(Counter(rejected["reason"])) if len(rejected) else {},
        duration_s=duration,
        throughput=Throughput(len(finished) / duration, output_tokens / duration,
                              (output_tokens + prompt_tokens) / duration),
        goodput=Goodput(float(within.sum()) / duration,
                        float(finished.loc[within[within].index, "output_tokens"].sum()) / duration
                        if len(finished) else 0.0),
        ttft_s=distribution(finished["ttft_s"]), tpot_s=distribution(finished["tpot_s"]),
        itl_s=itl_distribution(itl), e2e_s=distribution(finished["e2e_s"]),
        queue_s=distribution(finished["queue_s"]) if "queue_s" in finished else None,
        slo=slo, prompt_tokens=prompt_tokens, output_tokens=output_tokens, finished=finished)
