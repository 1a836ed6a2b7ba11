"""A server's deployment as SimConfig fields: servecast's engine described, and deployments stated on
the command line."""

from __future__ import annotations

import pytest

from calibrate.runs.deployment import deployment_config, engine_deployment, parse_deployment
from engine.policy.config import EngineConfig


def test_the_engines_own_deployment_is_a_simconfig_of_its_settings() -> None:
    config = EngineConfig(block_size=8, max_num_seqs=12, max_num_batched_tokens=96, enable_prefix_caching=False,
                          tensor_parallel_size=2)
    sim = deployment_config(engine_deployment("servecast-demo", config, 300, 512), "here", profile="p.jsonl")
    assert (sim.model, sim.hardware, sim.tp, sim.quant, sim.activation_dtype, sim.kv_dtype) == \
        ("servecast-demo", "cpu-local", 2, "fp32", "auto", "auto")
    assert (sim.block_size, sim.num_gpu_blocks, sim.max_num_seqs, sim.max_num_batched_tokens, sim.max_model_len) == \
        (8, 300, 12, 96, 512)
    assert not sim.enable_prefix_caching and sim.enable_chunked_prefill and sim.cache_dtype == "fp32"
    # Quantized layers compute in the engine's dtype, not in bf16 as W8A16 GPUs do.
    quantized = engine_deployment("servecast-demo", EngineConfig(quantization="int8", kv_cache_dtype="fp8",
                                                                 device="cuda", dtype="bfloat16"), 64, 256)
    sim = deployment_config(quantized, "here", profile="p.jsonl")
    assert (sim.hardware, sim.quant, sim.compute_dtype, sim.kv_dtype) == ("cuda-local", "int8", "bf16", "fp8")
    fp32 = deployment_config(engine_deployment("servecast-demo", EngineConfig(quantization="int4"), 64, 256), "here")
    assert fp32.compute_dtype == "fp32"
    assert engine_deployment("x", EngineConfig(), 1, 2, hardware="h200")["hardware"] == "h200"


def test_a_stated_deployment_is_typed_as_simconfig_types_it() -> None:
    fields = parse_deployment("hardware=h100-sxm, tp=2,max-num-batched-tokens=8192,enable_prefix_caching=false")
    assert fields == {"hardware": "h100-sxm", "tp": 2, "max_num_batched_tokens": 8192, "enable_prefix_caching": False}
    assert parse_deployment("") == {}


@pytest.mark.parametrize("text, message", [
    ("tp", "not key=value"),
    ("tp=", "not key=value"),
    ("gpus=8", "unknown field 'gpus'"),
    ("seed=3", "unknown field 'seed'"),  # the workload's, not the server's
    ("tp=two", "tp: "),
    ("quant=int3", "quant: "),
])
def test_a_bad_stated_deployment_names_the_item(text, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_deployment(text)


def test_a_deployment_without_its_hardware_says_how_to_add_it() -> None:
    with pytest.raises(ValueError, match="does not say its hardware: replay with --deployment hardware="):
        deployment_config({"model": "llama-3.1-8b"}, "runs/a")
    with pytest.raises(ValueError, match="runs/a: tp: "):
        deployment_config({"model": "llama-3.1-8b", "hardware": "h100-sxm", "tp": 0}, "runs/a")


def test_files_a_stated_deployment_names_are_recorded_absolutely(tmp_path, monkeypatch) -> None:
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    fields = parse_deployment("model=config.json,hardware=h100-sxm")
    assert fields["model"] == str(tmp_path / "config.json") and fields["hardware"] == "h100-sxm"
