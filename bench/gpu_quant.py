"""Weight-only and KV-cache quantization of a real-size model on a CUDA GPU: memory as allocated and
decode speed per mode, beside the simulator's prediction from a profile of the same GPU.
Prints figures; never passes or fails.

Random weights (speed and bytes do not depend on the values; quality needs a trained model, which
this offline project has only at CPU scale -- bench/quant.py). Per mode: weight GB as allocated, KV
bytes per token, output tokens/s serving 16 and 1 requests (128 random prompt tokens, 64 generated,
greedy), and the simulator's prediction of the same runs from the profile (`servecast profile
--device cuda --quant int8,int4,fp8 --kv-quant int8,fp8 --hardware H`).

    python bench/gpu_quant.py --profile gpu-out/h200-llama-3.1-8b-bf16.jsonl [--hardware h200]
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from simulator.catalog.models import model_config_path
from simulator.cost.model import CostModel
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.requests import make_workload

# (label, weight quantization, KV cache dtype)
MODES = [("float", None, None), ("int8", "int8", None), ("int4 g128", "int4", None), ("fp8", "fp8", None),
         ("kv int8", None, "int8"), ("kv fp8", None, "fp8")]
PROMPT, OUTPUT = 128, 64


def engine_for(model: str, device: str, dtype: str, quantization: str | None, kv: str | None) -> LLMEngine:
    config = EngineConfig(device=device, dtype=dtype, max_model_len=512, num_blocks=1024,
                          max_num_batched_tokens=2048, max_num_seqs=64, quantization=quantization,
                          quant_group_size=128, kv_cache_dtype=kv, enable_prefix_caching=False)
    return LLMEngine.from_config(model_config_path(model), config)


def tokens_per_s(engine: LLMEngine, batch: int) -> float:
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, engine.model_config.vocab_size, (PROMPT,), generator=gen).tolist()
               for _ in range(batch)]
    engine.generate([prompts[0][:8]], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
    started = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(max_tokens=OUTPUT, temperature=0.0, ignore_eos=True))
    return sum(len(o.output_token_ids) for o in outs) / (time.perf_counter() - started)


def predicted_tokens_per_s(model: str, hardware: str, profile: str, costs: CostModel, precision: str,
                           quantization: str | None, kv: str | None, batch: int) -> float:
    config = SimConfig(model=model, hardware=hardware, profile=profile, quant=quantization or precision,
                       kv_dtype=kv or "auto", num_gpu_blocks=1024, max_num_batched_tokens=2048, max_num_seqs=64,
                       max_model_len=512, enable_prefix_caching=False)
    workload = make_workload("bench", [(0.0, PROMPT, OUTPUT, ()) for _ in range(batch)])
    return simulate(config, workload, cost_model=costs).summary["throughput"]["output_tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="servecast profile of this GPU for the model")
    parser.add_argument("--hardware", default="h200", help="catalog id the profile was recorded as")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    precision = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[args.dtype]
    on_cuda = args.device.startswith("cuda")
    costs = CostModel.load(args.hardware, profile=args.profile)
    device_name = torch.cuda.get_device_name(0) if on_cuda else "CPU"
    print(f"{args.model} on {device_name}, {precision} activations; prediction from {args.profile}")
    print(f"{'mode':>9} {'weight GB':>9} {'x ' + precision:>6} {'KV B/token':>10} {'tok/s b16':>9} {'pred b16':>8} "
          f"{'tok/s b1':>8} {'pred b1':>8}", flush=True)
    base_bytes = None
    for name, quantization, kv_dtype in MODES:
        engine = engine_for(args.model, args.device, args.dtype, quantization, kv_dtype)
        weight_bytes = engine.model.weight_bytes()
        base_bytes = base_bytes or weight_bytes
        kv = engine.config.block_bytes(engine.model_config) // engine.config.block_size
        measured = [tokens_per_s(engine, b) for b in (16, 1)]
        predicted = [predicted_tokens_per_s(args.model, args.hardware, args.profile, costs, precision, quantization,
                                            kv_dtype, b)
                     for b in (16, 1)]
        kernels = sorted({m.quantized.kernel for m in engine.model.modules() if getattr(m, "quantized", None)})
        print(f"{name:>9} {weight_bytes / 1e9:>9.2f} {weight_bytes / base_bytes:>6.2f} {kv:>10} {measured[0]:>9.0f} "
              f"{predicted[0]:>8.0f} {measured[1]:>8.1f} {predicted[1]:>8.1f}  {','.join(kernels)}", flush=True)
        del engine
        gc.unfreeze()  # the engine froze its objects out of the collector; let this one's go
        gc.collect()
        if on_cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
