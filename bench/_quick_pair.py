"""A target/draft pair for the benchmarks' --quick runs (bench/spec_decode.py, bench/quant.py): the
architectures of `servecast train-pair`, trained for a few seconds on one small stdlib package into
a temporary folder. Enough to run the benchmarks' code paths end to end; its acceptance and quality
figures mean little (the full runs use the pair `servecast train-pair` saves)."""

from __future__ import annotations

import sysconfig
import tempfile
from pathlib import Path

from calibrate.fitting.spec_pair import PairSpec, train_pair


def quick_pair(target_seconds: float = 2.0, draft_seconds: float = 1.0) -> Path:
    out = Path(tempfile.mkdtemp(prefix="servecast-quick-pair-"))
    corpus = Path(sysconfig.get_paths()["stdlib"]) / "email"  # ~30 files, ~0.4 MB
    # Every 4th file held out: enough held-out text for the benchmarks' prompts and windows.
    spec = PairSpec(target_seconds=target_seconds, draft_seconds=draft_seconds, context=128, heldout_every=4)
    info = train_pair(out, spec, corpus)
    print(f"--quick: trained a throwaway pair for {target_seconds:g} + {draft_seconds:g} s on {corpus} "
          f"(target {info['target']['steps']} steps, loss {info['target']['train_loss']:.2f}; draft "
          f"{info['draft']['steps']} steps, loss {info['draft']['train_loss']:.2f}) -> {out}", flush=True)
    return out
