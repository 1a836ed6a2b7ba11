"""Weight-only quantization on the trained target: memory, speed and quality per mode, side by side.
Prints figures; never passes or fails.

Per mode (fp32, int8, int4 with groups of 32 and 64, fp8 storage; int8 / fp8 KV cache): weight
bytes as allocated; KV bytes per token; output tokens/s serving 16 and 1 held-out prompts (96 bytes, 64 generated, greedy);
and quality against the fp32 model on held-out text: mean KL divergence of the next-token
distributions (teacher-forced, every position of 16 windows of 256 bytes) and how often the greedy
next token agrees. Beside the measured tokens/s, the simulator's prediction of the same runs from
this CPU's profile of the target (extended with its quantized layers, `gemm_quant`; int4 timed in
groups of 32; and reads of int8 / fp8 KV caches, `kv_gather`) with fp32 activations, as the engine
computes them here.

First, decode speed on the 34.5M-parameter model of bench/engine_throughput.py (random weights;
its fp32 weights, 138 MB, exceed this CPU's L3 cache): decode tokens/s per mode at batch 1 and 16,
measured as (tokens of 65-token runs - tokens of 1-token runs) / the time between them, the modes
interleaved over rounds (best kept), with the kernels each mode's layers chose (engine/quant_kernels.py).

    servecast train-pair            # once
    python bench/quant.py [--pair DIR] [--threads 2] [--speed-rounds 3]
    python bench/quant.py --quick     # a smoke run: a pair trained for seconds into a temporary folder
                                      # (unless --pair names one), the tests' small profile grid
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from app.spec_pair_command import DEFAULT_PAIR
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.policy.config import ModelConfig
from engine.weights import read_safetensors_dir
from calibrate.profiling.plan import ProfileGrid
from calibrate.profiling.profiler import Profiler
from simulator.cost.model import CostModel
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.requests import make_workload

# (label, weight quantization, int4 group size, KV cache dtype)
MODES = [("fp32", None, 128, None), ("int8", "int8", 128, None), ("int4 g32", "int4", 32, None),
         ("int4 g64", "int4", 64, None), ("fp8", "fp8", 128, None), ("w8a8", "w8a8", 128, None),
         ("kv int8", None, 128, "int8"), ("kv fp8", None, 128, "fp8"), ("int8+kv8", "int8", 128, "int8")]


def make(pair: Path, weights: dict, quantization: str | None, group: int, kv: str | None) -> LLMEngine:
    # Prompt logits read the KV cache only for chunks after the first: a small budget makes the
    # quality windows (256 tokens) go through it.
    # No prefix caching: the speed prompts are the quality windows' beginnings, and a cache hit
    # would skip their prefill.
    config = EngineConfig(max_model_len=512, num_blocks=2048, max_num_batched_tokens=64, max_num_seqs=64,
                          quantization=quantization, quant_group_size=group, kv_cache_dtype=kv,
                          enable_prefix_caching=False)
    return LLMEngine(ModelConfig.from_hf(pair / "target"), config, weights)


def tokens_per_s(engine: LLMEngine, prompts: list[list[int]], output: int = 64) -> float:
    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    engine.generate([prompts[0][:8]], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
    started = time.perf_counter()
    outs = engine.generate(prompts, params)
    return sum(len(o.output_token_ids) for o in outs) / (time.perf_counter() - started)


def predicted_tokens_per_s(pair: Path, costs: CostModel, profile: Path, quantization: str | None,
                           kv: str | None, batch: int, output: int = 64) -> float:
    config = SimConfig(model=str(pair / "target" / "config.json"), hardware="cpu-local", profile=str(profile),
                       quant=quantization or "fp32", activation_dtype="fp32", kv_dtype=kv or "auto",
                       num_gpu_blocks=2048, max_num_batched_tokens=64, max_num_seqs=64, max_model_len=512,
                       enable_prefix_caching=False)
    workload = make_workload("bench", [(0.0, 96, output, ()) for _ in range(batch)])
    return simulate(config, workload, cost_model=costs).summary.throughput.output_tokens_per_s


# The 34.5M-parameter model of bench/engine_throughput.py (its defaults).
SPEED_MODEL = dict(model_type="llama", hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                   num_key_value_heads=4, intermediate_size=1408, vocab_size=16384, max_position_embeddings=528)
SPEED_MODES = [("fp32", None, 128), ("int8", "int8", 128), ("int4 g32", "int4", 32), ("w8a8", "w8a8", 128),
               ("fp8", "fp8", 128)]


def decode_tokens_per_s(engine: LLMEngine, batch: int, prompt: int, output: int, seed: int = 0) -> float:
    """Decode tokens/s at a batch: the prompts' prefill (one step) untimed, then `output` steps timed."""
    rng = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=output + 1, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"speed-{seed}-{i}",
                           torch.randint(1, engine.model_config.vocab_size, (prompt,), generator=rng).tolist(), params)
    engine.step()  # every prefill (batch x prompt tokens fit one step's budget) and the first tokens
    started, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    assert steps == output, f"{steps} decode steps, expected {output}: the prefills took more than one step"
    return batch * output / (time.perf_counter() - started)


