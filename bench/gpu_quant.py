"""Weight-only and KV-cache quantization of a real-size model on a CUDA GPU: memory as allocated and
decode speed per mode, beside the simulator's prediction from a profile of the same GPU.
Prints figures; never passes or fails.

Random weights (speed and bytes do not depend on the values; quality needs a trained model, which
this offline project has only at CPU scale -- bench/quant.py). Per mode: weight GB as allocated, KV
bytes per token, output tokens/s serving 16 and 1 requests (128 random prompt tokens, 64 generated,
greedy), and the simulator's prediction of the same runs from the profile (`servecast profile
--device cuda --quant int8,int4,fp8 --kv-quant int8,fp8 --hardware H`).

    python bench/gpu_quant.py --profile gpu-out/h200-llama-3.1-8b-bf16.jsonl [--hardware h200]
    python bench/gpu_quant.py --quick [--profile P]   # a smoke run: a 2-layer model, its own quick
        # profile (unless --profile), batches 4 and 1, 32 prompt tokens and 16 generated; where
        # there is no CUDA, it says so and runs on the CPU (float32, cpu-local) instead
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from calibrate.profiling.plan import ProfileGrid
from calibrate.profiling.profiler import Profiler
from engine import EngineConfig, LLMEngine, ModelConfig, SamplingParams
from engine.policy.dtypes import canonical_dtype
from simulator.catalog.models import model_config_path
from simulator.cost.model import CostModel
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.requests import make_workload

# (label, weight quantization, KV cache dtype)
MODES = [("float", None, None), ("int8", "int8", None), ("int4 g128", "int4", None), ("fp8", "fp8", None),
         ("kv int8", None, "int8"), ("kv fp8", None, "fp8")]
PROMPT, OUTPUT = 128, 64
# --quick: a narrow 2-layer Llama (random weights too).
QUICK_ARCH = dict(model_type="llama", hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=512, vocab_size=2048, max_position_embeddings=1024)


def engine_for(model: str, device: str, dtype: str, quantization: str | None, kv: str | None) -> LLMEngine:
    config = EngineConfig(device=device, dtype=dtype, max_model_len=512, num_blocks=1024,
                          max_num_batched_tokens=2048, max_num_seqs=64, quantization=quantization,
                          quant_group_size=128, kv_cache_dtype=kv, enable_prefix_caching=False)
    return LLMEngine.from_config(model_config_path(model), config)


def tokens_per_s(engine: LLMEngine, batch: int, prompt: int = PROMPT, output: int = OUTPUT) -> float:
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, engine.model_config.vocab_size, (prompt,), generator=gen).tolist()
               for _ in range(batch)]
    engine.generate([prompts[0][:8]], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
    started = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True))
    return sum(len(o.output_token_ids) for o in outs) / (time.perf_counter() - started)


def predicted_tokens_per_s(model: str, hardware: str, profile: str, costs: CostModel, precision: str,
                           quantization: str | None, kv: str | None, batch: int, prompt: int = PROMPT,
                           output: int = OUTPUT) -> float:
    config = SimConfig(model=model, hardware=hardware, profile=profile, quant=quantization or precision,
                       kv_dtype=kv or "auto", num_gpu_blocks=1024, max_num_batched_tokens=2048, max_num_seqs=64,
                       max_model_len=512, enable_prefix_caching=False)
    workload = make_workload("bench", [(0.0, prompt, output, ()) for _ in range(batch)])
    return simulate(config, workload, cost_model=costs).summary.throughput.output_tokens_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="servecast profile of this GPU for the model (required but with --quick)")
    parser.add_argument("--hardware", default="h200", help="catalog id the profile was recorded as")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a 2-layer model profiled on the tests' small grid (unless --profile), "
                             "batches 4 and 1, short requests; on the CPU where there is no CUDA")
    args = parser.parse_args()
    batches, prompt, output = (16, 1), PROMPT, OUTPUT
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        if not args.quick:
            raise SystemExit("bench/gpu_quant.py needs CUDA (this machine has none); --quick runs on the CPU")
        print("bench/gpu_quant.py needs CUDA for its figures; this machine has none: --quick runs on the CPU "
              "(float32, cpu-local) instead")
        args.device, args.dtype, args.hardware = "cpu", "float32", "cpu-local"
    if args.quick:
        batches, prompt, output = (4, 1), 32, 16
        folder = Path(tempfile.mkdtemp(prefix="servecast-gpu-quant-quick-"))
        args.model = str(folder / "config.json")
        Path(args.model).write_text(json.dumps(QUICK_ARCH))
        if args.profile is None:
            args.profile = str(folder / f"{args.hardware}-quick.jsonl")
            grid = replace(ProfileGrid.quick(), weight_quant=("int8", "int4", "fp8"), kv_quant=("int8", "fp8"))
            print(f"--quick: profiling the 2-layer model on {args.device} -> {args.profile}", flush=True)
            Profiler(ModelConfig.from_hf(QUICK_ARCH), device=args.device, dtype=args.dtype, hardware=args.hardware,
                     grid=grid).run(args.profile)
    elif args.profile is None:
        parser.error("--profile is required (a servecast profile of this GPU for the model)")
    precision = canonical_dtype(args.dtype)
    on_cuda = args.device.startswith("cuda")
    costs = CostModel.load(args.hardware, profile=args.profile)
    device_name = torch.cuda.get_device_name(0) if on_cuda else "CPU"
    print(f"{args.model} on {device_name}, {precision} activations; prediction from {args.profile}")
    big = f"b{batches[0]}"
    print(f"{'mode':>9} {'weight GB':>9} {'x ' + precision:>6} {'KV B/token':>10} {'tok/s ' + big:>9} "
          f"{'pred ' + big:>8} {'tok/s b1':>8} {'pred b1':>8}", flush=True)
    base_bytes = None
    for name, quantization, kv_dtype in MODES:
        engine = engine_for(args.model, args.device, args.dtype, quantization, kv_dtype)
        weight_bytes = engine.model.weight_bytes()
        base_bytes = base_bytes or weight_bytes
        kv = engine.config.block_bytes(engine.model_config) // engine.config.block_size
        measured = [tokens_per_s(engine, b, prompt, output) for b in batches]
        predicted = [predicted_tokens_per_s(args.model, args.hardware, args.profile, costs, precision, quantization,
                                            kv_dtype, b, prompt, output)
                     for b in batches]
        kernels = sorted(set(engine.model.quant_kernels().values()))
        print(f"{name:>9} {weight_bytes / 1e9:>9.2f} {weight_bytes / base_bytes:>6.2f} {kv:>10} {measured[0]:>9.0f} "
              f"{predicted[0]:>8.0f} {measured[1]:>8.1f} {predicted[1]:>8.1f}  {','.join(kernels)}", flush=True)
        del engine
        gc.unfreeze()  # the engine froze its objects out of the collector; let this one's go
        gc.collect()
        if on_cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
