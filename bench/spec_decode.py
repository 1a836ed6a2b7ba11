"""Speculative decoding on the trained pair: the engine's tokens/s with and without speculation and
the simulator's prediction of the same, side by side. Prints figures; never passes or fails.

For each batch size (requests served together, all arriving at once) and gamma (draft tokens per
verification, 0 = off): the engine serves held-out prompts greedily with the trained draft,
measuring output tokens/s and the draft's acceptance per position; the simulator then predicts the
same run on this device's profiles (cpu-local; the target's and the draft's) from that measured
acceptance. Speedups are relative to gamma = 0 at the same batch size, measured and predicted.

    servecast train-pair            # once: trains and saves the pair (a few minutes)
    python bench/spec_decode.py [--pair DIR] [--batches 1,4,16] [--gammas 1,2,4,8]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from app.spec_pair_command import DEFAULT_PAIR
from calibrate.profile import Profiler, ProfileGrid
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.config import ModelConfig
from engine.weights import read_safetensors_dir
from simulator.run import simulate
from simulator.sim_config import SimConfig
from simulator.workload import make_workload

PROMPT, OUTPUT, BLOCKS, BUDGET = 96, 64, 1024, 256


def engine_run(pair: Path, weights: dict, prompts: list[list[int]], gamma: int) -> tuple[float, dict, int]:
    spec = dict(speculative_method="draft", num_speculative_tokens=gamma,
                draft_model=str(pair / "draft" / "config.json")) if gamma else {}
    config = EngineConfig(max_model_len=PROMPT + OUTPUT + 16, num_blocks=BLOCKS, max_num_batched_tokens=BUDGET,
                          max_num_seqs=64, **spec)
    engine = LLMEngine(ModelConfig.from_hf(pair / "target"), config, weights["target"],
                       draft_state_dict=weights["draft"] if gamma else None)
    engine.generate([prompts[0][:8]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    params = SamplingParams(max_tokens=OUTPUT, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    return sum(len(o.output_token_ids) for o in outs) / seconds, engine.spec_stats.to_dict(), engine.num_steps


def predicted(pair: Path, profile: Path, draft_profile: Path, batch: int, gamma: int, acceptance: Path | None) -> float:
    spec = dict(speculative="draft", num_speculative_tokens=gamma, acceptance_file=str(acceptance),
                draft_model=str(pair / "draft" / "config.json"), draft_profile=str(draft_profile)) if gamma else {}
    config = SimConfig(model=str(pair / "target" / "config.json"), hardware="cpu-local", profile=str(profile),
                       quant="fp32", num_gpu_blocks=BLOCKS, max_num_batched_tokens=BUDGET, max_num_seqs=64,
                       max_model_len=PROMPT + OUTPUT + 16, **spec)
    workload = make_workload("bench", [(0.0, PROMPT, OUTPUT, ()) for _ in range(batch)])
    return simulate(config, workload).summary["throughput"]["output_tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=DEFAULT_PAIR)
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--gammas", default="1,2,4,8")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier timings here)")
    args = parser.parse_args()
    if not (args.pair / "pair.json").exists():
        raise SystemExit(f"no trained pair at {args.pair}: run `servecast train-pair` first")
    torch.set_num_threads(args.threads)
    batches = [int(x) for x in args.batches.split(",")]
    gammas = [0] + [int(x) for x in args.gammas.split(",")]
    profiles = {}
    for which, name in (("target", f"profile-cpu-{args.threads}t.jsonl"),
                        ("draft", f"profile-draft-cpu-{args.threads}t.jsonl")):
        profiles[which] = args.pair / name
        # A profile on hand is resumed: only points it lacks (a newer grid's) are measured.
        print(f"profiling the {which} on this CPU -> {profiles[which]}")
        Profiler(ModelConfig.from_hf(args.pair / which),
                 grid=ProfileGrid.for_budget(BUDGET, PROMPT + OUTPUT + 16)).run(profiles[which])
    weights = {w: read_safetensors_dir(args.pair / w) for w in ("target", "draft")}
    heldout = (args.pair / "heldout.bin").read_bytes()
    step = (len(heldout) - PROMPT) // max(batches)
    prompts_all = [list(heldout[i * step:i * step + PROMPT]) for i in range(max(batches))]
    print(f"{'batch':>5} {'gamma':>5} {'accept/pos':>22} {'measured tok/s':>14} {'speedup':>8} "
          f"{'predicted tok/s':>15} {'speedup':>8} {'pred/meas':>9}")
    for batch in batches:
        base_measured = base_predicted = None
        for gamma in gammas:
            rate, stats, _ = engine_run(args.pair, weights, prompts_all[:batch], gamma)
            acceptance = None
            if gamma:
                acceptance = args.pair / f"acceptance-b{batch}-g{gamma}.json"
                acceptance.write_text(json.dumps(stats))
            pred = predicted(args.pair, profiles["target"], profiles["draft"], batch, gamma, acceptance)
            base_measured, base_predicted = base_measured or rate, base_predicted or pred
            accept = ",".join(f"{a:.2f}" for a in stats["acceptance_by_position"]) if gamma else "-"
            print(f"{batch:>5} {gamma:>5} {accept:>22} {rate:>14.0f} {rate / base_measured:>8.2f} "
                  f"{pred:>15.0f} {pred / base_predicted:>8.2f} {(pred / base_predicted) / (rate / base_measured):>9.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
