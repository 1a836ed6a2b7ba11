"""servecast's server driven by the official openai client over real loopback HTTP."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import SamplingParams
from tests.app.serve.helpers import ids_of, running_server, tiny_engine, wait_for, word_tokenizer
from tests.tiny_models import random_prompts


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def server(tokenizer):
    with running_server(tokenizer) as (url, state):
        yield url, state


@pytest.fixture(scope="module")
def reference():
    """The same weights in-process: what LLMEngine.generate gives greedily."""
    engine = tiny_engine()
    return lambda prompt, n: engine.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0,
                                                                      ignore_eos=True))[0].output_token_ids


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0)


def text_of(prompt: list[int]) -> str:
    return " ".join(f"w{i}" for i in prompt)


def test_greedy_completions_equal_the_engine_streamed_and_not(server, reference) -> None:
    url, _ = server
    prompts = random_prompts([5, 11, 17], seed=3)
    for prompt in prompts:
        expected = reference(prompt, 9)
        whole = client(url).completions.create(model="tiny", prompt=prompt, max_tokens=9, temperature=0,
                                               extra_body={"ignore_eos": True})
        assert ids_of(whole.choices[0].text) == expected and whole.choices[0].finish_reason == "length"
        assert whole.usage.prompt_tokens == len(prompt) and whole.usage.completion_tokens == 9
        chunks = list(client(url).completions.create(model="tiny", prompt=text_of(prompt), max_tokens=9,
                                                     temperature=0, stream=True, extra_body={"ignore_eos": True},
                                                     stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert ids_of(text) == expected
        assert chunks[-1].usage.completion_tokens == 9 and chunks[-2].choices[0].finish_reason == "length"


def test_chat_uses_the_template_and_streams_the_same_tokens(server, tokenizer, reference) -> None:
    url, _ = server
    messages = [{"role": "user", "content": "w7 w8 w9"}]
    expected = reference(tokenizer.chat_prompt(messages), 6)
    whole = client(url).chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                                extra_body={"ignore_eos": True})
    assert ids_of(whole.choices[0].message.content) == expected
    stream = client(url).chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert ids_of("".join(c.choices[0].delta.content or "" for c in chunks)) == expected


def test_stop_strings_end_the_text_before_them(server, reference) -> None:
    url, _ = server
    prompt = random_prompts([6], seed=9)[0]
    expected = reference(prompt, 8)
    stop = f" w{expected[3]} "  # the fourth token's word, whole
    first = next(i for i in range(1, 4) if expected[i] == expected[3])
    out = client(url).completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, stop=[stop],
                                         extra_body={"ignore_eos": True})
    assert ids_of(out.choices[0].text) == expected[:first] and out.choices[0].finish_reason == "stop"


def test_64_concurrent_streams_all_finish(server) -> None:
    url, _ = server
    prompts = random_prompts([3 + i % 13 for i in range(64)], seed=4)

    async def one(aclient: openai.AsyncOpenAI, prompt, n):
        stream = await aclient.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True})
        return [c async for c in stream]

    async def all_of():
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as aclient:
            return await asyncio.gather(*(one(aclient, p, 4 + i % 9) for i, p in enumerate(prompts)))

    results = asyncio.run(all_of())
    for i, chunks in enumerate(results):
        assert len(ids_of("".join(c.choices[0].text for c in chunks))) == 4 + i % 9
        assert chunks[-1].choices[0].finish_reason == "length"


BAD_BODIES = [
    (b"{not json", None),
    (json.dumps({"prompt": [1, 2], "max_tokens": 0}), "max_tokens"),
    (json.dumps({"prompt": [1, 2], "max_tokens": -3}), "max_tokens"),
    (json.dumps({"prompt": [1, 2], "frobnicate": True}), "frobnicate"),
    (json.dumps({"prompt": [1, 2], "temperature": "hot"}), "temperature"),
    (json.dumps({"prompt": [1, 9999]}), "prompt"),
    (json.dumps({"prompt": [1] * 200}), "prompt"),
    (json.dumps({"prompt": [1, 2], "max_tokens": 500}), "max_tokens"),
    (json.dumps({"prompt": []}), "prompt"),
    (json.dumps({"prompt": [1, 2], "n": 2}), "n"),
    (json.dumps({"messages": "hello"}), "messages"),
]


@pytest.mark.parametrize("body, param", BAD_BODIES)
def test_bad_input_gets_400_naming_the_field_and_the_next_request_is_served(server, body, param) -> None:
    url, _ = server
    path = "/chat/completions" if b"messages" in (body if isinstance(body, bytes) else body.encode()) else "/completions"
    response = httpx.post(url + path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    good = client(url).completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=2, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert good.usage.completion_tokens == 2


def test_an_unknown_model_is_404_and_models_lists_the_served_one(server) -> None:
    url, _ = server
    assert [m.id for m in client(url).models.list().data] == ["tiny"]
    with pytest.raises(openai.NotFoundError):
        client(url).completions.create(model="gpt-4", prompt=[1, 2], max_tokens=2)
    assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200


def metric_values(url: str) -> dict[str, float]:
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def test_metrics_parse_and_count_the_requests_served(server) -> None:
    url, state = server
    before = metric_values(url)
    prompts = random_prompts([4, 8, 12], seed=11)
    for p in prompts:
        client(url).completions.create(model="tiny", prompt=p, max_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True})
    wait_for(lambda: state.loop.outstanding == 0)
    after = metric_values(url)
    assert after["vllm:request_success_total"] - before.get("vllm:request_success_total", 0) == 3
    assert after["vllm:prompt_tokens_total"] - before.get("vllm:prompt_tokens_total", 0) == sum(map(len, prompts))
    assert after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0) == 15
    assert after["vllm:e2e_request_latency_seconds_count"] - before.get("vllm:e2e_request_latency_seconds_count",
                                                                         0) == 3
    assert after["vllm:inter_token_latency_seconds_count"] - before.get("vllm:inter_token_latency_seconds_count",
                                                                         0) == 12
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_count", "vllm:prefix_cache_hits_total",
                 "vllm:prefix_cache_queries_total"):
        assert name in after


def test_usage_reports_the_prompt_tokens_found_in_the_prefix_cache(server) -> None:
    url, state = server
    prompt = random_prompts([40], seed=23)[0]  # block size 4: ten full blocks
    first = client(url).completions.create(model="tiny", prompt=prompt, max_tokens=2)
    again = client(url).completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # The last block is recomputed for the first output token's logits, as vLLM does.
    assert 32 <= again.usage.prompt_tokens_details.cached_tokens < 40
