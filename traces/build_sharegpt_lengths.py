"""Build traces/sharegpt_lengths.csv: a seeded sample of (prompt, output) lengths from ShareGPT.

Source: ../shared/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv (etalon, Apache-2.0;
Llama-2 tokenizer lengths). Run from the project root:  python traces/build_sharegpt_lengths.py
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT.parent / "shared" / "traces" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
TARGET = ROOT / "traces" / "sharegpt_lengths.csv"
NUM_ROWS = 2000
SEED = 2024


def main() -> None:
    with SOURCE.open(newline="") as f:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in csv.DictReader(f)]
    sample = random.Random(SEED).sample(rows, NUM_ROWS)
    with TARGET.open("w", newline="") as f:
        f.write(f"# {NUM_ROWS} rows sampled (seed {SEED}) from {SOURCE.name} by traces/{Path(__file__).name}\n")
        writer = csv.writer(f)
        writer.writerow(["prompt_tokens", "output_tokens"])
        writer.writerows(sample)
    print(f"wrote {TARGET} ({NUM_ROWS} rows of {len(rows)})")


if __name__ == "__main__":
    main()
