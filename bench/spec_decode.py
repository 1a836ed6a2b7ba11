"""Speculative decoding on the trained pair: the engine's tokens/s with and without speculation and
the simulator's prediction of the same, side by side. Prints figures; never passes or fails.

For each batch size (requests served together, all arriving at once) and gamma (draft tokens per
verification, 0 = off): the engine serves held-out prompts greedily with the trained draft,
measuring output tokens/s and the draft's acceptance per position; the simulator then predicts the
same run on this device's profiles (cpu-local; the target's and the draft's) from that measured
acceptance. Speedups are relative to gamma = 0 at the same batch size, measured and predicted.

Two predictions: from the operator profiles alone, and calibrated -- each model's framework terms
fitted (fit_framework, calibrate/fitting/device.py) on its forwards as recorded in calibration runs at
other batch sizes (--calibration-batches) on other prompts (calibrate/fitting/spec_steps.py), never on the
runs checked.

    servecast train-pair            # once: trains and saves the pair (a few minutes)
    python bench/spec_decode.py [--pair DIR] [--batches 1,4,16] [--gammas 1,2,4,8] [--repeats 3]
    python bench/spec_decode.py --quick   # a smoke run: a pair trained for seconds into a temporary
                                          # folder (unless --pair names one), the tests' small profile
                                          # grid, batches 1,2, gammas 1,2, one repeat
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from app.spec_pair_command import DEFAULT_PAIR
from calibrate.fitting.device import fit_framework
from calibrate.profiling.plan import ProfileGrid
from calibrate.profiling.profiler import Profiler
from calibrate.fitting.spec_steps import SpecStepLog, draft_observations, record_spec_steps, target_observations
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.policy.config import ModelConfig
from engine.spec_decode import request_acceptance
from engine.weights import read_safetensors_dir
from simulator.catalog.models import load_model
from simulator.cost.model import CostModel
from simulator.cost.profile_format import Profile
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.requests import make_workload

PROMPT, OUTPUT, BLOCKS, BUDGET, BLOCK_SIZE = 96, 64, 1024, 256, 16
SIM_SEEDS = 8


def engine_run(pair: Path, weights: dict, prompts: list[list[int]], gamma: int,
               log: SpecStepLog | None = None) -> tuple[float, dict, int]:
    """Output tokens/s of serving the prompts, the speculation stats, steps; log: record the forwards."""
    spec = dict(speculative_method="draft", num_speculative_tokens=gamma,
                draft_model=str(pair / "draft" / "config.json")) if gamma else {}
    config = EngineConfig(max_model_len=PROMPT + OUTPUT + 16, num_blocks=BLOCKS, max_num_batched_tokens=BUDGET,
                          max_num_seqs=64, **spec)
    engine = LLMEngine(ModelConfig.from_hf(pair / "target"), config, weights["target"],
                       draft_state_dict=weights["draft"] if gamma else None)
    engine.generate([prompts[0][:8]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    if log is not None:
        recorded = record_spec_steps(engine)
    params = SamplingParams(max_tokens=OUTPUT, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    if log is not None:
        log.target += recorded.target
        log.draft += recorded.draft
    stats = {**engine.spec_stats.to_dict(), "request_acceptance": request_acceptance(outs)}
    return sum(len(o.output_token_ids) for o in outs) / seconds, stats, engine.num_steps


def calibrated_models(pair: Path, profiles: dict[str, Path], weights: dict, prompts: list[list[int]],
                      batches: list[int], gammas: list[int]) -> tuple[CostModel, CostModel, int, int]:
    """The target's and the draft's cost models with framework terms fitted on recorded forwards of
    calibration runs (these prompts, these batch sizes, every gamma)."""
    log = SpecStepLog()
    for batch in batches:
        for gamma in gammas:
            engine_run(pair, weights, prompts[:batch], gamma, log)
    models = {}
    for which in ("target", "draft"):
        models[which] = CostModel.load("cpu-local", profile=str(profiles[which]))
    target_spec = load_model(str(pair / "target" / "config.json"))
    draft_spec = load_model(str(pair / "draft" / "config.json"))
    models["target"] = models["target"].with_framework(fit_framework(
        models["target"], Profile.load(profiles["target"]), target_observations(log, target_spec, "fp32", BLOCK_SIZE)))
    models["draft"] = models["draft"].with_framework(fit_framework(
        models["draft"], Profile.load(profiles["draft"]),
        draft_observations(log, draft_spec, "fp32", BLOCK_SIZE, models["draft"])))
    return models["target"], models["draft"], len(log.target), len(log.draft)


def predicted(pair: Path, profile: Path, draft_profile: Path, batch: int, gamma: int, acceptance: Path | None,
              models: tuple[CostModel, CostModel] | None = None) -> float:
    """The simulator's output tokens/s for the same run: with speculation, the mean over SIM_SEEDS
    seeds (which measured request's acceptance each simulated request takes is a draw, and in a
    small batch the slowest request sets the pace)."""
    spec = dict(speculative="draft", num_speculative_tokens=gamma, acceptance_file=str(acceptance),
                draft_model=str(pair / "draft" / "config.json"), draft_profile=str(draft_profile)) if gamma else {}
    workload = make_workload("bench", [(0.0, PROMPT, OUTPUT, ()) for _ in range(batch)])
    target_costs, draft_costs = models or (None, None)
    rates = []
    for seed in range(SIM_SEEDS if gamma else 1):
        config = SimConfig(model=str(pair / "target" / "config.json"), hardware="cpu-local", profile=str(profile),
                           quant="fp32", num_gpu_blocks=BLOCKS, max_num_batched_tokens=BUDGET, max_num_seqs=64,
                           max_model_len=PROMPT + OUTPUT + 16, seed=seed, **spec)
        result = simulate(config, workload, cost_model=target_costs, draft_cost_model=draft_costs)
        rates.append(result.summary.throughput.output_tokens_per_s)
    return statistics.mean(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=None, help=f"a trained pair (default {DEFAULT_PAIR})")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--gammas", default="1,2,4,8")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier timings here)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each gamma, interleaved; the median is kept")
    parser.add_argument("--calibration-batches", default="2,8",
                        help="batch sizes of the calibration runs (other prompts); none: profiles only")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a throwaway pair (unless --pair), small profile grid, batches 1,2, gammas "
                             "1,2, one repeat, calibration at batch 2")
    args = parser.parse_args()
    grid = ProfileGrid.for_budget(BUDGET, PROMPT + OUTPUT + 16)
    if args.quick:
        from _quick_pair import quick_pair

        args.batches, args.gammas, args.repeats, args.calibration_batches = "1,2", "1,2", 1, "2"
        args.pair = args.pair or quick_pair()
        grid = ProfileGrid.quick()
    args.pair = args.pair or DEFAULT_PAIR
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
        Profiler(ModelConfig.from_hf(args.pair / which), grid=grid).run(profiles[which])
    weights = {w: read_safetensors_dir(args.pair / w) for w in ("target", "draft")}
    heldout = (args.pair / "heldout.bin").read_bytes()
    step = (len(heldout) - PROMPT) // max(batches)
    prompts_all = [list(heldout[i * step:i * step + PROMPT]) for i in range(max(batches))]
    profile_models = tuple(CostModel.load("cpu-local", profile=str(profiles[w])) for w in ("target", "draft"))
    calibration_batches = [int(x) for x in args.calibration_batches.split(",") if x]
    models = None
    if calibration_batches:
        # Other prompts than the checked runs': the held-out text's second half.
        offset = len(heldout) // 2
        cal_step = (len(heldout) - offset - PROMPT) // max(calibration_batches)
        cal_prompts = [list(heldout[offset + i * cal_step:offset + i * cal_step + PROMPT])
                       for i in range(max(calibration_batches))]
        *models, n_target, n_draft = calibrated_models(args.pair, profiles, weights, cal_prompts,
                                                       calibration_batches, gammas)
        print(f"calibrated on {n_target} target steps and {n_draft} draft forwards at batch "
              f"{','.join(map(str, calibration_batches))} (other prompts)")
    print(f"{'batch':>5} {'gamma':>5} {'accept/pos':>22} {'measured tok/s':>14} {'speedup':>8} "
          f"{'profiles':>8} {'pred/meas':>9} {'calibrated':>10} {'pred/meas':>9}")
    for batch in batches:
        # Every gamma is served --repeats times, the gammas interleaved, and each keeps its median:
        # this machine's speed drifts over minutes, and a ratio of runs minutes apart would show it.
        rates: dict[int, list[float]] = {g: [] for g in gammas}
        stats: dict[int, dict] = {}
        for _ in range(args.repeats):
            for gamma in gammas:
                rate, stats[gamma], _ = engine_run(args.pair, weights, prompts_all[:batch], gamma)
                rates[gamma].append(rate)
        base = None
        for gamma in gammas:
            rate = statistics.median(rates[gamma])
            acceptance = None
            if gamma:
                acceptance = args.pair / f"acceptance-b{batch}-g{gamma}.json"
                acceptance.write_text(json.dumps(stats[gamma]))
            row = (rate, predicted(args.pair, profiles["target"], profiles["draft"], batch, gamma, acceptance,
                                   profile_models),
                   predicted(args.pair, profiles["target"], profiles["draft"], batch, gamma, acceptance, models)
                   if models else float("nan"))
            base = base or row
            speedups = [r / b for r, b in zip(row, base)]
            accept = ",".join(f"{a:.2f}" for a in stats[gamma]["acceptance_by_position"]) if gamma else "-"
            print(f"{batch:>5} {gamma:>5} {accept:>22} {rate:>14.0f} {speedups[0]:>8.2f} {speedups[1]:>8.2f} "
                  f"{speedups[1] / speedups[0]:>9.2f} {speedups[2]:>10.2f} {speedups[2] / speedups[0]:>9.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
