"""A real server on loopback for the tests: a tiny random-weight model behind uvicorn in a thread,
and a word-level HF tokenizer folder (token i is the word "w<i>") so text maps back to ids."""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from pathlib import Path

import uvicorn

from app.serve.api import ServerState, build_app
from app.serve.engine_process import EngineClient
from app.serve.metrics import ServerMetrics
from app.serve.tokenizers import HFTokenizer
from engine import LLMEngine
from tests.device import engine_config
from tests.tiny_models import VOCAB, hf_model

MODEL = "llama-mha-hd32"


def word_tokenizer(folder: Path) -> HFTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw).save_pretrained(folder)
    return HFTokenizer(folder)


def ids_of(text: str) -> list[int]:
    return [int(w[1:]) for w in text.split()]


def tiny_engine(**settings) -> LLMEngine:
    config = dict(block_size=4, num_blocks=256, max_model_len=128, max_num_batched_tokens=64, max_num_seqs=64)
    return LLMEngine.from_hf(hf_model(MODEL), engine_config(**{**config, **settings}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_engine_source(**settings) -> tuple[LLMEngine, str]:
    """What the engine process builds (picklable as a functools.partial)."""
    return tiny_engine(**settings), "tiny"


@contextlib.contextmanager
def running_server(tokenizer, max_queued_requests: int | None = None, **engine_settings):
    """(base url, ServerState) of a server on a free loopback port (its engine, tiny_engine with
    these settings, in a process of its own), stopped on exit."""
    metrics = ServerMetrics("tiny")
    client = EngineClient(functools.partial(tiny_engine_source, **engine_settings), metrics)
    state = ServerState(client, tokenizer, "tiny", metrics, max_queued_requests)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1", state
    finally:
        server.should_exit = True
        thread.join(30)
        client.stop()


def wait_for(condition, timeout: float = 30.0) -> None:
    """Poll until condition() holds (the server's state changes on its own thread)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not hold in time")
        time.sleep(0.02)
