"""Requests and workloads: what arrives, when, with how many prompt and output tokens, and which
prompt segments it shares with other requests. No torch.

A workload is an ordered list of `Request`s. Trace files are read by simulator/workload/trace_files.py,
synthetic workloads are made by simulator/workload/synthetic.py; `load_workload`
(simulator/workload/load.py) takes either form of the CLI's `--trace` argument.

Prompt identity. The simulator runs the engine's block manager, which finds shared prefixes by
the prompt's token ids. A request's prompt is therefore made of *segments* (Mooncake's 512-token
hash blocks, a synthetic system prompt), each a run of tokens determined by the segment id, and a
tail unique to the request: equal leading segment ids give equal leading tokens (a real prefix
hit), and nothing else can collide.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
BUNDLED_LENGTHS = PROJECT_ROOT / "traces" / "sharegpt_lengths.csv"

# Token ids of the simulator's synthetic prompts: segment s starts with SEGMENT_BASE + s, request
# r's unique tail starts with -(r + 2); every other position holds 0. Not -(r + 1): CPython hashes
# -1 as -2, so the engine's block hashes of requests 0 and 1 would collide (a collision costs the
# pool its cache entries for those blocks; it never reuses a wrong block).
SEGMENT_BASE = 1 << 40


class WorkloadError(ValueError):
    """A trace or workload spec that cannot be used; the message names the file, line and fix."""


@dataclass(frozen=True, slots=True)
class Request:
    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    # Shared prompt segments in order (ids), each segment_tokens long (the last may be cut short
    # by the prompt's end). Empty: the whole prompt is unique to this request.
    segments: tuple[int, ...] = ()
    segment_tokens: int = 0

    def prompt_token_ids(self) -> list[int]:
        tokens: list[int] = []
        filler = [0] * max(self.segment_tokens - 1, 0)
        for s in self.segments:
            if len(tokens) >= self.prompt_tokens:
                break
            tokens.append(SEGMENT_BASE + s)
            tokens.extend(filler)
        if len(tokens) >= self.prompt_tokens:
            return tokens[:self.prompt_tokens]
        tokens.append(-(self.request_id + 2))
        tokens.extend([0] * (self.prompt_tokens - len(tokens)))
        return tokens

    @property
    def shared_prompt_tokens(self) -> int:
        return min(self.prompt_tokens, len(self.segments) * self.segment_tokens)


@dataclass(frozen=True)
class Clients:
    """Closed-loop clients: at most `concurrency` requests in flight; a request is sent when a client
    is free (its last request finished `think_s` ago) and not before its own arrival time, in order
    (`vllm bench serve --max-concurrency`; C clients that each wait think_s between requests).
    A request's arrival_s is then the earliest it may be sent; the simulator records when it was."""

    concurrency: int
    think_s: float = 0.0

    def __post_init__(self) -> None:
        if self.concurrency < 1 or not 0 <= self.think_s < math.inf:
            raise WorkloadError(f"closed-loop clients need concurrency >= 1 and a think time >= 0 s, got "
                                f"concurrency={self.concurrency}, think={self.think_s}")

    def scaled(self, factor: float) -> "Clients":
        """factor times as many clients (at least one)."""
        return Clients(max(1, round(self.concurrency * factor)), self.think_s)


@dataclass
class Workload:
    name: str
    requests: list[Request] = field(default_factory=list)
    # Bad rows of the source file that were skipped on request ("file:line: reason").
    skipped: list[str] = field(default_factory=list)
    clients: Clients | None = None  # closed-loop clients; None: every request is sent at its arrival_s

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0

    @property
    def rate_per_s(self) -> float:
        """Mean arrival rate; inf when everything arrives at once."""
        span = self.duration_s
        return (len(self.requests) - 1) / span if span > 0 else math.inf

    # -- transforms (each returns a new workload, ids renumbered in arrival order) -------------
    def scaled(self, rate_scale: float) -> "Workload":
        """Arrivals compressed in time by rate_scale (2 = twice the rate)."""
        if not rate_scale > 0 or math.isinf(rate_scale):
            raise WorkloadError(f"rate scale must be a positive number, got {rate_scale}")
        if rate_scale == 1:
            return self
        t0 = self.requests[0].arrival_s if self.requests else 0.0
        return self._with([replace(r, arrival_s=t0 + (r.arrival_s - t0) / rate_scale) for r in self.requests],
                          f"{self.name} x{rate_scale:g}")

    def repeated(self, min_duration_s: float = 0.0, min_requests: int = 0) -> "Workload":
        """The trace played again back to back (one mean inter-arrival gap between copies; shared
        prompt segments kept, so prefix reuse repeats too) until it spans min_duration_s and holds
        min_requests; itself when it already does, or when it arrives all at once."""
        n, span = len(self.requests), self.duration_s
        if n < 2 or span <= 0 or (span >= min_duration_s and n >= min_requests):
            return self
        period = span * n / (n - 1)
        copies = max(math.ceil((min_duration_s + period - span) / period), math.ceil(min_requests / n), 1)
        return self._with([replace(r, arrival_s=r.arrival_s + k * period) for k in range(copies) for r in self.requests],
                          f"{self.name} x{copies} copies")

    def multiplied(self, factor: float) -> "Workload":
        """round(factor x its requests) at their own arrival times, the requests taken in turn
        (copies get their own ids): more of the same traffic where there is no rate to scale."""
        if not factor > 0 or math.isinf(factor):
            raise WorkloadError(f"traffic factor must be a positive number, got {factor}")
        n = len(self.requests)
        if factor == 1 or n == 0:
            return self
        more = sorted((self.requests[i % n] for i in range(max(1, round(factor * n)))), key=lambda r: r.arrival_s)
        return self._with(more, f"{self.name} x{factor:g}")

    def window(self, start_s: float, end_s: float) -> "Workload":
        """Requests arriving in [start_s, end_s) seconds after the first arrival, shifted to start at 0."""
        if not end_s > start_s >= 0:
            raise WorkloadError(f"time window must satisfy 0 <= start < end, got {start_s}-{end_s}")
        t0 = self.requests[0].arrival_s if self.requests else 0.0
        kept = [replace(r, arrival_s=r.arrival_s - t0 - start_s) for r in self.requests
                if start_s <= r.arrival_s - t0 < end_s]
        if not kept:
            raise WorkloadError(f"no request of {self.name} arrives in the window {start_s:g}-{end_s:g} s "
                                f"(the trace spans {self.duration_s:g} s)")
        return self._with(kept, f"{self.name}[{start_s:g}-{end_s:g}s]")

    def from_zero(self) -> "Workload":
        """Arrivals shifted so that the first request arrives at 0."""
        t0 = self.requests[0].arrival_s if self.requests else 0.0
        if t0 == 0:
            return self
        return Workload(self.name, [replace(r, arrival_s=r.arrival_s - t0) for r in self.requests], self.skipped,
                        self.clients)

    def limited(self, num: int) -> "Workload":
        if num <= 0:
            raise WorkloadError(f"request limit must be positive, got {num}")
        return self._with(self.requests[:num], f"{self.name}[:{num}]") if num < len(self) else self

    def _with(self, requests: list[Request], name: str) -> "Workload":
        return Workload(name, [replace(r, request_id=i) for i, r in enumerate(requests)], self.skipped, self.clients)

    def closed_loop(self, clients: Clients | None) -> "Workload":
        """The same requests sent by these closed-loop clients (None: open loop, at their arrival times)."""
        return Workload(self.name, self.requests, self.skipped, clients)


