"""Tensor parallelism: TP=2 on CPU (two processes over gloo) serves the same greedy tokens as TP=1."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, ModelConfig, SamplingParams
from engine.tp_shard import kv_heads_of, shard_config, shard_state_dict
from tests.tiny_models import hf_greedy, hf_logits, hf_model, random_prompts

MAX_NEW = 10
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)


def serve_staggered(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams = GREEDY):
    """A new request every other step, joining the running ones; outputs by request index."""
    finished = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending and step % 2 == 0:
            i, prompt = pending.pop(0)
            engine.add_request(str(i), prompt, params)
        for o in engine.step():
            if o.finished:
                finished[int(o.request_id)] = o
        step += 1
    return [finished[i] for i in range(len(prompts))]


def shared_prefix_prompts(seed: int) -> list[list[int]]:
    system = random_prompts([16], seed=seed + 100)[0]
    users = random_prompts([4, 14, 9, 20, 3, 25], seed=seed)
    return [system + u if i % 2 == 0 else u for i, u in enumerate(users)]


def served_on_one_and_two_ranks(name: str, prompts: list[list[int]], check=None, **options) -> dict:
    """Outputs of serve_staggered on one rank and on two, with paging, chunked prefill (16-token
    budget), prefix caching and a 22-block pool that forces preemptions; check(engine, ranks) runs
    on each engine after serving, before it closes."""
    config = dict(block_size=4, num_blocks=22, max_num_seqs=8, max_num_batched_tokens=16, max_model_len=256)
    results = {}
    for world in (1, 2):
        engine = LLMEngine.from_hf(hf_model(name), EngineConfig(tensor_parallel_size=world, **options, **config))
        try:
            results[world] = serve_staggered(engine, prompts)
            if check is not None:
                check(engine, world)
        finally:
            engine.close()
    return results


def assert_two_ranks_serve_as_one(name: str, prompts: list[list[int]], results: dict) -> None:
    """Two ranks give one rank's greedy tokens, which are transformers'; and the run did preempt and
    hit the prefix cache."""
    tokens = {world: [o.output_token_ids for o in outs] for world, outs in results.items()}
    assert tokens[2] == tokens[1]
    assert tokens[1] == [hf_greedy(hf_model(name), p, MAX_NEW) for p in prompts]
    assert sum(o.num_preemptions for o in results[2]) > 0
    assert sum(o.num_cached_prompt_tokens for o in results[2]) > 0


@pytest.mark.parametrize("name", ["qwen2-bias", "llama-mqa-tied", "mistral-swa"])
def test_tp2_greedy_equals_tp1_with_paging_prefix_caching_chunking_and_preemption(name: str) -> None:
    # qwen2-bias: KV heads split 1 per rank, q/k/v and o biases; llama-mqa-tied: its one KV head
    # replicated on both ranks, LM head tied to the vocabulary-parallel embedding; mistral-swa:
    # sliding windows. A 22-block pool forces preemptions; the shared system prompt, cache hits.
    prompts = shared_prefix_prompts(seed=7)
    results = served_on_one_and_two_ranks(
        name, prompts, check=lambda engine, world: engine.scheduler.block_manager.check_invariants())
    assert_two_ranks_serve_as_one(name, prompts, results)


@pytest.mark.parametrize("name, expert_parallel", [("mixtral-moe", True), ("qwen2moe-shared", True),
                                                    ("mixtral-moe", False)])
def test_moe_ep2_and_tp2_equal_one_rank(name: str, expert_parallel: bool) -> None:
    # Expert parallel: each rank holds half the experts whole, tokens go to them by all-to-all;
    # otherwise each rank holds half of every expert. Attention is tensor parallel either way.
    # Same setting as the dense case: paging, chunked prefill, prefix caching and preemption.
    prompts = shared_prefix_prompts(seed=11)

    def half_the_experts_whole_on_each_rank(engine: LLMEngine, world: int) -> None:
        if world == 2 and expert_parallel:
            moe = next(m for m in engine.model.modules() if type(m).__name__ == "SparseMoE")
            assert moe.expert_parallel and len(moe.experts) == moe.num_experts // 2
    results = served_on_one_and_two_ranks(name, prompts, check=half_the_experts_whole_on_each_rank,
                                          expert_parallel=expert_parallel)
    assert_two_ranks_serve_as_one(name, prompts, results)


def test_expert_parallel_serves_a_lone_request_whose_decodes_leave_a_rank_no_tokens() -> None:
    # One decode token over two ranks: rank 1 routes nothing and still takes part in the exchanges.
    prompt = random_prompts([9], seed=1)[0]
    engine = LLMEngine.from_hf(hf_model("mixtral-moe"), EngineConfig(tensor_parallel_size=2, expert_parallel=True,
                                                                     block_size=4, num_blocks=64))
    try:
        out = engine.generate([prompt], GREEDY)[0].output_token_ids
    finally:
        engine.close()
    assert out == hf_greedy(hf_model("mixtral-moe"), prompt, MAX_NEW)


def test_expert_parallel_sizes_that_do_not_divide_the_experts_are_refused() -> None:
    config = ModelConfig.from_hf(hf_model("qwen2moe-shared").config)  # 6 experts
    import dataclasses
    with pytest.raises(ValueError, match="does not divide the model's number of experts"):
        shard_config(dataclasses.replace(config, expert_parallel=True), 4)
    with pytest.raises(ValueError, match="expert_parallel needs a mixture-of-experts model"):
        LLMEngine(ModelConfig.from_hf(hf_model("qwen2-bias").config), EngineConfig(expert_parallel=True))


def test_tp2_row_parallel_biases_are_added_once() -> None:
    # o_proj and down_proj biases (Llama attention_bias / mlp_bias): the ranks' partial sums are
    # added up, so a bias on every rank would count world times.
    import transformers

    torch.manual_seed(4)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
        vocab_size=256, max_position_embeddings=256, attention_bias=True, mlp_bias=True)).eval()
    with torch.no_grad():
        for param_name, param in hf.named_parameters():
            if param_name.endswith("bias"):
                param.normal_(0.0, 0.1)
    prompts = random_prompts([6, 17, 11], seed=3)
    engine = LLMEngine.from_hf(hf, EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=16,
                                                tensor_parallel_size=2))
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True, return_prompt_logits=True)
    try:
        outputs = engine.generate(prompts, params)
    finally:
        engine.close()
    assert [o.output_token_ids for o in outputs] == [hf_greedy(hf, p, MAX_NEW) for p in prompts]
    for o, prompt in zip(outputs, prompts):
        torch.testing.assert_close(o.prompt_logits, hf_logits(hf, prompt), atol=1e-4, rtol=1e-4)


def test_tp2_with_a_vocabulary_that_does_not_split_evenly_and_prompt_logits() -> None:
    # 101 tokens over 2 ranks: the last rank's vocabulary slice is padded and the padding cut.
    config = ModelConfig.from_hf(dict(model_type="llama", hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                      vocab_size=101, max_position_embeddings=128))
    prompts = random_prompts([9, 23, 4], seed=5, vocab=101)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, return_prompt_logits=True)
    outs = {}
    for tp in (1, 2):
        engine = LLMEngine(config, EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=16,
                                                tensor_parallel_size=tp), random_seed=3)
        try:
            outs[tp] = engine.generate(prompts, params)
        finally:
            engine.close()
    for one, two in zip(outs[1], outs[2]):
        assert two.output_token_ids == one.output_token_ids
        assert two.prompt_logits.shape == (len(one.prompt_token_ids), 101)
        torch.testing.assert_close(two.prompt_logits, one.prompt_logits, atol=1e-4, rtol=1e-4)


def test_tp2_with_ngram_speculation_keeps_greedy_output() -> None:
    name = "qwen2-bias"
    prompts = [p * 3 for p in random_prompts([5, 7, 4], seed=11)]  # repeats give n-gram matches
    engine = LLMEngine.from_hf(hf_model(name), EngineConfig(
        block_size=4, num_blocks=128, max_num_batched_tokens=32, tensor_parallel_size=2,
        speculative_method="ngram", num_speculative_tokens=3))
    try:
        outputs = engine.generate(prompts, GREEDY)
    finally:
        engine.close()
    assert [o.output_token_ids for o in outputs] == [hf_greedy(hf_model(name), p, MAX_NEW) for p in prompts]
    assert sum(o.num_draft_tokens for o in outputs) > 0


def _config(heads: int, kv_heads: int, intermediate: int = 96) -> ModelConfig:
    return ModelConfig.from_hf(dict(model_type="llama", hidden_size=heads * 16, num_hidden_layers=1,
                                    num_attention_heads=heads, num_key_value_heads=kv_heads,
                                    intermediate_size=intermediate, vocab_size=64, max_position_embeddings=64))


@pytest.mark.parametrize("heads, kv_heads, intermediate, world, words", [
    (4, 2, 96, 3, "does not divide the model's 4 attention heads: use tensor_parallel_size in [1, 2, 4]"),
    (12, 3, 96, 4, "neither divides the model's 3 KV heads nor is a multiple"),
    (4, 4, 90, 4, "does not divide the model's intermediate size 90"),
])
def test_a_tensor_parallel_size_that_cannot_split_the_model_is_refused_before_any_rank_starts(
        heads: int, kv_heads: int, intermediate: int, world: int, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        LLMEngine(_config(heads, kv_heads, intermediate), EngineConfig(num_blocks=8, tensor_parallel_size=world))


@pytest.mark.parametrize("heads, kv_heads, world", [(8, 4, 2), (8, 2, 4), (8, 1, 4), (4, 4, 4)])
def test_shards_partition_the_query_heads_and_cover_every_kv_head(heads: int, kv_heads: int, world: int) -> None:
    from engine.model import DecoderModel

    config = _config(heads, kv_heads)
    model = DecoderModel(config, 64)
    model.init_random(0)
    state = model.state_dict()
    qkv = state["layers.0.self_attn.qkv_proj.weight"]
    shard = shard_config(config, world)
    shards = [shard_state_dict(state, config, r, world) for r in range(world)]
    d = config.head_dim
    # Query rows: the ranks' slices, in rank order, are the whole.
    queries = torch.cat([s["layers.0.self_attn.qkv_proj.weight"][:shard.q_size] for s in shards])
    assert torch.equal(queries, qkv[:config.q_size])
    # Each rank's K rows are the KV heads its query heads read (GQA group = heads / kv_heads).
    group = heads // kv_heads
    for r, s in enumerate(shards):
        first_query_head = r * shard.num_heads
        assert kv_heads_of(config, r, world).start == first_query_head // group
        k_rows = s["layers.0.self_attn.qkv_proj.weight"][shard.q_size:shard.q_size + shard.kv_size]
        kv = kv_heads_of(config, r, world)
        assert torch.equal(k_rows, qkv[config.q_size + kv.start * d:config.q_size + kv.stop * d])
    covered = {h for r in range(world) for h in kv_heads_of(config, r, world)}
    assert covered == set(range(kv_heads))
    # Row-parallel o_proj: the column slices put side by side are the whole.
    o_proj = torch.cat([s["layers.0.self_attn.o_proj.weight"] for s in shards], dim=1)
    assert torch.equal(o_proj, state["layers.0.self_attn.o_proj.weight"])
