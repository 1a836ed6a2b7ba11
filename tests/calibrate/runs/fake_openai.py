"""A fake OpenAI-compatible completions server on loopback for the replayer's tests: real HTTP
(FastAPI under uvicorn in a thread), vLLM's SSE format, and known timings.

Each streamed completion waits first_token_s, then sends max_tokens chunks of one token each,
token_s apart, then a usage chunk (with stream_options.include_usage) and `data: [DONE]`. A request
whose max_tokens is in reject_max_tokens gets 400 with an OpenAI-style error body. Every request's
JSON body is kept in `received`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MODEL = "fake-model"


@dataclass
class FakeServer:
    first_token_s: float = 0.05
    token_s: float = 0.01
    reject_max_tokens: frozenset[int] = frozenset()
    max_model_len: int | None = None  # told in its /v1/models card, as vLLM's
    received: list[dict] = field(default_factory=list)
    url: str = ""

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict:
            card = {"id": MODEL, "object": "model", "owned_by": "tests"}
            if self.max_model_len is not None:
                card["max_model_len"] = self.max_model_len
            return {"object": "list", "data": [card]}

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.received.append(body)
            n = body["max_tokens"]
            if n in self.reject_max_tokens:
                return JSONResponse({"error": {"message": f"max_tokens={n} is refused", "type": "BadRequestError",
                                               "param": "max_tokens", "code": 400}}, status_code=400)
            return StreamingResponse(self._stream(body, n), media_type="text/event-stream")

        return app

    async def _stream(self, body: dict, n: int):
        prompt = len(body["prompt"])
        await asyncio.sleep(self.first_token_s)
        for i in range(n):
            if i:
                await asyncio.sleep(self.token_s)
            chunk = {"id": "cmpl-1", "object": "text_completion", "created": int(time.time()), "model": MODEL,
                     "choices": [{"index": 0, "text": f" t{i}", "logprobs": None,
                                  "finish_reason": "length" if i == n - 1 else None}]}
            yield f"data: {json.dumps(chunk)}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
            yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"


@contextmanager
def serving(server: FakeServer):
    """The fake server on a free loopback port for the block's duration; server.url is its API base."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    uv = uvicorn.Server(uvicorn.Config(server.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline, "the fake server did not start"
        time.sleep(0.01)
    server.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    try:
        yield server
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        sock.close()