def make_workload(name: str, rows: list[tuple[float, int, int, tuple[int, ...]]], segment_tokens: int = 0) -> Workload:
    """Rows (arrival_s, prompt, output, segments), sorted by arrival (stable), ids 0..n-1."""
    rows = sorted(rows, key=lambda r: r[0])
    return Workload(name, [Request(i, a, p, o, s, segment_tokens if s else 0) for i, (a, p, o, s) in enumerate(rows)])


# -- length pairs (the engine demo's workload) ----------------------------------------------------
@dataclass(frozen=True)
class LengthPair:
    prompt_tokens: int
    output_tokens: int


def csv_dict_reader(f) -> csv.DictReader:
    """A DictReader over an open CSV file (opened with newline="") that skips comment lines: whole
    lines starting with '#', before the header or between rows. They are blanked, not dropped, so
    `line_num` stays the file's line number; a line inside a quoted multi-line field is data, whatever
    it starts with (an odd count of quotes so far means a field is open; "" escapes count twice)."""
    def lines():
        quoted = False
        for line in f:
            yield "\n" if not quoted and line.startswith("#") else line
            quoted ^= line.count('"') % 2 == 1

    reader = csv.DictReader(lines())
    reader.fieldnames = next((row for row in reader.reader if row), None)
    return reader


def load_length_pairs(path: str | Path = BUNDLED_LENGTHS) -> list[LengthPair]:
    """Read a CSV with prompt/output length columns (ours, or Vidur/etalon's stats files).

    Accepted column names: prompt_tokens/output_tokens or num_prefill_tokens/num_decode_tokens.
    A bad row is an error naming its line, never silently dropped.
    """
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"no length file at {path}: give a CSV with prompt_tokens,output_tokens columns")
    pairs: list[LengthPair] = []
    with path.open(newline="") as f:
        reader = csv_dict_reader(f)
        fields = set(reader.fieldnames or ())
        for prompt_col, output_col in (("prompt_tokens", "output_tokens"),
                                       ("num_prefill_tokens", "num_decode_tokens")):
            if {prompt_col, output_col} <= fields:
                break
        else:
            raise WorkloadError(f"{path}: needs columns prompt_tokens,output_tokens (or num_prefill_tokens,"
                                f"num_decode_tokens); found {sorted(fields)}")
        for row in reader:
            try:
                pair = LengthPair(int(row[prompt_col]), int(row[output_col]))
            except (TypeError, ValueError):
                raise WorkloadError(f"{path}:{reader.line_num}: lengths must be integers, got "
                                    f"{row[prompt_col]!r}, {row[output_col]!r}") from None
            if pair.prompt_tokens <= 0 or pair.output_tokens <= 0:
                raise WorkloadError(f"{path}:{reader.line_num}: lengths must be positive, got "
                                    f"{pair.prompt_tokens}, {pair.output_tokens}")
            pairs.append(pair)
    if not pairs:
        raise WorkloadError(f"{path} holds no rows")
    return pairs


def sample_lengths(pairs: list[LengthPair], num: int, seed: int, scale: float = 1.0,
                   max_total: int | None = None) -> list[LengthPair]:
    """num pairs drawn with replacement, each length multiplied by scale (at least 1 token) and the
    pair shrunk proportionally to fit max_total tokens, for running a real trace's shape on a
    small machine or a small model."""
    rng = random.Random(seed)
    out = []
    for pair in rng.choices(pairs, k=num):
        prompt = max(1, round(pair.prompt_tokens * scale))
        output = max(1, round(pair.output_tokens * scale))
        if max_total is not None and prompt + output > max_total:
            shrink = max_total / (prompt + output)
            prompt = max(1, int(prompt * shrink))
            output = max(1, min(int(output * shrink), max_total - prompt))
        out.append(LengthPair(prompt, output))
    return out
