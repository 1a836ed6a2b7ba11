"""Tensor parallelism on this CPU: the engine's decode tokens/s at TP=1 and TP=2 (two processes over
gloo, the same cores split between them) and the simulator's prediction of both from this device's
profiles -- one of the whole model (TP=1), one of a rank's shard with all-reduces timed across two
processes (TP=2). Prints figures and ratios; never passes or fails.

    python bench/tensor_parallel.py [--batches 1,4,16] [--repeats 3]
    python bench/tensor_parallel.py --quick    # a smoke run: a narrow model, the tests' small profile
                                               # grid (in a temporary folder), batch 2, one repeat
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from calibrate.profiling.plan import ProfileGrid
from calibrate.profiling.profiler import Profiler
from engine import EngineConfig, LLMEngine, ModelConfig, SamplingParams
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.requests import make_workload

CACHE = Path.home() / ".cache" / "servecast" / "tp-bench"
# Wide enough that a step's GEMMs, not the framework, carry most of its time on this CPU.
ARCH = dict(model_type="llama", hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
            num_key_value_heads=8, intermediate_size=2816, vocab_size=8192, max_position_embeddings=512)
QUICK_ARCH = dict(ARCH, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=512, vocab_size=2048)
PROMPT, OUTPUT, BLOCKS, BUDGET = 64, 32, 512, 256


def engine_rate(config: ModelConfig, tp: int, batch: int) -> float:
    engine = LLMEngine(config, EngineConfig(max_model_len=PROMPT + OUTPUT + 16, num_blocks=BLOCKS,
                                            max_num_batched_tokens=BUDGET, tensor_parallel_size=tp), random_seed=0)
    try:
        engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
        gen = torch.Generator().manual_seed(batch)
        prompts = torch.randint(0, config.vocab_size, (batch, PROMPT), generator=gen).tolist()
        params = SamplingParams(max_tokens=OUTPUT, temperature=0.0, ignore_eos=True)
        started = time.perf_counter()
        outputs = engine.generate(prompts, params)
        return sum(len(o.output_token_ids) for o in outputs) / (time.perf_counter() - started)
    finally:
        engine.close()


def predicted_rate(model_path: Path, profile: Path, tp: int, batch: int) -> float:
    config = SimConfig(model=str(model_path), hardware="cpu-local", profile=str(profile), tp=tp, quant="fp32",
                       num_gpu_blocks=BLOCKS, max_num_batched_tokens=BUDGET, max_model_len=PROMPT + OUTPUT + 16)
    workload = make_workload("bench", [(0.0, PROMPT, OUTPUT, ()) for _ in range(batch)])
    return simulate(config, workload).summary.throughput.output_tokens_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each setting; medians kept")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a narrow 2-layer model, the tests' small profile grid, batch 2, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.repeats = "2", 1
    arch, cache = (QUICK_ARCH, Path(tempfile.mkdtemp())) if args.quick else (ARCH, CACHE)
    grid = ProfileGrid.quick() if args.quick else ProfileGrid.for_budget(BUDGET, PROMPT + OUTPUT + 16)
    batches = [int(x) for x in args.batches.split(",")]
    cores = os.cpu_count() or 1
    cache.mkdir(parents=True, exist_ok=True)
    model_path = cache / "config.json"
    model_path.write_text(json.dumps(arch))
    config = ModelConfig.from_hf(arch)
    # TP=1 runs on every core; each of the TP=2 ranks on half of them (the engine's workers take
    # cores // 2; rank 0 is this process).
    threads = {1: cores, 2: max(1, cores // 2)}
    profiles = {}
    for tp in (1, 2):
        torch.set_num_threads(threads[tp])
        profiles[tp] = cache / f"profile-tp{tp}-{threads[tp]}t.jsonl"
        print(f"profiling (resumes) TP={tp}, {threads[tp]} thread(s) per rank -> {profiles[tp]}", flush=True)
        Profiler(config, grid=grid, tp=tp).run(profiles[tp])
    print(f"{'batch':>5} {'TP1 tok/s':>10} {'TP2 tok/s':>10} {'TP2/TP1':>8} {'pred TP1':>9} {'pred TP2':>9} "
          f"{'TP2/TP1':>8} {'pred/meas':>9}")
    for batch in batches:
        rates: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.repeats):  # interleaved: this machine's speed drifts over minutes
            for tp in (1, 2):
                torch.set_num_threads(threads[tp])
                rates[tp].append(engine_rate(config, tp, batch))
        measured = {tp: statistics.median(r) for tp, r in rates.items()}
        predicted = {tp: predicted_rate(model_path, profiles[tp], tp, batch) for tp in (1, 2)}
        m, p = measured[2] / measured[1], predicted[2] / predicted[1]
        print(f"{batch:>5} {measured[1]:>10.0f} {measured[2]:>10.0f} {m:>8.2f} {predicted[1]:>9.0f} "
              f"{predicted[2]:>9.0f} {p:>8.2f} {p / m:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
