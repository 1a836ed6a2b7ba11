"""Bad input gets a clear ValueError naming the problem, and the engine keeps serving the others."""

from __future__ import annotations

import pytest

from engine import LLMEngine, ModelConfig, SamplingParams
from tests.device import engine_config
from tests.tiny_models import hf_config, hf_greedy, hf_model, random_prompts

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture
def engine() -> LLMEngine:
    return LLMEngine.from_hf(hf_model("llama-mha-hd32"),
                             engine_config(block_size=4, num_blocks=32, max_model_len=64, max_num_batched_tokens=32))


def test_bad_requests_are_refused_and_the_rest_are_served(engine: LLMEngine) -> None:
    good = random_prompts([5, 9], seed=20)
    engine.add_request("good-0", good[0], GREEDY)
    engine.step()  # good-0 is running when the bad requests arrive
    bad_calls = [
        (lambda: engine.add_request("empty", [], GREEDY), "empty prompt"),
        (lambda: engine.add_request("long", [1] * 60, GREEDY), "max_model_len"),
        (lambda: engine.add_request("vocab", [1, 999, -3], GREEDY), "outside the vocabulary"),
        (lambda: engine.add_request("good-0", [1, 2], GREEDY), "already in use"),
        (lambda: engine.abort_request("nobody"), "no unfinished request"),
    ]
    for call, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            call()
    engine.add_request("good-1", good[1], GREEDY)
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o.output_token_ids
    model = hf_model("llama-mha-hd32")
    assert done == {"good-0": hf_greedy(model, good[0], 6), "good-1": hf_greedy(model, good[1], 6)}


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-2), "max_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
])
def test_bad_sampling_params(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_heads_that_do_not_divide() -> None:
    config = hf_config("llama-mha-hd32").to_dict()
    with pytest.raises(ValueError, match="not a multiple of num_key_value_heads"):
        ModelConfig.from_hf({**config, "num_attention_heads": 4, "num_key_value_heads": 3, "head_dim": 16})
    with pytest.raises(ValueError, match="not divisible"):
        ModelConfig.from_hf({**config, "num_attention_heads": 3, "num_key_value_heads": 3, "head_dim": None})


def test_kv_pool_too_small_for_any_request() -> None:
    model = hf_model("llama-mha-hd32")
    with pytest.raises(ValueError, match="holds no block"):
        LLMEngine.from_hf(model, engine_config(kv_cache_memory_bytes=100))
    engine = LLMEngine.from_hf(model, engine_config(block_size=4, num_blocks=2, max_model_len=64))
    with pytest.raises(ValueError, match="needs up to 3 KV blocks but the pool has 2"):
        engine.add_request("big", [1] * 6, SamplingParams(max_tokens=4))
    engine.add_request("fits", [1] * 4, SamplingParams(max_tokens=4, temperature=0.0))
    assert engine.generate([[1, 2]], SamplingParams(max_tokens=3))[0].finished


def test_kv_pool_sized_by_byte_budget() -> None:
    model = hf_model("llama-mha-hd32")
    # 2 layers x (K+V) x 2 heads x 32 dims x 4 bytes = 1 KiB per token; 16-token blocks: 16 KiB.
    engine = LLMEngine.from_hf(model, engine_config(block_size=16, kv_cache_memory_bytes=10 * 16384 + 100))
    assert engine.cache_config.num_blocks == 10
    assert engine.runner.cache.nbytes == 10 * 16384


def test_unsupported_architecture_and_missing_config(tmp_path) -> None:
    with pytest.raises(ValueError, match="not supported"):
        ModelConfig.from_hf({"model_type": "gpt2", "hidden_size": 8})
    with pytest.raises(ValueError, match="no HF config.json"):
        ModelConfig.from_hf(tmp_path)
