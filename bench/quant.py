"""Weight-only quantization on the trained target: memory, speed and quality per mode, side by side.
Prints figures; never passes or fails.

Per mode (fp32, int8, int4 with groups of 32 and 64, fp8 storage; int8 / fp8 KV cache): weight
bytes as allocated; KV bytes per token; output tokens/s serving 16 and 1 held-out prompts (96 bytes, 64 generated, greedy);
and quality against the fp32 model on held-out text: mean KL divergence of the next-token
distributions (teacher-forced, every position of 16 windows of 256 bytes) and how often the greedy
next token agrees.

    servecast train-pair            # once
    python bench/quant.py [--pair DIR] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from app.spec_pair_command import DEFAULT_PAIR
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.config import ModelConfig
from engine.weights import read_safetensors_dir

# (label, weight quantization, int4 group size, KV cache dtype)
MODES = [("fp32", None, 128, None), ("int8", "int8", 128, None), ("int4 g32", "int4", 32, None),
         ("int4 g64", "int4", 64, None), ("fp8", "fp8", 128, None), ("kv int8", None, 128, "int8"),
         ("kv fp8", None, 128, "fp8"), ("int8+kv8", "int8", 128, "int8")]


def make(pair: Path, weights: dict, quantization: str | None, group: int, kv: str | None) -> LLMEngine:
    # Prompt logits read the KV cache only for chunks after the first: a small budget makes the
    # quality windows (256 tokens) go through it.
    config = EngineConfig(max_model_len=512, num_blocks=2048, max_num_batched_tokens=64, max_num_seqs=64,
                          quantization=quantization, quant_group_size=group, kv_cache_dtype=kv)
    return LLMEngine(ModelConfig.from_hf(pair / "target"), config, weights)


def tokens_per_s(engine: LLMEngine, prompts: list[list[int]]) -> float:
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    engine.generate([prompts[0][:8]], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
    started = time.perf_counter()
    outs = engine.generate(prompts, params)
    return sum(len(o.output_token_ids) for o in outs) / (time.perf_counter() - started)


def prompt_logits(engine: LLMEngine, windows: list[list[int]]) -> torch.Tensor:
    outs = engine.generate(windows, SamplingParams(max_tokens=1, temperature=0.0, return_prompt_logits=True))
    return torch.cat([o.prompt_logits.float() for o in outs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=DEFAULT_PAIR)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not (args.pair / "pair.json").exists():
        raise SystemExit(f"no trained pair at {args.pair}: run `servecast train-pair` first")
    torch.set_num_threads(args.threads)
    weights = read_safetensors_dir(args.pair / "target")
    heldout = (args.pair / "heldout.bin").read_bytes()
    step = (len(heldout) - 256) // 16
    windows = [list(heldout[i * step:i * step + 256]) for i in range(16)]
    prompts = [w[:96] for w in windows]
    reference = None
    print(f"{'mode':>9} {'weight MB':>9} {'x fp32':>6} {'KV B/token':>10} {'tok/s b16':>9} {'tok/s b1':>8} "
          f"{'mean KL':>9} {'greedy agree':>12}")
    for name, quantization, group, kv_dtype in MODES:
        engine = make(args.pair, weights, quantization, group, kv_dtype)
        logits = prompt_logits(engine, windows)
        if reference is None:
            reference, base_bytes = logits, engine.model.weight_bytes()
        log_p, log_q = reference.log_softmax(-1), logits.log_softmax(-1)
        kl = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
        agree = float((reference.argmax(-1) == logits.argmax(-1)).float().mean())
        kv = engine.config.block_bytes(engine.model_config) // engine.config.block_size
        print(f"{name:>9} {engine.model.weight_bytes() / 2**20:>9.2f} {engine.model.weight_bytes() / base_bytes:>6.2f} "
              f"{kv:>10} {tokens_per_s(engine, prompts):>9.0f} {tokens_per_s(engine, prompts[:1]):>8.0f} "
              f"{kl:>9.5f} {agree:>12.1%}", flush=True)


if __name__ == "__main__":
    main()
