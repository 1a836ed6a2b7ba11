"""The KV cache a vLLM server sizes for itself (its startup log's "Available KV cache memory" and
"GPU KV cache size: N tokens"), predicted by the memory plan. The logs and their sources are in
docs/kv-capacity.md; the tensor-parallel reserve was fitted on the two Llama-70B rows alone, so
the Qwen3-235B and the single-GPU rows are held out."""

from __future__ import annotations

import pytest

from simulator.fleet.sim_config import SimConfig

GIB = 2**30

# (model, quant, tp, hardware, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens,
#  available GiB, tokens): vLLM 0.11.2-0.16 with their defaults on H200 (1024 / 8192), 0.15.1 on A100-40GB.
LOGS = [
    ("llama-3.1-70b", "bf16", 4, "h200", 0.92, 1024, 8192, 90.23, 1_182_608),
    ("llama-3.1-70b", "fp8", 4, "h200", 0.92, 1024, 8192, 106.15, 1_391_344),
    ("qwen3-235b-a22b", "bf16", 4, "h200", 0.92, 1024, 8192, 12.73, 284_080),
    ("qwen3-235b-a22b", "fp8", 4, "h200", 0.92, 1024, 8192, 66.13, 1_475_472),
    ("llama-3.1-8b", "bf16", 1, "a100-40gb", 0.90, 256, 8192, 19.28, 157_936),
]


@pytest.mark.parametrize("model, quant, tp, hardware, util, seqs, tokens_per_step, available, tokens", LOGS)
def test_the_kv_cache_is_within_5_percent_of_vllms_logs(model, quant, tp, hardware, util, seqs, tokens_per_step,
                                                        available, tokens) -> None:
    config = SimConfig(model=model, quant=quant, tp=tp, hardware=hardware, gpu_memory_utilization=util,
                       max_num_seqs=seqs, max_num_batched_tokens=tokens_per_step, max_model_len=8192)
    _, _, plan = config.check()
    assert plan.kv_bytes / GIB == pytest.approx(available, rel=0.05)
    assert plan.kv_tokens == pytest.approx(tokens, rel=0.05)


def test_fp8_kv_holds_twice_the_tokens_as_vllms_does() -> None:
    common = dict(model="llama-3.1-70b", quant="fp8", tp=4, hardware="h200", gpu_memory_utilization=0.92,
                  max_num_seqs=1024, max_model_len=8192)
    bf16, fp8 = (SimConfig(**common, kv_dtype=kv).check()[2] for kv in ("auto", "fp8"))
    assert fp8.num_blocks == pytest.approx(2 * bf16.num_blocks, abs=1)  # the log: 2,782,688 = 2 x 1,391,344
