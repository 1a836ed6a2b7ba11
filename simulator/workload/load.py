"""The `--trace` spec: a trace file or a synthetic workload, with options. No torch.

load_workload dispatches between trace files (simulator/workload/trace_files.py) and synthetic
specs (simulator/workload/synthetic.py), then applies the options common to both.

    synthetic:num=3000,input=128,output=2048,rate=inf
    synthetic:num=2000,lengths=../shared/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv,rate=4,arrival=gamma,cv=3
    synthetic:prefixes=8,prefix_len=1024,users=50,input=1500,output=200,rate=10
    synthetic:num=500,input=1024,output=1024,concurrency=32
    synthetic:prefixes=9,users=5,prefix_len=100,input=473,output=248,arrival=constant,stages=8x600+20x600
    ../shared/traces/splitwise_conv.csv,window=0-600,limit=2000
    ../shared/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv,rate=5,num=1000

Keys (comma separated; arguments of a length distribution in parentheses):

* num        number of requests (synthetic default 1000; a length-only file: as many as drawn)
* input, output  lengths: `128` (fixed), `uniform(64,512)`, `lognormal(512,0.8)` (median, sigma of log)
* lengths    a length CSV whose (prompt, output) pairs are drawn jointly, with replacement
* rate       requests per second; `inf` = all at time 0
* arrival    poisson (default), gamma (with cv, the burstiness: coefficient of variation of the
             gaps), constant
* prefixes, prefix_len, users   shared-prefix workload: `prefixes` system prompts of prefix_len
             tokens. With users=M, M users per system prompt each send one fixed prompt (system
             prompt + that user's question, lengths drawn once per user), the N x M prompts in a
             shuffled cycle (inference-perf's shared_prefix data); num defaults to N x M. Without
             users, each request has a random system prompt and an input of its own
* stages     RATExSECONDS+RATExSECONDS...: back-to-back stages at their own rates (instead of rate
             and num), e.g. stages=8x600+20x600 with arrival=constant
* concurrency, think   closed-loop clients: at most C requests in flight, each sent when a client
             is free (think seconds after its last request finished; default 0) and not before its
             arrival time, in order, as `vllm bench serve --max-concurrency` sends them. Without a
             rate (synthetic, length files) every request may go at once: C clients back to back
* seed       random seed (default: the simulation's)
* window     START-END seconds of a timed trace;  limit: keep the first N requests
* rate_scale compress arrivals in time (2 = twice the rate);  skip_bad=1  skip (and list) bad rows
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from simulator.workload.requests import Clients, Workload, WorkloadError, make_workload
from simulator.workload.synthetic import (SYNTHETIC, SpecOptions, parse_options, spec_arrivals, split_spec,
                                          synthetic_workload)
from simulator.workload.trace_files import read_trace

KNOWN_SYNTHETIC = ("num, input, output, lengths, rate, arrival, cv, stages, prefixes, prefix_len, users, concurrency, "
                   "think, seed, window, limit, rate_scale")
KNOWN_FILE = "rate, arrival, cv, num, concurrency, think, seed, window, limit, rate_scale, skip_bad"


def load_workload(spec: str | Path, seed: int = 0, rate_scale: float = 1.0) -> Workload:
    """A workload from a `--trace` spec (see the module docstring)."""
    text = str(spec).strip()
    if not text:
        raise WorkloadError("empty trace spec: give a trace file or synthetic:num=...,input=...,output=...,rate=...")
    if text.startswith(SYNTHETIC):
        opts = SpecOptions(parse_options(split_spec(text[len(SYNTHETIC):]), "synthetic"), "synthetic")
        clients = spec_clients(opts)
        workload = synthetic_workload(opts, seed)
        workload.name = text
        known = KNOWN_SYNTHETIC
    else:
        path, *items = split_spec(text)
        opts = SpecOptions(parse_options(items, Path(path).name), Path(path).name)
        clients = spec_clients(opts)
        skip_bad = opts.get("skip_bad", "0") not in ("0", "false", "no")
        workload, lengths = read_trace(path, skip_bad)
        known = KNOWN_FILE
        if lengths is not None:
            pairs = lengths.pairs
            rng = np.random.default_rng(int(opts.number("seed", seed)))
            num = opts.number("num", len(pairs), integer=True)
            picks = rng.integers(0, len(pairs), size=num) if num != len(pairs) else np.arange(num)
            arrivals = spec_arrivals(opts, num, rng, None if clients is None else math.inf)
            workload = make_workload(Path(path).stem, [(float(a), *pairs[i], ()) for a, i in zip(arrivals, picks)])
            workload.skipped = lengths.skipped
        else:
            for key in ("rate", "arrival", "cv", "num", "seed"):
                if opts.get(key) is not None:
                    raise WorkloadError(f"{Path(path).name} has its own arrival times: {key}= applies only to "
                                        "length-only files; use rate_scale= or window= / limit=")
    window = opts.get("window")
    if window is not None:
        start, sep, end = window.partition("-")
        try:
            workload = workload.window(float(start), float(end))
        except ValueError as exc:
            if isinstance(exc, WorkloadError):
                raise
            raise WorkloadError(f"window={window!r}: use START-END in seconds, e.g. window=0-600") from None
    limit = opts.number("limit", integer=True)
    if limit is not None:
        workload = workload.limited(limit)
    workload = workload.scaled(opts.number("rate_scale", 1.0) * rate_scale)
    opts.check_all_used(known)
    return workload.closed_loop(clients) if clients is not None else workload


def with_max_concurrency(workload: Workload, max_concurrency: int | None) -> Workload:
    """The workload sent by max_concurrency closed-loop clients (a command's --max-concurrency,
    the same as concurrency= in its spec; think= kept); unchanged for None."""
    if max_concurrency is None:
        return workload
    clients = workload.clients
    if max_concurrency < 1:
        raise WorkloadError(f"--max-concurrency must be at least 1, got {max_concurrency}")
    if clients is not None and clients.concurrency != max_concurrency:
        raise WorkloadError(f"--max-concurrency {max_concurrency} and the trace's concurrency={clients.concurrency} "
                            "disagree: give one of them")
    return workload.closed_loop(Clients(max_concurrency, clients.think_s if clients else 0.0))


def spec_clients(opts: SpecOptions) -> Clients | None:
    """The spec's closed-loop clients (concurrency=C[,think=SECONDS]); None without concurrency=."""
    concurrency = opts.number("concurrency", integer=True)
    think = opts.number("think", 0.0)
    if concurrency is None:
        if opts.get("think") is not None:
            raise WorkloadError(f"{opts.where}: think= is the closed-loop clients' pause: add concurrency=C")
        return None
    if not 0 <= think < math.inf:
        raise WorkloadError(f"{opts.where}: think={think:g}: give the seconds a client waits, >= 0")
    return Clients(concurrency, think)


def portable_spec(spec: str) -> str:
    """The spec with the files it names (a trace file, lengths=FILE) as absolute paths, so that it
    reads the same from another folder (a replay's recorded trace, read again by calibrate)."""
    text = str(spec).strip()
    synthetic = text.startswith(SYNTHETIC)
    parts = split_spec(text[len(SYNTHETIC):] if synthetic else text)

    def absolute(path: str) -> str:
        return str(Path(path).resolve()) if Path(path).is_file() else path

    out = []
    for i, part in enumerate(parts):
        key, sep, value = part.partition("=")
        if i == 0 and not synthetic:
            out.append(absolute(part))
        elif sep and key.strip() == "lengths":
            out.append(f"{key}={absolute(value.strip())}")
        else:
            out.append(part)
    return (SYNTHETIC if synthetic else "") + ",".join(out)

