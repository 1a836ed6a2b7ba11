"""Model facts from HF configs: old and new rope formats, sliding windows, head_dim, pool sizing."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.policy.config import EngineConfig, ModelConfig
from engine.rope import inverse_frequencies
from tests.tiny_models import hf_config, hf_logits, hf_model, random_prompts

LLAMA31_STYLE = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
}


def test_reads_an_old_style_config_json(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_STYLE))
    config = ModelConfig.from_hf(tmp_path)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (32, 8, 128)
    assert config.rope.rope_type == "llama3" and config.rope.theta == 500000.0
    assert config.eos_token_ids == (128001, 128008, 128009) and config.dtype == "bfloat16"
    assert 7.9e9 < config.num_parameters() < 8.1e9  # Llama-3.1-8B has 8.03B parameters
    assert config.kv_bytes_per_token(2) == 131072  # 32 layers x (K+V) x 8 heads x 128 x 2 bytes


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "factor": 4.0, "rope_theta": 50000.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64, "rope_theta": 500000.0},
])
def test_rope_frequencies_equal_transformers(rope) -> None:
    hf = LlamaConfig(hidden_size=128, num_attention_heads=2, rope_parameters=dict(rope))
    ours = inverse_frequencies(ModelConfig.from_hf(hf).rope, 64)
    if rope["rope_type"] == "default":
        theirs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, 64, 2).float() / 64))
    else:
        theirs, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_sliding_windows_per_layer() -> None:
    mistral = ModelConfig.from_hf(hf_config("mistral-swa"))
    assert mistral.sliding_windows == (12, 12)
    qwen = hf_config("qwen2-bias").to_dict()
    assert ModelConfig.from_hf(qwen).sliding_windows == (None, None)  # use_sliding_window is off
    mixed = {**qwen, "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]}
    assert ModelConfig.from_hf(mixed).sliding_windows == (None, 8)


def test_the_sliding_window_in_the_parity_tests_is_not_vacuous() -> None:
    # The mistral parity prompts are longer than its window: without the window, logits differ.
    prompt = random_prompts([40], seed=40)[0]
    windowed = hf_logits(hf_model("mistral-swa"), prompt)
    full = hf_model("mistral-swa")
    full.config.sliding_window = None
    try:
        unwindowed = hf_logits(full, prompt)
    finally:
        full.config.sliding_window = 12
    assert (windowed[:12] - unwindowed[:12]).abs().max() < 1e-5
    assert (windowed[20:] - unwindowed[20:]).abs().max() > 1e-3


def test_kv_pool_default_and_budget_sizing() -> None:
    model = ModelConfig.from_hf(LLAMA31_STYLE)
    per_block = 16 * model.kv_bytes_per_token(2)  # bfloat16
    config = EngineConfig(dtype="bfloat16", kv_cache_memory_bytes=10 * per_block + 1)
    assert config.cache_config(model).num_blocks == 10
    # The default never exceeds what max_num_seqs full-length sequences need.
    small = EngineConfig(max_num_seqs=2, max_model_len=64)
    assert small.cache_config(model).num_blocks == 8
    with pytest.raises(ValueError, match="not both"):
        EngineConfig(num_blocks=4, kv_cache_memory_bytes=1024)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        EngineConfig(max_model_len=10**7).scheduler_config(model)
