"""`servecast serve`: the engine behind an OpenAI-compatible HTTP server (FastAPI + uvicorn)."""

from __future__ import annotations

import functools
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from app import engine_flags as flags
from app.common import fail
from app.knob_options import Knobs, takes


@takes(*flags.KNOBS)
def serve_command(
    model: str = typer.Option("demo", help="'demo' (a small bundled Llama, random weights), an HF config.json "
                                           "(random weights) or a local model folder with safetensors"),
    tokenizer: Optional[Path] = typer.Option(None, help="a local HF tokenizer folder (default: byte-level: "
                                                        "token id b is byte b)"),
    served_model_name: Optional[str] = typer.Option(None, help="the model's name in the API (default: the "
                                                               "model argument's)"),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    max_queued_requests: Optional[int] = typer.Option(None, help="requests waiting beyond this get 429 with "
                                                                 "Retry-After (default: no limit)"),
    grace_period: float = typer.Option(30.0, help="on SIGTERM, seconds to let requests in flight finish"),
    knobs: Knobs = None,
    max_model_len: Optional[int] = typer.Option(None, help="default: the model's context, 1024 for demo"),
    device: str = flags.DEVICE, dtype: str = flags.DTYPE,
    quantization: Optional[str] = flags.QUANTIZATION, quant_group_size: int = flags.QUANT_GROUP_SIZE,
    quant_kernel: Optional[str] = flags.QUANT_KERNEL,
    kv_cache_dtype: Optional[str] = flags.KV_CACHE_DTYPE,
    seed: int = typer.Option(0, help="the random weights' seed, and sampling's without a request seed"),
    threads: Optional[int] = typer.Option(None, help="torch's CPU threads in the engine process (default: torch's "
                                          "choice); profile with the same --threads to simulate this server"),
    hardware: Optional[str] = typer.Option(None, help="this device's name in the simulator, as given to servecast "
                                           "profile --hardware (default: cpu-local / cuda-local)"),
) -> None:
    """Serve a model with servecast's engine over the OpenAI API: /v1/completions,
    /v1/chat/completions (streamed or not), /v1/models, /health, /metrics (vLLM's metric names)."""
    import uvicorn

    from app.engine_source import build_engine, sim_model
    from app.serve.api import ServerState, build_app
    from app.serve.engine_process import EngineClient
    from app.serve.metrics import ServerMetrics
    from app.serve.tokenizers import load_tokenizer
    from calibrate.runs.deployment import engine_deployment
    from simulator.catalog.hardware import get_accelerator

    if max_queued_requests is not None and max_queued_requests < 0:
        fail(f"--max-queued-requests must be >= 0, got {max_queued_requests}")
    if not 0 < port < 65536:
        fail(f"--port must be in 1-65535, got {port}")
    if not grace_period >= 0:
        fail(f"--grace-period must be 0 or more seconds, got {grace_period}")
    listening = bound_socket(host, port)  # before the engine starts: a port in use is said at once
    if threads is not None and threads < 1:
        fail(f"--threads must be at least 1, got {threads}")
    name = served_model_name or model
    metrics = ServerMetrics(name)
    try:
        text = load_tokenizer(tokenizer)
        if hardware is not None:
            get_accelerator(hardware)  # a catalog id, or a clear error naming the ids
        config = flags.engine_config(knobs, device, dtype, quantization, quant_group_size, kv_cache_dtype,
                                     quant_kernel=quant_kernel, max_model_len=max_model_len, seed=seed)
        client = EngineClient(functools.partial(build_engine, model, config, seed, threads), metrics)
        facts = client.facts
        # What the simulator needs to replay this server: GET /v1/models reports it (servecast replay records it).
        deployment = engine_deployment(sim_model(model), config, facts.cache_config.num_blocks, client.max_model_len,
                                       hardware)
    except ValueError as exc:
        listening.close()
        fail(str(exc))
    print(f"servecast serve: {facts.described}, {facts.cache_config.num_blocks} KV blocks of {config.block_size}, "
          f"max_model_len {client.max_model_len}, tokenizer {text.name}; "
          f"OpenAI API at http://{host}:{port}/v1 as {name!r}", file=sys.stderr, flush=True)
    state = ServerState(client, text, name, metrics, max_queued_requests, deployment)
    server = draining_server_class()(uvicorn.Config(build_app(state), host=host, port=port, log_level="warning",
                                                    timeout_graceful_shutdown=grace_period), state, grace_period)
    # uvicorn drains on SIGTERM, then raises the signal again to the handler it found: a no-op one
    # here, so a drained server exits with status 0 rather than as killed.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[listening])
    except SystemExit:  # uvicorn's way of saying it could not start (told below)
        pass
    finally:
        client.stop()
    if not server.started:
        fail(f"could not serve on {host}:{port}: pick another --port / --host")


# Streams still open this long before the grace period ends are ended by the server (an error
# event each), so that none is cut off mid-response when uvicorn cancels what is left.
DRAIN_MARGIN_S = 1.0


def bound_socket(host: str, port: int):
    """A socket bound to host:port, or a clear error (exit 2) when it cannot be (in use, not ours)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        fail(f"could not serve on {host}:{port} ({exc.strerror or exc}): pick another --port, or a --host of "
             "this machine")
    return sock


def draining_server_class():
    """The server class (built here: uvicorn is imported only to serve)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, which on SIGTERM also schedules the end of the streams still open
        DRAIN_MARGIN_S before its grace period runs out (ServerState.drain), told in one line."""

        def __init__(self, config, state, grace_s: float) -> None:
            super().__init__(config)
            self.state, self.grace_s, self._draining = state, grace_s, False

        def handle_exit(self, sig, frame) -> None:
            loop = self.state.event_loop
            if not self._draining and loop is not None:
                self._draining = True
                delay = max(0.0, self.grace_s - min(DRAIN_MARGIN_S, self.grace_s / 2))
                loop.call_soon_threadsafe(loop.call_later, delay, self._drain)
            super().handle_exit(sig, frame)

        def _drain(self) -> None:
            ended = self.state.drain("the server is shutting down: its grace period ended before this response")
            if ended:
                print(f"servecast serve: shutting down; ended {ended} stream{'s' if ended != 1 else ''} still "
                      "running at the end of the grace period with an error event", file=sys.stderr, flush=True)

    return DrainingServer

