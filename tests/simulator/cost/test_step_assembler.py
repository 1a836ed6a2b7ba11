"""One step assembler: what `servecast predict` and the framework fit read of a step
(step_cost / StepTimer.explain) is the simulator's own step time (StepTimer.step) for the same
shape and chunks, over a grid of configurations -- pipeline and context parallelism, a
quantized KV cache, speculative verification, MoE expert parallelism and a serving engine's
overlay (a profiled device's padded decodes: tests/calibrate/test_profile.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from app.cli import app
from calibrate.fitting.device import load_cost_model
from simulator.catalog.models import load_model
from simulator.cost.model import CostModel
from simulator.cost.profile_format import Measurement, Profile
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import StepTimer, scheduled, step_cost
from simulator.cost.types import Chunk
from simulator.fleet.costs import cost_model_for
from simulator.fleet.sim_config import SimConfig

STEPS = {
    "decodes": [Chunk(1, 100), Chunk(1, 3000), Chunk(1, 77)],
    "mixed": [Chunk(512, 512), Chunk(1, 40), Chunk(1, 900)],
    "silent prefill": [Chunk(256, 768, samples=False)],
    "verify": [Chunk(5, 305, verify=True), Chunk(3, 93, verify=True), Chunk(1, 701)],
    "long prefill": [Chunk(4096, 20480), Chunk(1, 1000)],
}


def kv_gather_profile() -> Profile:
    """A catalog GPU's profile with nothing but the KV cache's gathers, plain and int8."""
    profile = Profile("a100-80gb", {"device_name": "test"}, {}, "test")
    for kv_dtype, scale in (("none", 1.0), ("int8", 1.6)):
        for tokens in (64, 1024, 16384, 131072):
            profile.measurements.append(Measurement.make("kv_gather", scale * (2e-6 + tokens * 4e-10),
                                                         num_kv_heads=8, head_dim=128, dtype="bf16",
                                                         kv_dtype=kv_dtype, tokens=tokens))
    return profile


def shapes():
    llama8, llama70, mixtral = load_model("llama-3.1-8b"), load_model("llama-3.1-70b"), load_model("mixtral-8x7b")
    plain = CostModel.load("a100-80gb")
    vllm = cost_model_for(SimConfig(model="llama-3.1-8b", hardware="h100-sxm"))
    yield "tp2", plain, ReplicaShape(llama8, tp=2)
    yield "tp4 under vLLM", vllm, ReplicaShape(llama70, tp=4)
    yield "pp2", vllm, ReplicaShape(llama70, tp=2, pp=2)
    yield "cp2", vllm, ReplicaShape(llama8, cp=2)
    yield "cp4 tp2", plain, ReplicaShape(llama70, tp=2, cp=4)
    yield "int8 weights, fp8 kv", vllm, ReplicaShape(llama8, weight_dtype="int8", kv_dtype="fp8")
    yield "kv int8", load_cost_model("a100-80gb", profile=kv_gather_profile()), ReplicaShape(llama8, kv_dtype="int8")
    yield "mixtral ep", vllm, ReplicaShape(mixtral, tp=2, expert_parallel=True, routing_skew=0.5)


@pytest.mark.parametrize("name,cost_model,shape", list(shapes()), ids=lambda v: v if isinstance(v, str) else "")
def test_the_explained_step_is_the_simulated_step(name, cost_model, shape) -> None:
    for label, chunks in STEPS.items():
        timer = StepTimer(cost_model, shape)
        simulated = timer.step(scheduled(chunks))
        explained = step_cost(cost_model, shape, chunks)
        assert explained.total_s == pytest.approx(simulated, rel=1e-9), (name, label)
        assert sum(explained.by_operator.values()) == pytest.approx(simulated, rel=1e-9), (name, label)
        assert timer.step(scheduled(chunks)) == simulated, (name, label)  # again, from the memo


def test_the_terms_predict_leaves_out_no_longer_go_missing() -> None:
    """Pipeline sends, KV dequantization and context parallelism's collectives are operators of
    the explained step (CostModel.step_time priced a step without them)."""
    llama70 = load_model("llama-3.1-70b")
    plain = CostModel.load("a100-80gb")
    step = STEPS["mixed"]
    assert step_cost(plain, ReplicaShape(llama70, tp=2, pp=2), step).by_operator["pipeline_send"] > 0
    assert step_cost(plain, ReplicaShape(llama70, tp=2, cp=2), step).by_operator["context_parallel"] > 0
    kv = load_cost_model("a100-80gb", profile=kv_gather_profile())
    assert step_cost(kv, ReplicaShape(load_model("llama-3.1-8b"), kv_dtype="int8"), step).by_operator["kv_dequant"] > 0


@pytest.mark.parametrize("args", [["--hardware", "h100-sxm", "--model", "llama-3.1-70b", "--tp", "4",
                                   "--decode-batch", "32", "--context", "2048"],
                                  ["--hardware", "a100-80gb", "--model", "mixtral-8x7b", "--tp", "2",
                                   "--expert-parallel", "--tokens", "1024"]])
def test_predict_prints_the_simulators_step(args) -> None:
    result = CliRunner().invoke(app, ["predict", *args, "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    config = SimConfig(model=printed["model"], hardware=printed["hardware"], tp=printed["tp"],
                       expert_parallel="--expert-parallel" in args)
    step = printed["step"]
    chunks = ([Chunk(1, step["context"])] * step["decode_batch"] if "decode_batch" in step
              else [Chunk(step["prefill_tokens"], step["prefill_tokens"])])
    shape = ReplicaShape(config.model_spec(), tp=config.tp, expert_parallel=config.expert_parallel)
    simulated = StepTimer(cost_model_for(config), shape).step(scheduled(chunks))
    assert printed["step_time_s"] == pytest.approx(simulated, rel=1e-12)


def test_decode_attention_reads_the_cache_in_its_own_precision_on_a_catalog_gpu() -> None:
    """An FP8 model keeps a bf16 cache by default (vLLM's --kv-cache-dtype auto): its decode
    attention reads bf16 bytes; an FP8 cache is read as FP8, in about half the time."""
    vllm = cost_model_for(SimConfig(model="llama-3.1-8b", hardware="h100-sxm"))
    llama8 = load_model("llama-3.1-8b")
    decodes = [Chunk(1, 8000)] * 32

    def attention(**shape) -> float:
        return step_cost(vllm, ReplicaShape(llama8, **shape), decodes).by_operator["attention_decode"]

    bf16 = attention(dtype="bf16", kv_dtype="bf16")
    assert attention(dtype="fp8", kv_dtype="bf16") == pytest.approx(bf16, rel=0.05)
    assert 0.4 * bf16 < attention(dtype="fp8", kv_dtype="fp8") < 0.7 * bf16


def test_a_gpu_without_fp8_tensor_cores_attends_an_fp8_cache_in_the_compute_dtype() -> None:
    """An A100 stores an FP8 cache (half the blocks' bytes) but has no FP8 peak to attend in: its
    attention is timed as the compute dtype's, not refused mid-simulation."""
    a100 = cost_model_for(SimConfig(model="llama-3.1-8b", hardware="a100-80gb"))
    llama8 = load_model("llama-3.1-8b")
    chunks = [Chunk(512, 0), *[Chunk(1, 4000)] * 16]
    fp8 = step_cost(a100, ReplicaShape(llama8, kv_dtype="fp8"), chunks).by_operator
    bf16 = step_cost(a100, ReplicaShape(llama8, kv_dtype="bf16"), chunks).by_operator
    assert fp8["attention_decode"] == pytest.approx(bf16["attention_decode"])
    assert fp8["attention_prefill"] == pytest.approx(bf16["attention_prefill"])
