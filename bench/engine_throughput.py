"""Engine throughput vs transformers: static padded batches and transformers' continuous batching.

The same model and weights, the same requests (ShareGPT lengths from traces/sharegpt_lengths.csv,
scaled to this machine), greedy decoding with fixed output lengths, run side by side in one
process. Prints output tokens/s of each, the ratios, and the engine's achieved fraction of this
machine's measured fp32 matmul peak. Not a test: figures only.

    python bench/engine_throughput.py [--num-requests 64] [--length-scale 0.125] ...
    python bench/engine_throughput.py --quick     # the same runs on a tiny model and 8 requests, once
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import time

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from engine import EngineConfig, LLMEngine, SamplingParams
from simulator.workload.requests import load_length_pairs, sample_lengths


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--length-scale", type=float, default=1 / 8)
    p.add_argument("--max-total-tokens", type=int, default=512)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1408)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--static-batch-sizes", default="8,16,32,64",
                   help="static batch sizes to run; the best of them is the baseline")
    p.add_argument("--rounds", type=int, default=2, help="run every system this many times, interleaved; keep the best")
    p.add_argument("--skip-continuous", action="store_true", help="skip transformers' generate_batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: a tiny model, 8 short requests, one round (the sizes above are overridden)")
    args = p.parse_args()
    if args.quick:
        args.num_requests, args.length_scale, args.max_total_tokens = 8, 1 / 32, 128
        args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, args.vocab = 128, 2, 4, 2, 352, 2048
        args.max_num_seqs, args.max_num_batched_tokens, args.static_batch_sizes, args.rounds = 8, 256, "4,8", 1
    return args


def matmul_peak_flops(sizes=(256, 512, 1024, 2048), repeats: int = 10) -> tuple[float, int]:
    """The best fp32 torch.mm rate over square sizes (FLOP/s) and the size that reached it."""
    best_rate, best_size = 0.0, 0
    for size in sizes:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)
        for _ in range(repeats):
            t = time.perf_counter()
            torch.mm(a, b)
            rate = 2 * size**3 / (time.perf_counter() - t)
            if rate > best_rate:
                best_rate, best_size = rate, size
    return best_rate, best_size


def model_flops(config: LlamaConfig, prompts: list[list[int]], outputs: list[int]) -> float:
    """Forward FLOPs of all computed tokens: GEMMs (2 x weights) + attention (QK^T and PV) + LM head."""
    h, layers = config.hidden_size, config.num_hidden_layers
    head_dim = h // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    per_token_gemm = 2 * layers * (h * (q + 2 * kv) + q * h + 3 * h * config.intermediate_size)
    total = 0.0
    for prompt, n_out in zip(prompts, outputs):
        tokens = len(prompt) + n_out - 1
        total += tokens * per_token_gemm
        # Token at position i attends to i+1 keys: 4 * q_size FLOPs per key per layer.
        total += 4 * q * layers * tokens * (tokens + 1) / 2
        total += n_out * 2 * h * config.vocab_size
    return total


def run_engine(model, args, prompts, lengths) -> tuple[float, list[list[int]]]:
    engine = LLMEngine.from_hf(model, EngineConfig(block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                                                   max_num_batched_tokens=args.max_num_batched_tokens,
                                                   max_model_len=args.max_total_tokens + 16))
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    # Warm-up on prompts of the same lengths but other tokens (each id shifted by one): the timed
    # run then finds none of its prefixes in the engine's prefix cache, as if it had been emptied.
    vocab = model.config.vocab_size
    engine.generate([[(t + 1) % vocab for t in p] for p in prompts[:4]], params[:4])
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    return time.perf_counter() - t, [o.output_token_ids for o in outs]


@torch.inference_mode()
def run_static(model, batch_size, prompts, lengths) -> float:
    """Classic static batching: fixed batches in arrival order, prompts left-padded, each batch
    decoding until its longest request is done."""
    def batch_generate(batch_prompts, batch_lengths):
        width = max(len(p) for p in batch_prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch_prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch_prompts])
        model.generate(ids, attention_mask=mask, max_new_tokens=max(batch_lengths), min_new_tokens=None,
                       do_sample=False, eos_token_id=None, pad_token_id=0)

    batch_generate(prompts[:2], [2, 2])  # warm-up
    t = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch_generate(prompts[i:i + batch_size], lengths[i:i + batch_size])
    return time.perf_counter() - t


@torch.inference_mode()
def run_transformers_continuous(model, args, prompts, lengths) -> tuple[float, list[list[int]]]:
    from transformers import ContinuousBatchingConfig

    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(lengths), eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=args.block_size, max_batch_tokens=args.max_num_batched_tokens,
                                  num_blocks=args.max_num_seqs * (args.max_total_tokens // args.block_size + 2))
    with model.continuous_batching_context_manager(generation_config=gen, continuous_batching_config=cb,
                                                   block=True, timeout=30) as manager:
        def serve(batch_prompts, batch_lengths):
            ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(batch_prompts, batch_lengths)]
            results = {}
            while len(results) < len(ids):
                r = manager.get_result(timeout=1)
                if r is not None:
                    results[r.request_id] = r.generated_tokens
            return [results[i] for i in ids]

        serve(prompts[:4], [4] * 4)  # warm-up
        t = time.perf_counter()
        outs = serve(prompts, lengths)
        return time.perf_counter() - t, outs


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, intermediate_size=args.intermediate,
                         vocab_size=args.vocab, max_position_embeddings=args.max_total_tokens + 16)
    model = LlamaForCausalLM(config).eval()
    pairs = sample_lengths(load_length_pairs(), args.num_requests, args.seed, args.length_scale, args.max_total_tokens)
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(args.vocab) for _ in range(p.prompt_tokens)] for p in pairs]
    lengths = [p.output_tokens for p in pairs]
    useful = sum(lengths)
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"machine: {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    print(f"model: Llama {params_m:.1f}M params (hidden {args.hidden}, {args.layers} layers, "
          f"{args.heads}/{args.kv_heads} heads, vocab {args.vocab}), float32")
    print(f"requests: {len(prompts)}, prompt tokens mean {statistics.mean(len(p) for p in prompts):.0f} "
          f"(max {max(len(p) for p in prompts)}), output tokens mean {statistics.mean(lengths):.0f} "
          f"(max {max(lengths)}), ShareGPT lengths x {args.length_scale:g}")

    peak, peak_size = matmul_peak_flops(*(((256, 512), 3) if args.quick else ()))
    static_sizes = [int(b) for b in args.static_batch_sizes.split(",")]
    best: dict[str, float] = {}
    engine_out = cb_out = None
    for _ in range(args.rounds):  # interleaved rounds: machine noise hits every system alike
        seconds, engine_out = run_engine(model, args, prompts, lengths)
        best["servecast engine"] = min(best.get("servecast engine", float("inf")), seconds)
        for b in static_sizes:
            name = f"transformers generate, static batches of {b}"
            best[name] = min(best.get(name, float("inf")), run_static(model, b, prompts, lengths))
        if not args.skip_continuous:
            seconds, cb_out = run_transformers_continuous(model, args, prompts, lengths)
            name = "transformers generate_batch (continuous)"
            best[name] = min(best.get(name, float("inf")), seconds)

    engine_s = best["servecast engine"]
    static_best = min(v for k, v in best.items() if "static" in k)
    print(f"\nbest of {args.rounds} interleaved rounds")
    print(f"{'system':<48} {'wall s':>8} {'out tok/s':>10} {'engine x':>9}")
    for name, seconds in best.items():
        print(f"{name:<48} {seconds:8.2f} {useful / seconds:10.1f} {seconds / engine_s:9.2f}")
    print(f"\nengine vs best static batching: {static_best / engine_s:.2f}x")
    if "transformers generate_batch (continuous)" in best:
        print(f"engine vs transformers continuous batching: {best['transformers generate_batch (continuous)'] / engine_s:.2f}x")
    achieved = model_flops(config, prompts, lengths) / engine_s
    print(f"\nengine: {achieved / 1e9:.1f} GFLOP/s of model math = {achieved / peak:.1%} of this machine's "
          f"measured fp32 matmul peak ({peak / 1e9:.1f} GFLOP/s, torch.mm {peak_size}^3)")
    if cb_out is not None:
        same = sum(a == b for a, b in zip(engine_out, cb_out))
        print(f"greedy outputs identical to transformers' continuous batching: {same}/{len(prompts)} requests")


if __name__ == "__main__":
    main()
