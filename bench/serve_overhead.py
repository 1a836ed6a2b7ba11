"""What HTTP costs: the same requests through `servecast serve` (32 concurrent streams from a lean
httpx load generator) and through the engine in-process, side by side, rounds interleaved.

Prints output tokens/s and mean TTFT of each round and the medians' ratio (target: HTTP within
10 % of in-process throughput), for each engine thread setting: torch's default (every core: the
engine then shares them with the server's API process and the client, which a GPU server's engine
does not) and one thread (the engine on one core, as a GPU server's engine is on its GPU; the API
process and the client on the other). The server is a subprocess on loopback with the same engine
flags. Not a test: figures only.

    python bench/serve_overhead.py [--streams 32] [--prompt 64] [--output 128] [--rounds 5]
        [--threads default,1] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time

import httpx

from app.engine_source import build_engine
from engine import EngineConfig, SamplingParams

FLAGS = dict(block_size=16, max_num_seqs=64, max_num_batched_tokens=512)
DEFAULT_THREADS = __import__("torch").get_num_threads()


def requests(args) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(256) for _ in range(args.prompt)] for _ in range(args.streams)]


def in_process(engine, prompts, output: int) -> tuple[float, float]:
    start = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True))
    wall = time.perf_counter() - start
    tokens = sum(len(o.output_token_ids) for o in outs)
    return tokens / wall, statistics.mean(o.ttft_s for o in outs)


async def over_http(url: str, prompts, output: int) -> tuple[float, float]:
    """A lean load generator (httpx streaming, lines counted, usage read at the end; the openai
    client's per-chunk parsing costs this 2-core machine's shared cores as much as the server)."""
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=256)) as client:
        async def one(prompt):
            body = {"model": "demo", "prompt": prompt, "max_tokens": output, "temperature": 0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}
            sent = time.perf_counter()
            first, tokens = None, 0
            async with client.stream("POST", "/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    if first is None:
                        first = time.perf_counter() - sent
                    if '"usage"' in line:
                        tokens = json.loads(line[6:])["usage"]["completion_tokens"]
            return first, tokens

        start = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - start
    return sum(t for _, t in results) / wall, statistics.mean(f for f, _ in results)


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and its children alive now (the server and its engine process)."""
    def own(p: str) -> tuple[int, float]:
        fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    total = own(str(pid))[1]
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent, seconds = own(p)
        except OSError:
            continue
        total += seconds if parent == pid else 0.0
    return total


def measure(args, prompts, threads: int | None) -> dict[str, list[tuple[float, float]]]:
    """Interleaved rounds, in-process and over HTTP, with the engine on `threads` torch threads on
    both sides (None: torch's choice)."""
    import torch

    torch.set_num_threads(threads or DEFAULT_THREADS)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in FLAGS.items()] + ([f"--threads={threads}"] if threads else [])
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(args.port), *flags],
                              stderr=subprocess.PIPE, text=True)
    rows: dict[str, list[tuple[float, float]]] = {"in-process": [], "HTTP": []}
    try:
        server.stderr.readline()
        url = f"http://127.0.0.1:{args.port}/v1"
        while True:
            try:
                if httpx.get(url.removesuffix("/v1") + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        engine, _ = build_engine("demo", EngineConfig(**FLAGS))
        in_process(engine, prompts[:4], 4)  # warm-up, both sides
        asyncio.run(over_http(url, prompts[:4], 4))
        tokens = args.streams * args.output / 1000
        for r in range(args.rounds):
            cpu = time.process_time()
            rows["in-process"].append(in_process(engine, prompts, args.output))
            own_cpu = (time.process_time() - cpu) / tokens
            cpu = cpu_seconds(server.pid), time.process_time()
            rows["HTTP"].append(asyncio.run(over_http(url, prompts, args.output)))
            server_cpu = (cpu_seconds(server.pid) - cpu[0]) / tokens
            client_cpu = (time.process_time() - cpu[1]) / tokens
            print(f"  round {r + 1}: in-process {rows['in-process'][-1][0]:8.1f} tok/s, TTFT "
                  f"{rows['in-process'][-1][1] * 1e3:6.1f} ms, {own_cpu:.3f} CPU s/1k tok | HTTP "
                  f"{rows['HTTP'][-1][0]:8.1f} tok/s, TTFT {rows['HTTP'][-1][1] * 1e3:6.1f} ms, server "
                  f"{server_cpu:.3f} + client {client_cpu:.3f} CPU s/1k tok")
        engine.close()
    finally:
        server.terminate()
        server.wait(60)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", default="default,1", help="the engine's torch threads on both sides, each setting "
                   "measured in turn: 'default' (torch's choice: every core, shared with the API process and the "
                   "client) and/or a number (1: the engine on one core, the API process and client on the other)")
    p.add_argument("--port", type=int, default=8341)
    p.add_argument("--quick", action="store_true", help="4 streams of 8 tokens, one round")
    args = p.parse_args()
    if args.quick:
        args.streams, args.output, args.rounds = 4, 8, 1
    prompts = requests(args)
    print(f"{args.streams} requests of {args.prompt} prompt / {args.output} output tokens, demo model, "
          f"{os.cpu_count()} cores; {args.rounds} rounds each, interleaved")
    ratios = {}
    for setting in args.threads.split(","):
        threads = None if setting.strip() == "default" else int(setting)
        label = f"engine threads {threads or f'default ({DEFAULT_THREADS})'}"
        print(label)
        rows = measure(args, prompts, threads)
        medians = {k: (statistics.median(t for t, _ in v), statistics.median(f for _, f in v)) for k, v in rows.items()}
        for k, (tps, ttft) in medians.items():
            print(f"  {k:11s} median {tps:8.1f} output tok/s, TTFT {ttft * 1e3:7.1f} ms")
        ratios[label] = medians["HTTP"][0] / medians["in-process"][0]
    for label, ratio in ratios.items():
        print(f"HTTP / in-process throughput, {label}: {ratio:.3f} (target >= 0.90)")


if __name__ == "__main__":
    main()
