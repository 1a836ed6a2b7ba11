"""Context parallelism: CP=2 on CPU (two processes over gloo, ring attention) serves what CP=1 serves.

CP=2 with block_size=b schedules exactly like CP=1 with block_size=2b (the block manager's block
is b positions on each rank), so the two engines make the same decisions (prefix hits,
preemptions) and any difference is the attention's.
"""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine import ring_attention
from engine.ring_attention import combine, partial_attention
from tests.engine.test_tensor_parallel import serve_staggered
from tests.tiny_models import hf_greedy, hf_logits, hf_model, random_prompts

MAX_NEW = 8
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)


def long_prompts(seed: int) -> list[list[int]]:
    """Several hundred tokens each, half of them behind a shared 160-token system prompt."""
    system = random_prompts([160], seed=seed + 100)[0]
    users = random_prompts([150, 230, 60, 310, 3], seed=seed)
    return [system + u if i % 2 == 0 else u for i, u in enumerate(users)]


def engine(name: str, cp: int, block_size: int, **options) -> LLMEngine:
    config = dict(num_blocks=70, max_num_seqs=4, max_num_batched_tokens=128, max_model_len=512)
    config.update(options)
    return LLMEngine.from_hf(hf_model(name), EngineConfig(context_parallel_size=cp, block_size=block_size, **config))


def serve_on_one_and_two_ranks(name: str, prompts: list[list[int]], params: SamplingParams = GREEDY,
                               **options) -> dict:
    results = {}
    for cp, block_size in ((1, 8), (2, 4)):
        e = engine(name, cp, block_size, **options)
        try:
            results[cp] = serve_staggered(e, prompts, params)
            e.scheduler.block_manager.check_invariants()
        finally:
            e.close()
    return results


@pytest.mark.parametrize("name", ["llama-gqa-hd64", "mistral-swa", "qwen3-qknorm"])
def test_cp2_greedy_equals_cp1_on_long_prompts_with_paging_prefix_caching_and_preemption(name: str) -> None:
    # llama-gqa-hd64: grouped-query attention and llama3 rope; mistral-swa: a 12-token sliding
    # window, far shorter than the prompts; qwen3-qknorm: per-head q/k norms. A 70-block pool
    # (560 positions) cannot hold the running requests at once: preemptions; the shared system
    # prompt: prefix-cache hits; a 128-token budget: chunked prefills that attend over the cache.
    prompts = long_prompts(seed=7)
    results = serve_on_one_and_two_ranks(name, prompts)
    tokens = {cp: [o.output_token_ids for o in outs] for cp, outs in results.items()}
    assert tokens[2] == tokens[1]
    assert tokens[1] == [hf_greedy(hf_model(name), p, MAX_NEW) for p in prompts]
    assert sum(o.num_preemptions for o in results[2]) > 0
    assert sum(o.num_cached_prompt_tokens for o in results[2]) > 0


def test_cp2_prefill_logits_match_cp1_and_transformers() -> None:
    name = "llama-gqa-hd64"
    prompts = random_prompts([333, 17], seed=2)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, return_prompt_logits=True)
    results = serve_on_one_and_two_ranks(name, prompts, params)
    for one, two, prompt in zip(results[1], results[2], prompts):
        assert two.prompt_logits.shape == (len(prompt), 256)
        torch.testing.assert_close(two.prompt_logits, one.prompt_logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(two.prompt_logits, hf_logits(hf_model(name), prompt), atol=1e-4, rtol=1e-4)


def test_prompts_shorter_than_the_ranks_and_kv_int8_and_ngram_speculation() -> None:
    # Prompts of 1-3 tokens sit on rank 0 alone (4 positions per rank and block): rank 1 computes
    # nothing for them yet takes part in every exchange. Quantized KV is dequantized on each rank;
    # verification chunks attend with the decodes, gathered on every rank.
    name = "qwen2-bias"
    prompts = random_prompts([1, 2, 3], seed=4) + [p * 3 for p in random_prompts([40, 70], seed=11)]
    results = serve_on_one_and_two_ranks(name, prompts, kv_cache_dtype="int8", speculative_method="ngram",
                                         num_speculative_tokens=3)
    tokens = {cp: [o.output_token_ids for o in outs] for cp, outs in results.items()}
    assert tokens[2] == tokens[1]
    assert sum(o.num_draft_tokens for o in results[2]) > 0


@pytest.mark.parametrize("options, words", [
    (dict(context_parallel_size=0), "context_parallel_size must be at least 1"),
    (dict(context_parallel_size=2, tensor_parallel_size=2), "composes with tensor_parallel_size=1 only"),
])
def test_bad_context_parallel_sizes_are_refused_before_any_rank_starts(options: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        EngineConfig(**options)


def test_a_cp_engine_holds_its_share_of_each_block() -> None:
    # The block manager's block is 2 x 4 positions; each rank's cache holds 4 of them per block.
    e = engine("llama-mha-hd32", 2, 4)
    try:
        assert e.scheduler.block_manager.block_size == 8
        assert e.runner.cache.block_size == 4
        assert e.runner.cache.k[0].shape[1] == 70
    finally:
        e.close()


@pytest.mark.parametrize("fused", [True, False])
def test_partial_attentions_over_disjoint_keys_combine_into_full_attention(fused: bool, monkeypatch) -> None:
    # fused: torch's CPU flash kernel (it returns the log-sum-exp); else the plain one (other devices).
    if not fused:
        monkeypatch.setattr(ring_attention, "_CPU_FLASH", None)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 8, generator=gen)
    k, v = (torch.randn(1, 2, 6, 8, generator=gen).repeat_interleave(2, dim=1) for _ in range(2))
    mask = torch.rand(1, 1, 5, 6, generator=gen) > 0.3
    mask[..., 0] = True  # every query sees a key
    mask[..., 2, 1:] = False  # query 2 sees key 0 alone
    full, full_lse = partial_attention(q, k, v, mask, 0.3)
    split = torch.zeros(6, dtype=torch.bool)
    split[[0, 3]] = True
    left = partial_attention(q, k, v, mask & split, 0.3)
    right = partial_attention(q, k, v, mask & ~split, 0.3)
    assert torch.isinf(right[1][..., 2]).all()  # query 2 sees no key on the right: it weighs nothing there
    out, lse = combine(*left, *right)
    torch.testing.assert_close(out, full)
    torch.testing.assert_close(lse, full_lse)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(full, reference)
