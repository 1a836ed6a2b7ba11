"""Held-out accuracy of the cost model (issue 3). Prints figures; never passes or fails.

1. GPU: efficiency curves fitted on the Vidur A100 profiles only, predicting the A40's measured
   GEMMs of the same models: MAPE per operator.
2. CPU: curves fitted on a profile of one tiny model (this machine), predicting a different
   model's operators measured on the same machine: MAPE per operator, over all, time-weighted.
3. Splitwise: Llama-2-70B prefill and decode-step times on A100 / H100 (TP 2/4/8) predicted
   without any profile of those setups, against ../shared/reference/perf_model.csv.

    python bench/cost_model_heldout.py [--shared ../shared] [--keep DIR]
    python bench/cost_model_heldout.py --quick     # a smoke run: part 1 on the phi-2 profiles only,
                                                   # part 2 on the tests' small profile grid
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from calibrate.fitting.curve import HELD_OUT_OPS, fit_gpu_curves, gpu_held_out
from calibrate.fitting.heldout import cpu_held_out, splitwise_check
from calibrate.profiling.plan import ProfileGrid
from calibrate.profiling.profiler import Profiler, profile_side_by_side
from engine.policy.config import ModelConfig

# Two small Llama-architecture models of different widths, head counts and vocabularies.
MODEL_A = dict(model_type="llama", hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
               intermediate_size=688, vocab_size=8192, max_position_embeddings=2048)
MODEL_B = dict(model_type="llama", hidden_size=384, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
               intermediate_size=1024, vocab_size=12000, max_position_embeddings=2048)


def quick_vidur(shared: Path, model: str) -> Path:
    """A stand-in for ../shared holding only one model's Vidur A100 and A40 profiles (links)."""
    folder = Path(tempfile.mkdtemp())
    for sku in ("a100", "a40"):
        link = folder / "profiles" / "vidur" / "compute" / sku / model
        link.parent.mkdir(parents=True)
        link.symlink_to(shared / "profiles" / "vidur" / "compute" / sku / model)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the CPU profiles in this folder (profiles already there are reused)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: part 1 on one model's profiles (phi-2's), part 2's CPU profiles on the "
                             "tests' small grid (seconds, not minutes)")
    args = parser.parse_args()

    print("1. GPU held-out: fit on Vidur A100 (fp16), predict the A40 (MAPE per operator)")
    vidur = quick_vidur(args.shared, "microsoft/phi-2") if args.quick else args.shared
    if args.quick:
        print("   (--quick: the phi-2 profiles only)")
    curves = fit_gpu_curves(vidur)
    held = gpu_held_out(curves, vidur)
    for op in HELD_OUT_OPS:
        print(f"   {op:<14} {held[op]:6.1%}")
    print(f"   {'GEMMs (mean)':<14} {statistics.mean(held[op] for op in HELD_OUT_OPS):6.1%}   target <= 15%")
    others = ", ".join(f"{k} {v:.0%}" for k, v in sorted(held.items()) if k not in HELD_OUT_OPS)
    print(f"   elementwise ops (not a target): {others}")

    print("\n2. CPU held-out: fit on model A's profile, predict model B's operators (this machine)")
    print("   (B's attention at its own head layout; both profiles also hold attention at other head dims)")
    folder = args.keep or Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    models = {"A": MODEL_A, "B": MODEL_B}
    suffix, grid = ("-quick", ProfileGrid.quick()) if args.quick else ("", None)
    paths = {name: folder / f"cpu-local-heldout-model-{name.lower()}{suffix}.jsonl" for name in models}  # resumed if there
    # Side by side (alternating operator groups): the machine's drifts hit both profiles alike.
    done = profile_side_by_side([(Profiler(ModelConfig.from_hf(models[n]), grid=grid), paths[n]) for n in models])
    profiles = dict(zip(models, done))
    for name, config in models.items():
        print(f"   profiled model {name} (hidden {config['hidden_size']}, FFN {config['intermediate_size']}, "
              f"{config['num_attention_heads']}/{config['num_key_value_heads']} heads, vocab {config['vocab_size']}): "
              f"{len(profiles[name].measurements)} points -> {paths[name]}")
    b = ModelConfig.from_hf(MODEL_B)
    result = cpu_held_out(profiles["A"], profiles["B"], (b.num_heads, b.num_kv_heads, b.head_dim))
    for label, r in result.items():
        print(f"   {label:<24} MAPE {r['mape']:6.1%}   n={r['n']:<4} share of B's time {r['time_share']:6.1%}")
    print("   target <= 10%")

    print("\n3. Splitwise Llama-2-70B (perf_model.csv): predicted / measured per setup (median ratio, MAPE,")
    print("   median absolute error). The all-reduce latency is fitted on the A100 decode rows; H100 is held out.")
    rows = splitwise_check(args.shared / "reference" / "perf_model.csv")
    groups = defaultdict(list)
    for r in rows:
        groups[(r["hardware"], r["tp"])].append(r)
    print(f"   {'setup':<16} {'prefill ratio':>13} {'MAPE':>7} {'median':>7} {'decode ratio':>13} {'MAPE':>7} "
          f"{'median':>7}")
    for (hw, tp), rs in groups.items():
        pr = [r["prefill_predicted_s"] / r["prefill_measured_s"] for r in rs]
        dr = [r["decode_predicted_s"] / r["decode_measured_s"] for r in rs]
        print(f"   {hw + ' tp' + str(tp):<16} {statistics.median(pr):13.2f} {statistics.mean(abs(x - 1) for x in pr):7.1%} "
              f"{statistics.median(abs(x - 1) for x in pr):7.1%} {statistics.median(dr):13.2f} "
              f"{statistics.mean(abs(x - 1) for x in dr):7.1%} {statistics.median(abs(x - 1) for x in dr):7.1%}")


if __name__ == "__main__":
    main()
