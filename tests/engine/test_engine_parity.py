"""The engine's greedy outputs and prefill logits equal transformers' own models, token for token."""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams
from tests.device import engine_config
from tests.tiny_models import CONFIGS, hf_greedy, hf_logits, hf_model, random_prompts

MAX_NEW = 10
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)


def engine_for(name: str, **overrides) -> LLMEngine:
    base = dict(block_size=4, num_blocks=256, max_num_seqs=16, max_num_batched_tokens=64, max_model_len=256)
    base.update(overrides)
    return LLMEngine.from_hf(hf_model(name), engine_config(**base))


def references(name: str, prompts: list[list[int]]) -> list[list[int]]:
    return [hf_greedy(hf_model(name), p, MAX_NEW) for p in prompts]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_greedy_matches_transformers(name: str, block_size: int) -> None:
    prompts = random_prompts([7, 18, 33, 1], seed=block_size)
    engine = engine_for(name, block_size=block_size)
    outputs = engine.generate(prompts, GREEDY)
    assert [o.output_token_ids for o in outputs] == references(name, prompts)
    assert all(o.finish_reason == "length" for o in outputs)
    engine.scheduler.block_manager.check_invariants()
    assert engine.scheduler.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("name", ["qwen2-bias", "llama-mqa-tied"])
def test_plain_torch_linears_match_too(name: str) -> None:
    # The CUDA path: F.linear on unpacked weights (CPU tests otherwise use oneDNN-packed GEMMs).
    prompts = random_prompts([12, 29], seed=13)
    engine = engine_for(name, pack_cpu_weights=False)
    assert all(m.packed is None for m in engine.model.modules() if hasattr(m, "packed"))
    assert [o.output_token_ids for o in engine.generate(prompts, GREEDY)] == references(name, prompts)


@pytest.mark.parametrize("name", ["llama-gqa-hd64", "mistral-swa"])
def test_requests_arriving_while_others_decode(name: str) -> None:
    prompts = random_prompts([5, 21, 9, 40, 3, 17], seed=1)
    engine = engine_for(name)
    outputs: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending and step % 3 == 0:  # a new arrival every third step, joining running decodes
            i, prompt = pending.pop(0)
            engine.add_request(str(i), prompt, GREEDY)
        for o in engine.step():
            if o.finished:
                outputs[o.request_id] = o.output_token_ids
        step += 1
    assert [outputs[str(i)] for i in range(len(prompts))] == references(name, prompts)


@pytest.mark.parametrize("name", ["llama-mha-hd32", "qwen2-bias", "mistral-swa", "mixtral-moe"])
def test_small_token_budget_forces_chunked_prefill(name: str) -> None:
    prompts = random_prompts([30, 23, 45, 6], seed=2)
    engine = engine_for(name, max_num_batched_tokens=8)
    seen_chunk = []
    original = engine.scheduler.schedule

    def spy(now: float = 0.0):
        out = original(now)
        assert out.num_batched_tokens <= 8
        seen_chunk.extend(c for c in out.chunks if c.is_prefill and not c.samples)
        return out

    engine.scheduler.schedule = spy
    outputs = engine.generate(prompts, GREEDY)
    assert seen_chunk, "no prompt was split into chunks"
    assert [o.output_token_ids for o in outputs] == references(name, prompts)


@pytest.mark.parametrize("name", ["llama-gqa-hd64", "qwen3-qknorm", "mixtral-moe", "qwen2moe-shared"])
def test_tiny_kv_pool_preempts_and_still_matches(name: str) -> None:
    prompts = random_prompts([20, 25, 18, 30, 22], seed=3)
    # 16 blocks of 4 tokens hold one request at full length (<= 40 tokens) but not five.
    engine = engine_for(name, num_blocks=16, block_size=4, enable_prefix_caching=False)
    outputs = engine.generate(prompts, GREEDY)
    assert sum(o.num_preemptions for o in outputs) > 0
    assert [o.output_token_ids for o in outputs] == references(name, prompts)


