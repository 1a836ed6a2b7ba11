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
        fail(str(exc))
    print(f"servecast serve: {facts.described}, {facts.cache_config.num_blocks} KV blocks of {config.block_size}, "
          f"max_model_len {client.max_model_len}, tokenizer {text.name}; "
          f"OpenAI API at http://{host}:{port}/v1 as {name!r}", file=sys.stderr, flush=True)
    state = ServerState(client, text, name, metrics, max_queued_requests, deployment)
    server = uvicorn.Server(uvicorn.Config(build_app(state), host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=grace_period))
    # uvicorn drains on SIGTERM, then raises the signal again to the handler it found: a no-op one
    # here, so a drained server exits with status 0 rather than as killed.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run()
    except SystemExit:  # uvicorn's way of saying it could not start (told below)
        pass
    finally:
        client.stop()
    if not server.started:
        fail(f"could not serve on {host}:{port} (in use, or not this machine's address): pick another --port / --host")
