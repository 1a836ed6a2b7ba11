"""The one model description (engine/policy/model_description.py): every family read once, each consumer's
defaults where config.json is silent, one parameter count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.policy.config import SUPPORTED_ARCHITECTURES, ModelConfig
from engine.policy.model_description import ARCHITECTURES, ENGINE_ARCHITECTURES, describe
from simulator.catalog.models import MODELS_DIR, SUPPORTED, ModelSpec, load_model
from tests.tiny_models import CONFIGS, hf_config

DENSE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 100}


def catalog_raw(model_id: str) -> dict:
    return json.loads((MODELS_DIR / f"{model_id}.json").read_text())


def test_the_registry_is_what_both_consumers_support() -> None:
    assert set(SUPPORTED) == set(ARCHITECTURES) == {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe",
                                                    "qwen3_moe", "llama4_text", "deepseek_v2", "gpt_oss"}
    assert set(SUPPORTED_ARCHITECTURES) == set(ENGINE_ARCHITECTURES) == set(ARCHITECTURES) - {
        "llama4_text", "deepseek_v2", "gpt_oss"}
    seen = {describe(catalog_raw(p.stem)).model_type for p in MODELS_DIR.glob("*.json")}
    seen |= {describe(hf_config(name).to_dict()).model_type for name in CONFIGS}
    assert seen == set(ARCHITECTURES)  # every family is read by some catalog or tiny test config


@pytest.mark.parametrize("model_id", ["llama-4-scout", "deepseek-v2-lite", "gpt-oss-20b"])
def test_the_engine_refuses_the_families_only_the_simulator_reads(model_id) -> None:
    raw = catalog_raw(model_id)
    with pytest.raises(ValueError, match=f"model_type '{raw['model_type']}' is not supported by the engine; "
                                         "supported: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe"):
        ModelConfig.from_hf(raw)
    assert load_model(model_id).is_moe


def test_each_consumer_keeps_its_defaults_where_config_json_is_silent() -> None:
    description = describe(DENSE)
    assert description.max_position_embeddings is None and description.dtype is description.torch_dtype is None
    engine, spec = ModelConfig.from_hf(DENSE), ModelSpec.from_hf_dict(DENSE, "m")
    assert (engine.max_position_embeddings, engine.dtype) == (2048, "float32")
    assert (spec.max_position_embeddings, spec.dtype) == (4096, "bfloat16")
    both = {**DENSE, "dtype": "float16", "torch_dtype": "bfloat16"}  # each reads its key first, as ever
    assert (ModelConfig.from_hf(both).dtype, ModelSpec.from_hf_dict(both, "m").dtype) == ("float16", "bfloat16")


def test_a_qwen2_moe_without_its_expert_keys_takes_transformers_defaults_on_the_engine_only() -> None:
    raw = {**DENSE, "model_type": "qwen2_moe"}
    assert describe(raw).assumed == ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
    engine = ModelConfig.from_hf(raw)
    assert (engine.num_experts, engine.experts_per_token, engine.moe_intermediate_size) == (60, 4, 1408)
    with pytest.raises(ValueError, match="model m: config lacks 'num_experts'"):
        ModelSpec.from_hf_dict(raw, "m")


def test_missing_keys_are_named_by_each_consumer() -> None:
    raw = {k: v for k, v in DENSE.items() if k != "vocab_size"}
    with pytest.raises(ValueError, match="model config lacks 'vocab_size': is this a Llama-family config.json"):
        ModelConfig.from_hf(raw)
    with pytest.raises(ValueError, match="model m: config lacks 'vocab_size'"):
        ModelSpec.from_hf_dict(raw, "m")
    with pytest.raises(ValueError, match="config lacks 'kv_lora_rank'"):
        ModelSpec.from_hf_dict({**DENSE, "model_type": "deepseek_v2"}, "m")


@pytest.mark.parametrize("model_id", ["llama-3.1-8b", "mistral-7b", "mixtral-8x7b", "qwen3-14b", "qwen2.5-7b",
                                      "qwen1.5-moe-a2.7b"])
def test_one_parameter_count_for_both_consumers(model_id) -> None:
    engine, spec = ModelConfig.from_hf(catalog_raw(model_id)), load_model(model_id)
    assert (engine.q_size, engine.kv_size, engine.expert_intermediate_size) == (
        spec.q_size, spec.kv_size, spec.expert_intermediate_size)
    # The simulator leaves out what the cost model does not time: biases, q/k norms, the shared-expert gate.
    left_out = (engine.num_layers * ((engine.q_size + 2 * engine.kv_size) * engine.qkv_bias
                                     + 2 * engine.head_dim * engine.qk_norm)
                + engine.num_moe_layers * engine.hidden_size * engine.shared_expert_gate)
    assert engine.num_parameters() - spec.num_parameters() == left_out
    assert (left_out > 0) == (model_id in ("qwen3-14b", "qwen2.5-7b", "qwen1.5-moe-a2.7b"))


def test_the_description_and_engine_config_import_no_torch() -> None:
    code = "import engine.policy.config, engine.policy.model_description, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
