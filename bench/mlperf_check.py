"""Predicted vs published MLPerf Inference v4.1 Offline throughput: Llama-2-70B (issue 4) and
Mixtral-8x7B (issue 7).

Offline = every sample queued at once; the figure is output tokens/s of the whole system. The
systems ran TensorRT-LLM with FP8 weights and KV cache; the simulator models them as replicas of
this project's vLLM-like scheduler with fp8 weights and KV on the catalog accelerator, at the
tensor-parallel degree NVIDIA used (H100: TP2; H200: TP1, the 70B model fits one 141 GB GPU).

Lengths: MLPerf's OpenOrca set averages about 291 output tokens per sample (derived in
../shared/reference/validation.md); its input statistics are not in ../shared, so inputs are an
assumption stated here: lognormal with median 200 and sigma 0.7, capped at 1024 tokens, like the
set's 1024-token cap.

Mixtral-8x7B: its set mixes OpenOrca, GSM8K and MBXP prompts and averages about 146 output tokens
per sample (validation.md); inputs are assumed lognormal with median 300 and sigma 0.8 (capped at
2048), outputs lognormal with mean ~146 (capped at 1024). Modeled as fp8 replicas with one GPU
each (46.7 B fp8 parameters fit an H100's 80 GB), the router uniform. GH200 rows are skipped:
the catalog has no GH200 entry (../shared has no spec sheet for it).

Each row is predicted twice: with the kernels alone (`--engine servecast`, no serving engine's
additions: how this check ran before engine profiles) and with vLLM's profile (the default on
catalog GPUs, fitted on real vLLM runs). Neither is TensorRT-LLM's; both are printed.

Prints the error per row; never passes or fails.

    python bench/mlperf_check.py [--shared ../shared] [--per-replica 1500] [--quick]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.requests import make_workload

# benchmark -> (catalog model, max_model_len, {MLPerf accelerator name -> (catalog id, TP degree per replica)}).
BENCHMARKS = {
    "llama2-70b-99": ("llama-2-70b", 2048, {"NVIDIA H100-SXM-80GB": ("h100-sxm", 2), "NVIDIA H200-SXM-141GB": ("h200", 1),
                                      "NVIDIA H200-SXM-141GB-CTS": ("h200", 1)}),
    "mixtral-8x7b": ("mixtral-8x7b", 4096, {"NVIDIA H100-SXM-80GB": ("h100-sxm", 1), "NVIDIA H200-SXM-141GB": ("h200", 1)}),
}


def openorca_like(num: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    prompt = np.minimum(1024, np.maximum(1, np.rint(200 * np.exp(0.7 * rng.standard_normal(num)))))
    # Output: mean ~291 (MLPerf's derived mean), capped at 1024 as the benchmark's max output.
    output = np.minimum(1024, np.maximum(1, np.rint(250 * np.exp(0.55 * rng.standard_normal(num)))))
    return make_workload("openorca-like", [(0.0, int(p), int(o), ()) for p, o in zip(prompt, output)])


def mixtral_mix(num: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    prompt = np.minimum(2048, np.maximum(1, np.rint(300 * np.exp(0.8 * rng.standard_normal(num)))))
    output = np.minimum(1024, np.maximum(1, np.rint(120 * np.exp(0.6 * rng.standard_normal(num)))))
    return make_workload("mixtral-mix", [(0.0, int(p), int(o), ()) for p, o in zip(prompt, output)])


WORKLOADS = {"llama2-70b-99": openorca_like, "mixtral-8x7b": mixtral_mix}


def published_rows(shared: Path, benchmark: str) -> list[dict]:
    rows = []
    hardware = BENCHMARKS[benchmark][2]
    with (shared / "reference" / "mlperf_inference_v4.1_llm_closed.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if row["benchmark"] != benchmark or row["scenario"] != "Offline" or row["valid"] != "VALID":
                continue
            if row["accelerator"] in hardware:
                rows.append(row)
            else:
                print(f"skipped {row['submitter']} / {row['system']}: no catalog entry for {row['accelerator']}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    parser.add_argument("--per-replica", type=int, default=1500, help="samples per replica in the simulated run")
    parser.add_argument("--benchmark", choices=[*BENCHMARKS, "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="smoke run: 100 samples per replica")
    args = parser.parse_args()
    if args.quick:
        args.per_replica = 100
    for benchmark in BENCHMARKS if args.benchmark == "all" else [args.benchmark]:
        check(args.shared, benchmark, args.per_replica)


def check(shared: Path, benchmark: str, per_replica: int) -> None:
    model, max_model_len, hardware_of = BENCHMARKS[benchmark]
    rows = published_rows(shared, benchmark)
    if not rows:
        raise SystemExit(f"no {benchmark} H100/H200 rows found: check the CSV's columns")
    print(f"\n{benchmark} Offline ({model})")
    print(f"{'submitter / system':<58} {'GPUs':>4} {'published':>10} {'kernels':>10} {'error':>7} "
          f"{'vllm-v0.15':>10} {'error':>7}")
    cache: dict = {}
    errors, vllm_errors = [], []
    for row in rows:
        hardware, tp = hardware_of[row["accelerator"]]
        count = int(row["accelerators_total"])
        replicas = max(1, count // tp)
        for engine in ("servecast", "vllm-v0.15"):
            key = (hardware, tp, engine)
            if key not in cache:  # one replica's throughput; replicas of an Offline run are independent
                config = SimConfig(model=model, hardware=hardware, tp=tp, quant="fp8", kv_dtype="fp8",
                                   max_num_seqs=1024, max_num_batched_tokens=8192, max_model_len=max_model_len,
                                   engine=engine)
                result = simulate(config, WORKLOADS[benchmark](per_replica))
                cache[key] = result.summary.throughput.output_tokens_per_s
        predicted, vllm = (cache[(hardware, tp, e)] * replicas for e in ("servecast", "vllm-v0.15"))
        published = float(row["tokens_per_s"])
        errors.append(predicted / published - 1)
        vllm_errors.append(vllm / published - 1)
        print(f"{row['submitter'] + ' / ' + row['system']:<58.58} {count:>4} {published:>10,.0f} {predicted:>10,.0f} "
              f"{predicted / published - 1:>+7.1%} {vllm:>10,.0f} {vllm / published - 1:>+7.1%}")
    print(f"mean |error| {np.mean(np.abs(errors)):.1%} kernels alone, {np.mean(np.abs(vllm_errors)):.1%} with "
          f"vllm-v0.15, over {len(errors)} rows")


if __name__ == "__main__":
    main()
