"""The OpenAI-compatible HTTP API over one engine process (FastAPI): /v1/completions and
/v1/chat/completions (streamed as server-sent events, or whole), /v1/models, /health, /metrics.

Every refusal is an HTTP 4xx with an OpenAI-style body, {"error": {"message", "type", "param",
"code"}}, decided before the request reaches the engine, so a bad request costs the others
nothing. A client that goes away mid-request has its request aborted (its KV blocks freed).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from app.serve.engine_process import EngineClient, call_each
from app.serve.generation import Generation
from app.serve.metrics import ServerMetrics
from app.serve.protocol import ChatCompletionRequest, CompletionRequest
from app.serve.tokenizers import Tokenizer
from engine.policy.sampling_params import SamplingParams

COMPLETION_DEFAULT_MAX_TOKENS = 16  # the OpenAI completions API's default; chat fills the context


@dataclass
class ServerState:
    loop: EngineClient
    tokenizer: Tokenizer
    model_name: str
    metrics: ServerMetrics
    max_queued_requests: int | None = None
    # The server as the simulator sees it (calibrate/runs/deployment.py), in the model card: servecast
    # replay records it, so the replay can be simulated.
    deployment: dict | None = None
    created: int = 0
    # request id -> where its outputs go, for every stream still open (drain() ends them).
    streams: dict = field(default_factory=dict)
    event_loop: asyncio.AbstractEventLoop | None = None  # uvicorn's, once the app has started

    def drain(self, reason: str) -> int:
        """End every open stream with an error event (its engine request aborted): a shutdown
        whose grace period is running out. Call on the event loop; returns how many it ended."""
        ended = list(self.streams.items())
        for request_id, put in ended:
            put(reason)  # a string on a request's queue is its error (next_delta)
            self.loop.abort(request_id)
        return len(ended)


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.headers = status, message, param, kind, headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def validation_error(exc: ValidationError) -> ApiError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"] if not isinstance(p, int) or p != 0) or None
    where = f"{param}: " if param else ""
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = f"unknown field {param!r}: remove it (see /docs for the fields taken)"
    elif first["type"].startswith("literal"):
        message = f"{where}{message} (other values are not supported)"
    else:
        message = f"{where}{message}"
    return ApiError(400, message, param)


async def parse_body(request: Request, model):
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON ({exc}): send a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


def build_app(state: ServerState) -> FastAPI:
    """The app. Its lifespan points the engine's deliveries at uvicorn's event loop (one
    call_soon_threadsafe a step) and stops the engine process once uvicorn has drained the requests
    in flight."""

    @asynccontextmanager
    async def lifespan(_):
        event_loop = state.event_loop = asyncio.get_running_loop()
        state.loop.deliver = lambda batch: event_loop.call_soon_threadsafe(call_each, batch)
        yield
        state.loop.stop()

    app = FastAPI(title="servecast", summary="servecast's engine behind the OpenAI API", lifespan=lifespan)
    app.state.serve = state
    state.created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(_, exc: ApiError):
        return exc.response()

    @app.get("/health")
    async def health():
        if state.loop.error is not None:
            return JSONResponse({"error": state.loop.error}, status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.exposition(state.loop.state), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "servecast",
                "max_model_len": state.loop.max_model_len}
        if state.deployment is not None:
            card["deployment"] = state.deployment
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse_body(request, CompletionRequest)
        prompt = body.prompt if isinstance(body.prompt, list) else state.tokenizer.encode(body.prompt)
        return await serve(request, body, prompt, "completion")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        prompt = state.tokenizer.chat_prompt([m.model_dump(exclude_none=True) for m in body.messages])
        return await serve(request, body, prompt, "chat")

    async def serve(request: Request, body, prompt: list[int], kind: str):
        if body.model is not None and body.model != state.model_name:
            raise ApiError(404, f"model {body.model!r} is not served here: this server serves "
                                f"{state.model_name!r} (GET /v1/models)", "model", "not_found_error")
        max_len = state.loop.max_model_len
        max_tokens = body.max_tokens
        if max_tokens is None:
            max_tokens = COMPLETION_DEFAULT_MAX_TOKENS if kind == "completion" else max_len - len(prompt)
            if max_tokens <= 0:
                raise ApiError(400, f"the prompt ({len(prompt)} tokens) fills max_model_len={max_len}: "
                                    f"shorten it", "messages" if kind == "chat" else "prompt")
        request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            params = SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_k=body.top_k,
                                    top_p=body.top_p, seed=body.seed, stop_token_ids=tuple(body.stop_token_ids or ()),
                                    ignore_eos=body.ignore_eos, min_tokens=min(body.min_tokens, max_tokens))
            state.loop.check_request(request_id, prompt, params)
        except ValueError as exc:
            text = str(exc).replace(f"request {request_id!r} ", "the prompt ").replace(f"request {request_id!r}: ", "")
            param = "max_tokens" if "max_tokens" in text and body.max_tokens is not None else (
                "messages" if kind == "chat" else "prompt")
            raise ApiError(400, text, param) from None
        limit = state.max_queued_requests
        if limit is not None and state.loop.outstanding - state.loop.state.running >= limit:
            raise ApiError(429, f"{limit} requests are already queued (--max-queued-requests): retry later",
                           kind="rate_limit_error", headers={"Retry-After": "1"})
        outputs: asyncio.Queue = asyncio.Queue()
        state.loop.submit(request_id, prompt, params, outputs.put_nowait, time.perf_counter())  # fed on this loop
        generation = Generation(state.tokenizer, body.stop, len(prompt))
        shaper = Chunks(request_id, state.model_name, kind)
        if body.stream:
            state.streams[request_id] = outputs.put_nowait
            return StreamingResponse(stream(request_id, outputs, generation, shaper, body.include_usage),
                                     media_type="text/event-stream")
        return await collect(request, request_id, outputs, generation, shaper)

    async def next_delta(request_id: str, outputs: asyncio.Queue, generation: Generation):
        item = await outputs.get()
        if isinstance(item, str):
            raise ApiError(500, item, kind="server_error")
        delta = generation.add(item)
        if delta.finish_reason is not None and not item.finished:  # a stop string: the engine stops too
            state.loop.abort(request_id, "stop")
        return delta

    async def stream(request_id, outputs, generation: Generation, shaper: "Chunks", include_usage: bool):
        done = False
        try:
            if (opening := shaper.first()) is not None:
                yield sse(opening)
            while not done:
                try:
                    delta = await next_delta(request_id, outputs, generation)
                except ApiError as exc:
                    yield sse({"error": {"message": exc.message, "type": exc.kind, "code": exc.status}})
                    done = True
                    break
                done = delta.finish_reason is not None
                yield sse(shaper.chunk(delta.text, delta.finish_reason))
            if include_usage:
                yield sse(shaper.usage(generation.usage()))
            yield "data: [DONE]\n\n"
        finally:
            state.streams.pop(request_id, None)
            if not done:  # the client went away: free its blocks
                state.loop.abort(request_id)

    async def collect(request: Request, request_id, outputs, generation: Generation, shaper: "Chunks"):
        getter = None
        try:
            while generation.finish_reason is None:
                getter = getter or asyncio.ensure_future(next_delta(request_id, outputs, generation))
                finished, _ = await asyncio.wait({getter}, timeout=0.5)
                if finished:
                    getter.result()
                    getter = None
                elif await request.is_disconnected():
                    break
        finally:
            if generation.finish_reason is None:
                if getter is not None:
                    getter.cancel()
                state.loop.abort(request_id)
        return shaper.whole(generation.text, generation.finish_reason, generation.usage())

    return app


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


@dataclass
class Chunks:
    """The OpenAI response shapes of one request: streamed chunks and the whole response."""

    request_id: str
    model: str
    kind: str  # "completion" or "chat"

    def __post_init__(self) -> None:
        self.created = int(time.time())

    def _base(self, obj: str) -> dict:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def first(self) -> dict | None:
        """Chat streams open with the assistant role and no text (as OpenAI's and vLLM's do);
        completion streams open with their first token."""
        return self.chunk("", None, opening=True) if self.kind == "chat" else None

    def chunk(self, text: str, finish_reason: str | None, opening: bool = False) -> dict:
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if opening else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._base("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._base("text_completion"), "choices": [choice]}

    def usage(self, usage: dict) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage}

    def whole(self, text: str, finish_reason: str | None, usage: dict) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            return {**self._base("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._base("text_completion"), "choices": [choice], "usage": usage}