@pytest.mark.parametrize("name", ["llama-mha-hd32", "mistral-swa", "qwen2-bias", "qwen2moe-shared"])
def test_shared_prefixes_hit_the_prefix_cache(name: str) -> None:
    system = random_prompts([26], seed=4)[0]
    tails = random_prompts([3, 9, 1, 14], seed=5)
    prompts = [system + t for t in tails]
    engine = engine_for(name, block_size=4)
    first = engine.generate(prompts[:1], GREEDY)
    rest = engine.generate(prompts[1:], GREEDY)
    outputs = first + rest
    assert all(o.num_cached_prompt_tokens >= 24 for o in rest)
    assert [o.output_token_ids for o in outputs] == references(name, prompts)


def test_preemption_with_prefix_caching_and_chunking_together() -> None:
    name = "llama-gqa-hd64"
    system = random_prompts([13], seed=6)[0]
    prompts = [system + t for t in random_prompts([4, 11, 2, 17, 8, 5], seed=7)]
    engine = engine_for(name, num_blocks=14, block_size=4, max_num_batched_tokens=12)
    outputs = engine.generate(prompts, GREEDY)
    assert sum(o.num_preemptions for o in outputs) > 0
    assert sum(o.num_cached_prompt_tokens for o in outputs) > 0
    assert [o.output_token_ids for o in outputs] == references(name, prompts)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prefill_logits_match_transformers(name: str) -> None:
    system = random_prompts([19], seed=8)[0]
    prompts = [system + t for t in random_prompts([11, 30], seed=9)] + random_prompts([37], seed=10)
    # Budget 16: prompts are prefilled in chunks. A request for prompt logits computes its whole
    # prompt (reads no cache) but fills the cache for later requests.
    engine = engine_for(name, max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=1, temperature=0.0, return_prompt_logits=True)
    outputs = [engine.generate([p], params)[0] for p in prompts]
    assert all(o.num_cached_prompt_tokens == 0 for o in outputs)
    later = engine.generate([prompts[1]], SamplingParams(max_tokens=1, temperature=0.0))[0]
    assert later.num_cached_prompt_tokens >= 16
    for prompt, out in zip(prompts, outputs):
        assert out.prompt_logits.shape == (len(prompt), 256)
        torch.testing.assert_close(out.prompt_logits, hf_logits(hf_model(name), prompt), atol=1e-4, rtol=0)


def test_loads_a_local_safetensors_directory(tmp_path) -> None:
    name = "qwen2-bias"
    hf_model(name).save_pretrained(tmp_path)
    engine = LLMEngine.from_hf(str(tmp_path), engine_config(block_size=4, num_blocks=64, max_model_len=128))
    prompts = random_prompts([9, 14], seed=11)
    outputs = engine.generate(prompts, GREEDY)
    assert [o.output_token_ids for o in outputs] == references(name, prompts)


def test_bfloat16_runs_and_tracks_float32() -> None:
    name = "llama-gqa-hd64"
    prompt = random_prompts([24], seed=12)[0]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, return_prompt_logits=True)
    out = engine_for(name, dtype="bfloat16").generate([prompt], params)[0]
    reference = hf_logits(hf_model(name), prompt)
    assert out.prompt_logits.dtype == torch.float32 and len(out.output_token_ids) == 4
    # bfloat16 keeps ~3 significant digits: the logits agree to bf16 precision, not to 1e-4.
    err = (out.prompt_logits - reference).abs().max().item()
    assert err < 0.05 * reference.abs().max().item()
    assert (out.prompt_logits.argmax(-1) == reference.argmax(-1)).float().mean().item() > 0.9


def test_many_concurrent_decodes_of_different_lengths() -> None:
    # Enough sequences, of spread-out lengths, that decodes are split into several padded batches.
    name = "llama-gqa-hd64"
    prompts = random_prompts([3 + 5 * i for i in range(40)], seed=14)
    engine = engine_for(name, max_num_seqs=40, max_num_batched_tokens=512, num_blocks=1024)
    outputs = engine.generate(prompts, GREEDY)
    assert [o.output_token_ids for o in outputs] == references(name, prompts)