def speed_table(quick: bool, rounds: int) -> None:
    model = dict(SPEED_MODEL, hidden_size=128, num_hidden_layers=2, intermediate_size=352, vocab_size=2048) \
        if quick else SPEED_MODEL
    batches, prompt, output = ((1, 4), 16, 8) if quick else ((1, 16), 96, 64)
    engines = {}
    for name, quantization, group in SPEED_MODES:
        config = EngineConfig(max_model_len=prompt + output + 8, num_blocks=1024, max_num_seqs=64,
                              max_num_batched_tokens=2048, quantization=quantization, quant_group_size=group,
                              enable_prefix_caching=False)
        engines[name] = LLMEngine.from_config(model, config, seed=0)
    params_m = sum(p.numel() for p in next(iter(engines.values())).model.parameters()) / 1e6
    print(f"decode speed: Llama {params_m:.1f}M params (random weights), prompt {prompt}, {output} tokens decoded, "
          f"{torch.get_num_threads()} threads, best of {rounds} interleaved rounds")
    best = {(name, b): 0.0 for name in engines for b in batches}
    for _ in range(rounds):
        for name, engine in engines.items():
            for b in batches:
                best[name, b] = max(best[name, b], decode_tokens_per_s(engine, b, prompt, output))
    header = "".join(f" {'tok/s b' + str(b):>10} {'x fp32':>6}" for b in batches)
    print(f"{'mode':>9} {'weight MB':>9}{header}  kernels")
    for name, engine in engines.items():
        cells = "".join(f" {best[name, b]:>10.0f} {best[name, b] / best['fp32', b]:>6.2f}" for b in batches)
        kernels = "; ".join(sorted(set(engine.model.quant_kernels().values()))) or "onednn packed fp32"
        print(f"{name:>9} {engine.model.weight_bytes() / 2**20:>9.1f}{cells}  {kernels}", flush=True)
    print()


def prompt_logits(engine: LLMEngine, windows: list[list[int]]) -> torch.Tensor:
    outs = engine.generate(windows, SamplingParams(max_tokens=1, temperature=0.0, return_prompt_logits=True))
    return torch.cat([o.prompt_logits.float() for o in outs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=None, help=f"a trained pair (default {DEFAULT_PAIR})")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--speed-threads", type=int, default=2, help="torch threads of the decode-speed table")
    parser.add_argument("--speed-rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a throwaway pair (unless --pair), the tests' small profile grid, 4 windows "
                             "of 128 bytes, 16 generated tokens")
    args = parser.parse_args()
    grid = ProfileGrid.for_budget(256, 96 + 64 + 16)
    if args.quick:
        from _quick_pair import quick_pair

        args.pair = args.pair or quick_pair()
        grid = ProfileGrid.quick()
    args.pair = args.pair or DEFAULT_PAIR
    if not (args.pair / "pair.json").exists():
        raise SystemExit(f"no trained pair at {args.pair}: run `servecast train-pair` first")
    torch.set_num_threads(args.speed_threads)
    speed_table(args.quick, 1 if args.quick else args.speed_rounds)
    torch.set_num_threads(args.threads)
    weights = read_safetensors_dir(args.pair / "target")
    heldout = (args.pair / "heldout.bin").read_bytes()
    num_windows, window, output = (4, 128, 16) if args.quick else (16, 256, 64)
    step = (len(heldout) - window) // num_windows
    windows = [list(heldout[i * step:i * step + window]) for i in range(num_windows)]
    prompts = [w[:96] for w in windows]
    batches = (num_windows, 1)
    # The target's profile on this CPU (bench/spec_decode.py's, same grid), resumed with its quantized layers.
    profile = args.pair / f"profile-cpu-{args.threads}t.jsonl"
    print(f"profiling (resumes) the target's quantized layers -> {profile}", flush=True)
    grid = replace(grid, weight_quant=("int8", "int4", "fp8", "w8a8"), quant_group_size=32, kv_quant=("int8", "fp8"))
    Profiler(ModelConfig.from_hf(args.pair / "target"), grid=grid).run(profile)
    costs = CostModel.load("cpu-local", profile=str(profile))
    reference = None
    big = f"b{num_windows}"
    print(f"{'mode':>9} {'weight MB':>9} {'x fp32':>6} {'KV B/token':>10} {'tok/s ' + big:>9} {'pred ' + big:>8} "
          f"{'tok/s b1':>8} {'pred b1':>8} {'mean KL':>9} {'greedy agree':>12}")
    for name, quantization, group, kv_dtype in MODES:
        engine = make(args.pair, weights, quantization, group, kv_dtype)
        logits = prompt_logits(engine, windows)
        if reference is None:
            reference, base_bytes = logits, engine.model.weight_bytes()
        log_p, log_q = reference.log_softmax(-1), logits.log_softmax(-1)
        kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
        agree = float((reference.argmax(-1) == logits.argmax(-1)).float().mean())
        kv = engine.config.block_bytes(engine.model_config) // engine.config.block_size
        predicted = [predicted_tokens_per_s(args.pair, costs, profile, quantization, kv_dtype, b, output)
                     for b in batches]
        print(f"{name:>9} {engine.model.weight_bytes() / 2**20:>9.2f} {engine.model.weight_bytes() / base_bytes:>6.2f} "
              f"{kv:>10} {tokens_per_s(engine, prompts, output):>9.0f} {predicted[0]:>8.0f} "
              f"{tokens_per_s(engine, prompts[:1], output):>8.0f} {predicted[1]:>8.0f} {kl:>9.5f} {agree:>12.1%}", flush=True)


if __name__ == "__main__":
    main()
