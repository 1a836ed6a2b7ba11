"""Context parallelism on this CPU: the engine's prefill time of one long prompt at CP=1 and CP=2
(two processes over gloo, ring attention, the same cores split between them) beside the
simulator's prediction of both from this device's profiles -- one of the whole model on every core
(CP=1), one on half the cores with the ring's hop and the decode all-reduce timed across two
processes (CP=2). Prints figures and ratios; never passes or fails.

    python bench/context_parallel.py [--prompts 1024,2048,4096] [--repeats 2]
    python bench/context_parallel.py --quick    # a smoke run: a narrow model, the tests' small
                                                # profile grid (in a temporary folder), one prompt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch

from calibrate.profiling.plan import ProfileGrid
from calibrate.profiling.profiler import Profiler
from engine import EngineConfig, LLMEngine, ModelConfig, SamplingParams
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.requests import make_workload

CACHE = Path.home() / ".cache" / "servecast" / "cp-bench"
# Wide enough that a step's GEMMs, not the framework, carry most of its time on this CPU.
ARCH = dict(model_type="llama", hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
            num_key_value_heads=8, intermediate_size=2816, vocab_size=8192, max_position_embeddings=8192)
QUICK_ARCH = dict(ARCH, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=512, vocab_size=2048, max_position_embeddings=1024)
BLOCK, BUDGET = 16, 512  # prompts are prefilled in chunks of BUDGET tokens


def engine_config(cp: int, prompt: int) -> EngineConfig:
    # The same block manager at both sizes: CP=2's block is 2 x BLOCK / 2 positions.
    return EngineConfig(block_size=BLOCK // cp, context_parallel_size=cp, num_blocks=-(-prompt // BLOCK) + 4,
                        max_num_batched_tokens=BUDGET, max_model_len=prompt + 8, max_num_seqs=4)


def engine_ttft(config: ModelConfig, cp: int, prompt: int, repeats: int) -> list[float]:
    """Seconds from a lone long prompt's first schedule to its first token, `repeats` times."""
    engine = LLMEngine(config, engine_config(cp, prompt), random_seed=0)
    try:
        engine.generate([[1, 2, 3, 4] * 8], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
        times = []
        for r in range(repeats):
            gen = torch.Generator().manual_seed(r)
            tokens = torch.randint(0, config.vocab_size, (prompt,), generator=gen).tolist()
            out = engine.generate([tokens], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))[0]
            times.append(out.first_token_time - out.first_scheduled_time)
        return times
    finally:
        engine.close()


def predicted_ttft(model_path: Path, profile: Path, cp: int, prompt: int) -> float:
    e = engine_config(cp, prompt)
    config = SimConfig(model=str(model_path), hardware="cpu-local", profile=str(profile), cp=cp, quant="fp32",
                       block_size=e.block_size, num_gpu_blocks=e.num_blocks, max_num_batched_tokens=BUDGET,
                       max_model_len=e.max_model_len, max_num_seqs=e.max_num_seqs)
    workload = make_workload("bench", [(0.0, prompt, 1, ())])
    return simulate(config, workload).summary.ttft_s.mean  # a lone request: scheduled on arrival


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="1024,2048,4096")
    parser.add_argument("--repeats", type=int, default=2, help="prompts of each length per engine; medians kept")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a narrow 2-layer model, the tests' small profile grid, one 512-token prompt")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.repeats = "512", 1
    arch, cache = (QUICK_ARCH, Path(tempfile.mkdtemp())) if args.quick else (ARCH, CACHE)
    prompts = [int(x) for x in args.prompts.split(",")]
    grid = ProfileGrid.quick() if args.quick else ProfileGrid.for_budget(BUDGET, max(prompts))
    if not args.quick:  # the ring's hop at the contexts of these prompts
        grid = ProfileGrid(**{**grid.__dict__, "kv_gather_tokens": tuple(sorted({64, 256, 1024, *prompts}))})
    cores = os.cpu_count() or 1
    cache.mkdir(parents=True, exist_ok=True)
    model_path = cache / "config.json"
    model_path.write_text(json.dumps(arch))
    config = ModelConfig.from_hf(arch)
    # CP=1 runs on every core; each of the CP=2 ranks on half of them (the engine's workers take
    # cores // 2; rank 0 is this process, set to as many).
    threads = {1: cores, 2: max(1, cores // 2)}
    profiles = {}
    for cp in (1, 2):
        torch.set_num_threads(threads[cp])
        profiles[cp] = cache / f"profile-cp{cp}-{threads[cp]}t.jsonl"
        print(f"profiling (resumes) CP={cp}, {threads[cp]} thread(s) per rank -> {profiles[cp]}", flush=True)
        Profiler(config, grid=grid, cp=cp).run(profiles[cp])
    print(f"{'prompt':>6} {'CP1 s':>7} {'CP2 s':>7} {'CP2/CP1':>8} {'pred CP1':>9} {'pred CP2':>9} "
          f"{'CP2/CP1':>8} {'pred/meas CP1':>13} {'CP2':>5}")
    for prompt in prompts:
        measured = {}
        for cp in (1, 2):
            torch.set_num_threads(threads[cp])
            measured[cp] = statistics.median(engine_ttft(config, cp, prompt, args.repeats))
        predicted = {cp: predicted_ttft(model_path, profiles[cp], cp, prompt) for cp in (1, 2)}
        m, p = measured[2] / measured[1], predicted[2] / predicted[1]
        print(f"{prompt:>6} {measured[1]:>7.3f} {measured[2]:>7.3f} {m:>8.2f} {predicted[1]:>9.3f} "
              f"{predicted[2]:>9.3f} {p:>8.2f} {predicted[1] / measured[1]:>13.2f} "
              f"{predicted[2] / measured[2]:>5.2f}", flush=True)


if __name__ == "__main__":
    main()
