"""Splitwise's measured Llama-2-70B step times (../shared/reference/perf_model.csv). No torch."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

HARDWARE_IDS = {"a100-80gb": "a100-80gb", "h100-80gb": "h100-sxm"}


def splitwise_rows(perf_model_csv: Path) -> list[dict]:
    """Llama-2-70B rows of perf_model.csv on A100 / H100, repeated runs collapsed to medians."""
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    with perf_model_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["model"] != "llama2-70b" or row["hardware"] not in HARDWARE_IDS:
                continue
            groups[(row["hardware"], int(row["tensor_parallel"]), int(row["prompt_size"]), int(row["batch_size"]),
                    int(row["token_size"]))].append((float(row["prompt_time"]), float(row["token_time"])))
    return [{"hardware": hw, "tp": tp, "prompt": prompt, "batch": batch, "output": out_tokens,
             "prefill_measured_s": statistics.median(v[0] for v in values) / 1e3,
             "decode_measured_s": statistics.median(v[1] for v in values) / 1e3}
            for (hw, tp, prompt, batch, out_tokens), values in sorted(groups.items())]
