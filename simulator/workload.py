"""Request workloads. For now: length distributions (prompt, output) sampled from a real trace.

Issue 4 grows this into the trace loaders and synthetic generators of the simulator.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_LENGTHS = PROJECT_ROOT / "traces" / "sharegpt_lengths.csv"


@dataclass(frozen=True)
class LengthPair:
    prompt_tokens: int
    output_tokens: int


def load_length_pairs(path: str | Path = BUNDLED_LENGTHS) -> list[LengthPair]:
    """Read a CSV with prompt/output length columns (ours, or Vidur/etalon's stats files).

    Accepted column names: prompt_tokens/output_tokens or num_prefill_tokens/num_decode_tokens.
    A bad row is an error naming its line, never silently dropped.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no length file at {path}: give a CSV with prompt_tokens,output_tokens columns")
    pairs: list[LengthPair] = []
    with path.open(newline="") as f:
        reader = csv.DictReader(row for row in f if not row.startswith("#"))
        fields = set(reader.fieldnames or ())
        for prompt_col, output_col in (("prompt_tokens", "output_tokens"),
                                       ("num_prefill_tokens", "num_decode_tokens")):
            if {prompt_col, output_col} <= fields:
                break
        else:
            raise ValueError(f"{path}: needs columns prompt_tokens,output_tokens (or num_prefill_tokens,"
                             f"num_decode_tokens); found {sorted(fields)}")
        for row in reader:
            try:
                pair = LengthPair(int(row[prompt_col]), int(row[output_col]))
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{reader.line_num}: lengths must be integers, got "
                                 f"{row[prompt_col]!r}, {row[output_col]!r}") from None
            if pair.prompt_tokens <= 0 or pair.output_tokens <= 0:
                raise ValueError(f"{path}:{reader.line_num}: lengths must be positive, got "
                                 f"{pair.prompt_tokens}, {pair.output_tokens}")
            pairs.append(pair)
    if not pairs:
        raise ValueError(f"{path} holds no rows")
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
