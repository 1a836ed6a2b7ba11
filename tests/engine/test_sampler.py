"""Sampling: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.sampler import probabilities, sample
from tests.device import engine_config
from tests.tiny_models import hf_greedy, hf_model, random_prompts


def engine() -> LLMEngine:
    return LLMEngine.from_hf(hf_model("llama-gqa-hd64"),
                             engine_config(block_size=4, num_blocks=128, max_model_len=128, seed=1))


def test_top_k_and_top_p_keep_the_right_tokens() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])
    p = probabilities(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (p > 0).tolist() == [True, False, False, False, True]
    full = logits.softmax(-1)
    # top_p just above the largest probability keeps the top two tokens.
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=float(full.max()) + 0.01))
    assert (p > 0).tolist() == [True, False, False, False, True]
    torch.testing.assert_close(p.sum(), torch.tensor(1.0))
    cold = probabilities(logits, SamplingParams(temperature=0.1))
    assert cold.argmax().item() == 4 and cold.max() > full.max()


def test_sampling_follows_the_distribution() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]]).repeat(6000, 1)
    gen = torch.Generator().manual_seed(0)
    tokens = sample(logits, [SamplingParams(temperature=1.0)] * 6000, [gen] * 6000)
    freq = torch.bincount(torch.tensor(tokens), minlength=3).float() / 6000
    torch.testing.assert_close(freq, logits[0].softmax(-1), atol=0.03, rtol=0)


def test_seeded_requests_repeat_whatever_else_is_in_the_batch() -> None:
    prompts = random_prompts([6, 13, 4], seed=30)
    seeded = SamplingParams(max_tokens=8, temperature=0.9, top_k=50, top_p=0.95, seed=1234, ignore_eos=True)
    alone = engine().generate([prompts[0]], seeded)[0].output_token_ids
    other = SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)
    batched = engine().generate(prompts, [other, seeded, other])
    again = engine().generate([prompts[1], prompts[0]], [other, seeded])
    assert batched[0].output_token_ids != [] and again[1].output_token_ids == alone
    different_seed = engine().generate([prompts[0]], SamplingParams(max_tokens=8, temperature=0.9, top_k=50,
                                                                    top_p=0.95, seed=99, ignore_eos=True))[0]
    assert different_seed.output_token_ids != alone


def test_top_k_one_is_greedy() -> None:
    prompts = random_prompts([9, 3], seed=31)
    greedy = engine().generate(prompts, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    top1 = engine().generate(prompts, SamplingParams(max_tokens=6, temperature=1.5, top_k=1, ignore_eos=True))
    assert [o.output_token_ids for o in greedy] == [o.output_token_ids for o in top1]


def test_stop_token_and_eos() -> None:
    prompt = random_prompts([7], seed=32)[0]
    free = engine().generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    third = free.output_token_ids[2]
    stopped = engine().generate([prompt], SamplingParams(max_tokens=6, temperature=0.0,
                                                         stop_token_ids=(third,)))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.output_token_ids == free.output_token_ids[:free.output_token_ids.index(third) + 1]
    eng = engine()
    eng.scheduler.eos_token_ids = frozenset({third})  # as if the model's EOS were that token
    eos = eng.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0))[0]
    assert eos.finish_reason == "stop" and eos.output_token_ids[-1] == third
    eng = engine()
    eng.scheduler.eos_token_ids = frozenset({third})
    ignored = eng.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    assert ignored.output_token_ids == free.output_token_ids and ignored.finish_reason == "length"


def test_timings_are_recorded() -> None:
    out = engine().generate(random_prompts([5], seed=33), SamplingParams(max_tokens=5, temperature=0.0,
                                                                        ignore_eos=True))[0]
    assert out.arrival_time <= out.first_scheduled_time <= out.first_token_time <= out.finish_time
    assert len(out.token_times) == 5 and out.token_times == sorted(out.token_times)
    assert out.ttft_s >= 0 and out.tpot_s >= 0 and out.e2e_s >= out.ttft_s


def test_min_tokens_holds_off_eos_and_stop_tokens() -> None:
    model = hf_model("llama-mha-hd32")
    prompt = random_prompts([7], seed=5)[0]
    first = hf_greedy(model, prompt, 1)[0]
    config = engine_config(block_size=4, num_blocks=32, max_model_len=64)
    engine = LLMEngine.from_hf(model, config)
    stop_at_first = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(first,))
    (early,) = engine.generate([prompt], stop_at_first)
    assert early.output_token_ids == [first] and early.finish_reason == "stop"
    held = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(first,), min_tokens=5)
    (late,) = engine.generate([prompt], held)
    assert len(late.output_token_ids) >= 5 and first not in late.output_token_ids[:5]
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
