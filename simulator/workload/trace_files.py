"""Readers of real request traces. No torch.

Formats (detected from the file's extension and header):

* Azure LLM inference CSV      TIMESTAMP, ContextTokens, GeneratedTokens (wall-clock timestamps)
* Vidur / Splitwise CSV        arrived_at, num_prefill_tokens, num_decode_tokens (seconds)
* Mooncake JSON Lines          timestamp (ms), input_length, output_length, hash_ids (512-token blocks)
* length-only CSV              num_prefill_tokens, num_decode_tokens (Vidur / etalon stats files) or
                               prompt_tokens, output_tokens: arrivals come from an arrival process
                               (simulator/workload/synthetic.py), so these need a rate

In CSV files, whole lines starting with '#' are comments (the bundled traces/ files open with one).

Every bad row is reported with its line number and the reason. By default the first bad rows
fail the load; with skip_bad the workload keeps the good rows and lists the skipped ones in
`Workload.skipped`, so nothing is dropped silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from simulator.workload.requests import Workload, WorkloadError, csv_dict_reader, make_workload

MOONCAKE_BLOCK_TOKENS = 512
_SHOWN_ERRORS = 5

AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VIDUR = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
LENGTH_COLUMNS = (("num_prefill_tokens", "num_decode_tokens"), ("prompt_tokens", "output_tokens"))
ACCEPTED_COLUMNS = (f"the header (the first line not starting with '#') needs one of: Azure ({','.join(AZURE)}), "
                    f"Vidur/Splitwise ({','.join(VIDUR)}), or lengths only with a rate= "
                    f"({' or '.join(','.join(c) for c in LENGTH_COLUMNS)})")


class _Rows:
    """Collects good rows and bad-row reasons of one file."""

    def __init__(self, path: Path, skip_bad: bool) -> None:
        self.path, self.skip_bad = path, skip_bad
        self.rows: list[tuple[float, int, int, tuple[int, ...]]] = []
        self.bad: list[str] = []

    def bad_row(self, line: int, reason: str) -> None:
        self.bad.append(f"{self.path.name}:{line}: {reason}")

    def check(self) -> None:
        """Raise with the bad rows, unless they are to be skipped."""
        if self.bad and not self.skip_bad:
            shown = "; ".join(self.bad[:_SHOWN_ERRORS])
            more = f" (and {len(self.bad) - _SHOWN_ERRORS} more)" if len(self.bad) > _SHOWN_ERRORS else ""
            raise WorkloadError(f"{len(self.bad)} bad row(s) in {self.path}: {shown}{more}. Fix the rows, or "
                                "add skip_bad=1 to the trace spec to skip them (they are then listed)")

    def workload(self, segment_tokens: int = 0) -> Workload:
        self.check()
        if not self.rows:
            raise WorkloadError(f"{self.path} holds no usable requests")
        w = make_workload(self.path.stem, self.rows, segment_tokens)
        w.skipped = list(self.bad)
        return w


def _positive_int(value, what: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a whole number, got {value!r}") from None
    if number != int(number):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    if number < 1:
        raise ValueError(f"{what} must be at least 1, got {value!r}")
    return int(number)


def _time(value, what: str) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not t >= 0 or t == float("inf"):
        raise ValueError(f"{what} must be a finite time >= 0, got {value!r}")
    return t


def _azure_time(value: str) -> float:
    """'2023-11-16 18:17:03.9799600' (7 fractional digits, no zone) -> POSIX seconds (as UTC)."""
    main, _, fraction = (value or "").strip().partition(".")
    try:
        t = datetime.strptime(main, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ValueError(f"TIMESTAMP must look like 2023-11-16 18:17:03.98, got {value!r}") from None
    if fraction and not fraction.isdigit():
        raise ValueError(f"TIMESTAMP has a bad fraction of a second: {value!r}")
    return t.timestamp() + (float("0." + fraction) if fraction else 0.0)


@dataclass
class LengthRows:
    """A length-only file: (prompt, output) pairs, and the bad rows skipped on request."""

    pairs: list[tuple[int, int]]
    skipped: list[str]


def read_csv_trace(path: Path, skip_bad: bool = False) -> tuple[Workload | None, LengthRows | None]:
    """A timed CSV trace -> (workload, None); a length-only CSV -> (None, its length rows)."""
    rows = _Rows(path, skip_bad)
    with path.open(newline="") as f:
        reader = csv_dict_reader(f)
        fields = set(reader.fieldnames or ())
        if set(AZURE) <= fields:
            columns, parse_time = AZURE, _azure_time
        elif set(VIDUR) <= fields:
            columns, parse_time = VIDUR, lambda v: _time(v, "arrived_at")
        else:
            lengths = next((c for c in LENGTH_COLUMNS if set(c) <= fields), None)
            if lengths is None:
                raise WorkloadError(f"{path}: unknown CSV trace columns {sorted(fields)}; {ACCEPTED_COLUMNS}")
            pairs = []
            for row in reader:
                try:
                    pairs.append((_positive_int(row[lengths[0]], lengths[0]), _positive_int(row[lengths[1]], lengths[1])))
                except ValueError as exc:
                    rows.bad_row(reader.line_num, str(exc))
            rows.check()
            if not pairs:
                raise WorkloadError(f"{path} holds no usable requests")
            return None, LengthRows(pairs, list(rows.bad))
        time_col, prompt_col, output_col = columns
        for row in reader:
            try:
                rows.rows.append((parse_time(row[time_col]), _positive_int(row[prompt_col], prompt_col),
                                  _positive_int(row[output_col], output_col), ()))
            except ValueError as exc:
                rows.bad_row(reader.line_num, str(exc))
    return rows.workload().from_zero(), None


def read_mooncake(path: Path, skip_bad: bool = False) -> Workload:
    rows = _Rows(path, skip_bad)
    with path.open() as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if not isinstance(raw, dict):
                    raise ValueError("each line must be a JSON object")
                missing = [k for k in ("timestamp", "input_length", "output_length") if k not in raw]
                if missing:
                    raise ValueError(f"missing {', '.join(missing)}")
                prompt = _positive_int(raw["input_length"], "input_length")
                hash_ids = raw.get("hash_ids") or []
                if not isinstance(hash_ids, list) or not all(isinstance(h, int) and h >= 0 for h in hash_ids):
                    raise ValueError("hash_ids must be a list of non-negative integers")
                if len(hash_ids) > -(-prompt // MOONCAKE_BLOCK_TOKENS):
                    raise ValueError(f"{len(hash_ids)} hash_ids cover more than input_length={prompt} tokens "
                                     f"in {MOONCAKE_BLOCK_TOKENS}-token blocks")
                rows.rows.append((_time(raw["timestamp"], "timestamp") / 1000.0, prompt,
                                  _positive_int(raw["output_length"], "output_length"), tuple(hash_ids)))
            except json.JSONDecodeError as exc:
                rows.bad_row(line_no, f"not valid JSON ({exc.msg})")
            except ValueError as exc:
                rows.bad_row(line_no, str(exc))
    return rows.workload(MOONCAKE_BLOCK_TOKENS).from_zero()


def read_trace(path: str | Path, skip_bad: bool = False) -> tuple[Workload | None, LengthRows | None]:
    """(workload, None) for a timed trace; (None, length rows) for a length-only file."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"no trace file at {path}: give a CSV (Azure, Vidur/Splitwise, lengths) or a "
                            "Mooncake JSONL file, or a synthetic:... spec")
    if path.suffix in (".jsonl", ".json"):
        return read_mooncake(path, skip_bad), None
    if path.suffix == ".csv":
        return read_csv_trace(path, skip_bad)
    raise WorkloadError(f"{path}: unknown trace format {path.suffix!r}; use .csv or .jsonl")
