"""Profile the engine's own operators on the device at hand (`servecast profile`).

Every operator is the engine's code: packed-weight GEMMs (engine/linear.py) for each linear layer
of the model, paged attention (engine/attention.py) for prefill chunks and decode batches, KV-cache
writes, RMSNorm / rotary / SwiGLU / residual adds, sampling, the scheduler's work per step by batch
size, and whole model-runner steps (input preparation + forward + sampling) of uniform, spread and
mixed batches at two depths, from which the cost model fits what the operators leave out. GEMMs
rotate through copies of their weights and whole forwards read a scattered KV pool, as in serving.
Each point: warm-up, then the median of repeated timed calls. Results are appended one line at a time, so an interrupted profile resumes.
Random weights: timing does not depend on their values.
"""

from __future__ import annotations

import itertools
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.attention import attend, build_metadata
from engine.tp_shard import shard_config
from engine.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.kv_cache import KVCache
from engine.linear import Linear
from engine.model import DecoderModel, RMSNorm
from engine.rope import RotaryEmbedding, apply_rotary
from engine.runner import TORCH_DTYPES, slots_for
from engine.sampler import sample
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.weights import build_decoder
from simulator.catalog.hardware import canonical_dtype
from simulator.cost.profile_format import Measurement, Profile, forward_contexts


# Weight rotation of GEMM timings (Profiler._weight_copies): enough bytes to leave every cache.
ROTATION_BYTES = 256 * 2**20
MAX_WEIGHT_COPIES = 64
# Whole-forward timings use a KV pool this many times the blocks their sequences hold.
FORWARD_POOL_FACTOR = 4


@dataclass(frozen=True)
class ProfileGrid:
    tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    # GEMMs are also timed at every row count up to this one. A decode step of b sequences runs its
    # GEMMs at exactly b rows, and GEMM time steps with the rows rather than growing smoothly (on a
    # 2-core EPYC, weights from memory: 7 rows cost a quarter more than 6, 4-6 rows less than 2-3),
    # so these are measured where the batch sizes are, not interpolated across a step.
    gemm_every_row_up_to: int = 32
    prefill_q: tuple[int, ...] = (16, 64, 256)
    # Attention kernels' efficiency depends on head_dim, which no other axis stands in for: attention
    # is also profiled at these head dims (same query and KV widths as the model, where they divide).
    attention_head_dims: tuple[int, ...] = (64, 128)
    # Query heads per KV head also profiled at each head dim (same KV width): a model's own GQA
    # group alone cannot tell the fit whether attention time follows query heads (compute) or KV
    # heads (memory), and another model's group is then guessed, not predicted.
    attention_groups: tuple[int, ...] = (1, 4)
    prefill_kv_multiples: tuple[int, ...] = (1, 2, 4)
    decode_batch: tuple[int, ...] = (1, 4, 16, 64)
    decode_kv: tuple[int, ...] = (64, 256, 1024)
    # Speculative verification (engine/attention.py VerifyBatch): batches of chunks of this many
    # queries (a request's last token and gamma = 1, 2, 4, 8 drafts), at decode_batch x decode_kv.
    verify_q: tuple[int, ...] = (2, 3, 5, 9)
    block_size: int = 16
    min_repeats: int = 7
    min_seconds: float = 0.03
    # Whole model-runner steps at these depths (capped at the model's): two depths separate
    # per-layer from per-step overhead, and the deeper one reads as many weights per step as the
    # model does where that is small enough to matter (caches).
    forward_layers: tuple[int, ...] = (1, 4)
    # Idle gaps (ms) after which the first step's extra time is measured.
    idle_ms: tuple[int, ...] = (5, 50)
    # Each group of points (one operator) is measured in this many interleaved passes and each
    # point keeps the median of its pass medians, so slow drifts of a shared machine average out.
    passes: int = 3
    # Weight-only quantized linear layers also timed in these modes (int8, int4, fp8; int4 in groups
    # of quant_group_size where the layer's input width allows), so the simulator reads their
    # dequantization and kernel costs from measurements.
    weight_quant: tuple[str, ...] = ()
    # Quantized KV caches (int8, fp8) whose reads -- a gather that dequantizes -- are also timed,
    # beside the plain cache's (kv_gather), so the simulator adds what dequantizing costs.
    kv_quant: tuple[str, ...] = ()
    kv_gather_tokens: tuple[int, ...] = (64, 256, 1024, 4096, 16384, 65536)
    # Mixture-of-experts models: the routed experts timed at these rows per expert, for 1, 2, 4, ...
    # up to all of a rank's experts getting rows (moe_experts); the router and dispatch at each
    # token count (moe_dispatch).
    expert_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    quant_group_size: int = 128
    # On CUDA each sample times this many back-to-back calls and one synchronize: the engine
    # queues kernels without waiting for them, so an operator costs its time in a busy stream, not
    # a launch plus a round trip to the host (which a sync per call would add to every point).
    cuda_calls_per_sample: int = 8

    @classmethod
    def for_budget(cls, max_batched_tokens: int, max_context: int | None = None) -> "ProfileGrid":
        """Token counts 1 ... max_batched_tokens: powers of two and the midpoints between them;
        decode contexts 64, 256, 1024, ... up to max_context (when given; 1024 otherwise)."""
        tokens = sorted({t for p in range(0, 16) for t in (2**p, 3 * 2**p // 2) if 1 <= t <= max_batched_tokens}
                        | {max_batched_tokens})
        q = tuple(x for x in (16, 64, 256, 1024) if x <= max_batched_tokens) or (max_batched_tokens,)
        kv = cls.decode_kv
        if max_context is not None:  # 64, 256, 1024, ... up to max_context
            kv = tuple(64 * 4**i for i in range(10) if 64 * 4**i <= max_context) or (max_context,)
        return cls(tokens=tuple(tokens), prefill_q=q, decode_kv=kv,
                   gemm_every_row_up_to=min(cls.gemm_every_row_up_to, max_batched_tokens))

    @property
    def gemm_rows(self) -> tuple[int, ...]:
        """Row counts the GEMMs are timed at: the token grid and every count up to gemm_every_row_up_to."""
        return tuple(sorted(set(self.tokens) | set(range(1, self.gemm_every_row_up_to + 1))))

    @classmethod
    def quick(cls) -> "ProfileGrid":
        """A small grid for tests: seconds, not minutes."""
        return cls(tokens=(1, 8, 64), gemm_every_row_up_to=0, prefill_q=(16,), prefill_kv_multiples=(1, 2),
                   decode_batch=(1, 4), decode_kv=(32, 128), min_repeats=2, min_seconds=0.0, passes=1,
                   attention_head_dims=(), attention_groups=(), forward_layers=(1, 2), idle_ms=(5,), verify_q=(3,))


def median_time(fn: Callable[[], object], grid: ProfileGrid, sync: Callable[[], None], calls: int = 1) -> float:
    """Median seconds per call; each sample times `calls` back-to-back calls and one sync."""
    fn()  # warm-up (allocations, kernel selection)
    sync()
    times = []
    started = time.perf_counter()
    while len(times) < grid.min_repeats or time.perf_counter() - started < grid.min_seconds:
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t) / calls)
        if len(times) >= 1000:
            break
    return statistics.median(times)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(device: torch.device, dtype: str, calls_per_sample: int = 1) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {"device_name": name, "device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "dtype": canonical_dtype(dtype), "attention": "servecast paged sdpa",
            "gemm": "onednn packed" if device.type == "cpu" else "torch F.linear",
            "calls_per_sample": calls_per_sample}


def measure_peaks(device: torch.device, dtype: torch.dtype, sync) -> dict[str, float]:
    """Best square-matmul rate (plain and through the engine's packed linear) and copy bandwidth."""
    best = 0.0
    timing = ProfileGrid(min_repeats=5, min_seconds=0.05)
    for size in (256, 512, 1024, 2048):
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        layer = Linear(size, size, bias=False).to(device, dtype)
        if device.type == "cpu":
            layer.pack_for_cpu()
        with torch.inference_mode():
            for fn in (lambda: torch.mm(a, b), lambda: layer(a)):
                best = max(best, 2 * size**3 / median_time(fn, timing, sync))
    src = torch.empty(64 * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), ProfileGrid(min_repeats=5, min_seconds=0.05), sync)
    return {"matmul_flops": best, "memory_bandwidth": 2 * src.numel() * 4 / t}


def measure_bandwidth_by_size(device: torch.device, sync) -> list[tuple[int, float]]:
    """Read bandwidth over working sets from 256 KiB to 256 MiB (caches, then DRAM)."""
    timing = ProfileGrid(min_repeats=5, min_seconds=0.05)
    curve = []
    for shift in range(18, 29, 1):
        nbytes = 2**shift
        x = torch.randn(nbytes // 4, device=device)
        curve.append((nbytes, nbytes / median_time(lambda: x.sum(), timing, sync)))
    return curve


class Profiler:
    def __init__(self, model: ModelConfig, device: str = "cpu", dtype: str = "float32", hardware: str | None = None,
                 grid: ProfileGrid | None = None, tp: int = 1) -> None:
        if tp < 1:
            raise ValueError(f"tp must be at least 1, got {tp}")
        self.tp = tp
        # Under tensor parallelism every rank runs the same shard: its operators are what a TP=tp
        # step costs, plus the all-reduces timed across tp processes.
        self.model = model if tp == 1 else shard_config(model, tp)
        self.device = torch.device(device)
        self.torch_dtype = TORCH_DTYPES[dtype]
        self.dtype = canonical_dtype(dtype)
        self.hardware = hardware or ("cuda-local" if self.device.type == "cuda" else "cpu-local")
        self.grid = grid or ProfileGrid()
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self._held_layers: tuple[tuple, list[Linear]] | None = None
        self._held_model: tuple[int, DecoderModel] | None = None

    def header(self) -> Profile:
        calls = self.grid.cuda_calls_per_sample if self.device.type == "cuda" else 1
        return Profile(self.hardware, fingerprint(self.device, self.dtype, calls), {}, "servecast profile")

    # -- the grid -----------------------------------------------------------------------------
    def plan(self) -> list[tuple[str, dict]]:
        """(op, params) of every measurement, in order."""
        c, g, d = self.model, self.grid, self.dtype
        plan: list[tuple[str, dict]] = []
        shapes = {"qkv_proj": (c.q_size + 2 * c.kv_size, c.hidden_size), "o_proj": (c.hidden_size, c.q_size),
                  "gate_up_proj": (2 * c.intermediate_size, c.hidden_size),
                  "down_proj": (c.hidden_size, c.intermediate_size), "lm_head": (c.vocab_size, c.hidden_size)}
        for name, (n, k) in shapes.items():
            for m in g.gemm_rows:
                plan.append(("gemm", dict(name=name, m=m, n=n, k=k, dtype=d)))
        for heads in self._attention_shapes():
            for q in g.prefill_q:
                for mult in g.prefill_kv_multiples:
                    plan.append(("attention_prefill", dict(q_len=q, kv_len=q * mult, **heads)))
            for batch in g.decode_batch:
                for kv in g.decode_kv:
                    plan.append(("attention_decode", dict(batch=batch, kv_len=kv, **heads)))
        own_heads = self._attention_shapes()[0]  # verification is timed at the model's own layout only
        for q in g.verify_q:
            for batch in g.decode_batch:
                for kv in g.decode_kv:
                    if kv > q:
                        plan.append(("attention_verify", dict(batch=batch, q_len=q, kv_len=kv, **own_heads)))
        widths = {"rms_norm": c.hidden_size, "rope": c.q_size + c.kv_size, "swiglu": c.intermediate_size,
                  "add": c.hidden_size}
        for m in g.tokens:
            plan.append(("kv_write", dict(tokens=m, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, dtype=d)))
            for name, width in widths.items():
                plan.append(("elementwise", dict(name=name, tokens=m, width=width, dtype=d)))
        for batch in g.decode_batch:
            plan.append(("sample", dict(batch=batch, vocab=c.vocab_size)))
            plan.append(("step_overhead", dict(batch=batch)))
        arch = dict(hidden=c.hidden_size, ffn=c.intermediate_size, num_heads=c.num_heads,
                    num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, vocab=c.vocab_size, block_size=g.block_size,
                    dtype=d)
        for layers in sorted({min(n, c.num_layers) for n in g.forward_layers}):
            if c.num_experts:  # the forward's own layers: its experts and which of them are dense
                arch = dict(arch, experts=c.num_experts, top_k=c.experts_per_token, moe_ffn=c.moe_intermediate_size,
                            shared_ffn=c.shared_expert_intermediate_size,
                            dense_layers=sum(1 for sparse in c.sparse_layers[:layers] if not sparse))
            none = dict(extra_q=0, extra_kv=0)
            for batch in g.decode_batch:
                for kv in g.decode_kv:
                    plan.append(("forward", dict(layers=layers, batch=batch, q_len=1, kv_len=kv, spread=0, **none,
                                                 **arch)))
                    if batch > 1 and kv > g.decode_kv[0]:
                        plan.append(("forward", dict(layers=layers, batch=batch, q_len=1, kv_len=kv, spread=1, **none,
                                                     **arch)))
            for q in g.prefill_q:
                for mult in (1, 2):
                    plan.append(("forward", dict(layers=layers, batch=1, q_len=q, kv_len=q * mult, spread=0, **none,
                                                 **arch)))
                # A prefill chunk among decodes, as chunked prefill schedules them.
                for batch in g.decode_batch[1:3]:
                    plan.append(("forward", dict(layers=layers, batch=batch, q_len=1, kv_len=g.decode_kv[max(len(g.decode_kv) - 2, 0)], spread=1,
                                                 extra_q=q, extra_kv=2 * q, **arch)))
        if c.num_experts:
            local = c.num_local_experts
            for active in sorted({2 ** i for i in range(local.bit_length()) if 2 ** i <= local} | {local}):
                for rows in g.expert_rows:
                    plan.append(("moe_experts", dict(rows=rows, active=active, hidden=c.hidden_size,
                                                     ffn=c.moe_intermediate_size, dtype=d)))
            for m in g.tokens:
                plan.append(("moe_dispatch", dict(tokens=m, experts=c.num_experts, top_k=c.experts_per_token,
                                                  hidden=c.hidden_size, dtype=d)))
        for idle_ms in g.idle_ms:
            plan.append(("idle_wakeup", dict(idle_ms=idle_ms)))
        # The quantized modes last: a run cut short (a leased GPU's time running out) keeps the
        # points every prediction needs.
        for mode in g.weight_quant:
            for name, (n, k) in shapes.items():
                if mode == "int4" and k % g.quant_group_size:
                    continue
                for m in g.gemm_rows:
                    plan.append(("gemm_quant", dict(name=name, m=m, n=n, k=k, dtype=d, weight_dtype=mode,
                                                    group_size=g.quant_group_size)))
        for kv_dtype in (("none",) + g.kv_quant) if g.kv_quant else ():
            for tokens in g.kv_gather_tokens:
                plan.append(("kv_gather", dict(tokens=tokens, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                                               dtype=d, kv_dtype=kv_dtype)))
        if self.tp > 1:
            # The all-reduce after attention and after the MLP of every layer: tokens x hidden.
            element = self.torch_dtype.itemsize
            for m in g.tokens:
                plan.append(("all_reduce", dict(nbytes=m * c.hidden_size * element, world=self.tp)))
            if c.num_experts and c.expert_parallel:
                # Expert parallel: each rank's rows (its token share x top-k, hidden + the expert id)
                # out to the experts' ranks and back.
                for m in g.tokens:
                    rows = -(-m // self.tp) * c.experts_per_token
                    plan.append(("all_to_all", dict(nbytes=rows * (c.hidden_size + 1) * element, world=self.tp)))
        return plan

    def _attention_shapes(self) -> list[dict]:
        """The model's own head layout; the same query / KV widths at other head dims; and at each
        of those head dims, other query heads per KV head over the same KV width."""
        c = self.model
        layouts = [(c.num_heads, c.num_kv_heads, c.head_dim)]
        for head_dim in self.grid.attention_head_dims:
            if head_dim != c.head_dim and not c.q_size % head_dim and not c.kv_size % head_dim:
                layouts.append((c.q_size // head_dim, c.kv_size // head_dim, head_dim))
        for _, kv_heads, head_dim in list(layouts):
            for group in self.grid.attention_groups:
                if (kv_heads * group, kv_heads, head_dim) not in layouts:
                    layouts.append((kv_heads * group, kv_heads, head_dim))
        return [dict(num_heads=h, num_kv_heads=kv, head_dim=hd, dtype=self.dtype) for h, kv, hd in layouts]

    # -- running ------------------------------------------------------------------------------
    def run(self, out: str | Path, on_progress: Callable[[int, int], None] | None = None) -> Profile:
        """Measure every point of the plan not yet in `out` (appending as it goes); return the profile."""
        for finished, total in self.steps(out):
            if on_progress is not None:
                on_progress(finished, total)
        return Profile.load(out)

    def steps(self, out: str | Path) -> Iterator[tuple[int, int]]:
        """Like run(), one operator group at a time: yields (points finished, points planned)."""
        path = Path(out)
        header = self.header()
        if path.exists() and path.stat().st_size > 0:
            existing = Profile.load(path)
            if existing.hardware != header.hardware or existing.fingerprint.get("dtype") != self.dtype:
                raise ValueError(f"{path} is a profile of {existing.hardware} ({existing.fingerprint.get('dtype')}); "
                                 f"this run is {header.hardware} ({self.dtype}): choose another --out")
            done = {m.key for m in existing.measurements}
        else:
            header.peaks = measure_peaks(self.device, self.torch_dtype, self.sync)
            header.bandwidth_by_size = measure_bandwidth_by_size(self.device, self.sync)
            header.save(path)
            done = set()
        plan = self.plan()
        finished = 0
        for group in _groups(plan):
            todo = [(op, params) for op, params in group if Measurement.make(op, 1.0, **params).key not in done]
            times: dict[int, list[float]] = {i: [] for i in range(len(todo))}
            if todo and todo[0][0] in ("all_reduce", "all_to_all"):
                from calibrate.collectives import measure_collective

                measured = measure_collective(todo[0][0], self.tp, [p["nbytes"] for _, p in todo], self.device.type,
                                              str(self.torch_dtype).removeprefix("torch."))
                times = {i: [measured[p["nbytes"]]] for i, (_, p) in enumerate(todo)}
                todo_passes = 0
            else:
                todo_passes = self.grid.passes
            for _ in range(todo_passes):
                for i, (op, params) in enumerate(todo):
                    times[i].append(self._measure(op, params))
            for i, (op, params) in enumerate(todo):
                m = Measurement.make(op, statistics.median(times[i]), **params)
                Profile.append(path, m)
                done.add(m.key)
            finished += len(group)
            yield finished, len(plan)
        write_fitted_beside(path)


    @torch.inference_mode()
    def _measure(self, op: str, p: dict) -> float:
        if op == "idle_wakeup":
            return next(self._callables(op, p))()
        calls = self.grid.cuda_calls_per_sample if self.device.type == "cuda" and op != "step_overhead" else 1
        return median_time(next(self._callables(op, p)), self.grid, self.sync, calls)

    def _weight_copies(self, weight_elements: int) -> int:
        """Copies of a GEMM's weights to rotate through while timing it. In a forward pass every
        weight is read once per step, after the rest of the model has been through the caches; one
        weight timed over and over would sit in cache and time faster than the engine ever runs it.
        Rotating over as many bytes as the whole model (up to ROTATION_BYTES) reproduces that."""
        element = self.torch_dtype.itemsize
        model_bytes = min(self.model.num_parameters() * element, ROTATION_BYTES)
        return max(1, min(MAX_WEIGHT_COPIES, math.ceil(model_bytes / (weight_elements * element))))

    def _tensor(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=self.torch_dtype)

    def _callables(self, op: str, p: dict) -> Iterator[Callable[[], object]]:
        c = self.model
        if op in ("gemm", "gemm_quant"):
            layers = self._gemm_layers(op, p)
            x = self._tensor(p["m"], p["k"])
            turn = itertools.cycle(layers)
            yield lambda: next(turn)(x)
        elif op in ("attention_prefill", "attention_decode", "attention_verify"):
            yield self._attention(op, p)
        elif op == "kv_gather":
            kv_dtype = None if p["kv_dtype"] == "none" else p["kv_dtype"]
            bs = self.grid.block_size
            blocks = -(-p["tokens"] // bs)
            cache = KVCache(_one_layer(self.model), CacheConfig(bs, blocks), self.torch_dtype, self.device, kv_dtype)
            order = torch.randperm(blocks, generator=torch.Generator().manual_seed(0)).to(self.device)
            yield lambda: cache.gather(0, order)  # a serving pool's blocks are scattered
        elif op == "kv_write":
            cache, slots = self._cache_and_slots(p["tokens"])
            k = self._tensor(p["tokens"], c.num_kv_heads, c.head_dim)
            yield lambda: cache.write(0, slots, k, k)
        elif op == "elementwise":
            yield self._elementwise(p["name"], p["tokens"])
        elif op == "sample":
            logits = torch.randn(p["batch"], p["vocab"], device=self.device)
            params = [SamplingParams(temperature=0.0)] * p["batch"]
            yield lambda: sample(logits, params, [None] * p["batch"])
        elif op == "step_overhead":
            yield self._step_overhead(p["batch"])
        elif op == "forward":
            yield self._forward(p)
        elif op == "idle_wakeup":
            yield self._idle_wakeup(p["idle_ms"])
        elif op in ("moe_experts", "moe_dispatch"):
            yield self._moe(op, p)
        else:
            raise ValueError(f"cannot profile op {op!r}")

    def _gemm_layers(self, op: str, p: dict) -> list[Linear]:
        """The layer's weight copies, made on the device; kept while the same layer is timed at
        other token counts (a real-size layer's copies take seconds to make, its timings less)."""
        key = (op, p["n"], p["k"], p.get("weight_dtype"), p.get("group_size"))
        if self._held_layers is None or self._held_layers[0] != key:
            self._held_layers = None  # the previous layer's copies go before the next one's are made
            layers = [Linear(p["k"], p["n"], bias=False, device=self.device, dtype=self.torch_dtype)
                      for _ in range(self._weight_copies(p["n"] * p["k"]))]
            for layer in layers:
                if op == "gemm_quant":
                    layer.quantize(p["weight_dtype"], p["group_size"])
                elif self.device.type == "cpu":
                    layer.pack_for_cpu()
            self._held_layers = (key, layers)
        return self._held_layers[1]

    def _cache_and_slots(self, tokens: int) -> tuple[KVCache, torch.Tensor]:
        bs = self.grid.block_size
        blocks = -(-tokens // bs) + 1
        cache = KVCache(_one_layer(self.model), CacheConfig(bs, blocks), self.torch_dtype, self.device)
        return cache, torch.arange(tokens, device=self.device)

    def _attention(self, op: str, p: dict) -> Callable[[], object]:
        from dataclasses import replace

        bs = self.grid.block_size
        c = replace(self.model, num_heads=p["num_heads"], num_kv_heads=p["num_kv_heads"], head_dim=p["head_dim"])
        if op == "attention_prefill":
            seqs = [(p["kv_len"] - p["q_len"], p["q_len"], p["kv_len"])]
        elif op == "attention_verify":
            seqs = [(p["kv_len"] - p["q_len"], p["q_len"], p["kv_len"])] * p["batch"]
        else:
            seqs = [(p["kv_len"] - 1, 1, p["kv_len"])] * p["batch"]
        total_blocks = sum(-(-kv // bs) for *_, kv in seqs)
        cache = KVCache(_one_layer(c), CacheConfig(bs, total_blocks), self.torch_dtype, self.device)
        chunks, slots, next_block = [], [], 0
        for start, n, kv in seqs:
            table = list(range(next_block, next_block + -(-kv // bs)))
            next_block += len(table)
            chunks.append((start, n, table))
            slots += slots_for(table, start, start + n, bs)
        verifying = set(range(len(chunks))) if op == "attention_verify" else set()
        meta = build_metadata(slots, chunks, bs, {None}, self.device, verifying)
        tokens = len(slots)
        q = self._tensor(tokens, c.num_heads, c.head_dim)
        k = self._tensor(tokens, c.num_kv_heads, c.head_dim)
        scale = c.head_dim ** -0.5
        return lambda: attend(q, k, k, cache, 0, meta, None, scale)

    def _elementwise(self, name: str, tokens: int) -> Callable[[], object]:
        c = self.model
        x = self._tensor(tokens, c.hidden_size)
        if name == "rms_norm":
            norm = RMSNorm(c.hidden_size, c.rms_norm_eps).to(self.device, self.torch_dtype)
            return lambda: norm(x)
        if name == "rope":
            rotary = RotaryEmbedding(c.rope, c.head_dim, max(tokens, 2)).to(self.device)
            q = self._tensor(tokens, c.num_heads, c.head_dim)
            k = self._tensor(tokens, c.num_kv_heads, c.head_dim)
            positions = torch.arange(tokens, device=self.device)
            return lambda: apply_rotary(q, k, *rotary(positions, self.torch_dtype))
        if name == "swiglu":
            gate_up = self._tensor(tokens, 2 * c.intermediate_size)
            return lambda: (lambda g, u: F.silu(g) * u)(*gate_up.split(c.intermediate_size, dim=-1))
        if name == "add":
            y = self._tensor(tokens, c.hidden_size)
            return lambda: x + y
        raise ValueError(f"cannot profile elementwise op {name!r}")

    def _forward(self, p: dict) -> Callable[[], object]:
        """The model runner's step (input preparation, forward, LM head, sampling) over `batch`
        sequences computing q_len tokens each at context kv_len (and one computing extra_q at
        extra_kv), on a model of p["layers"] layers."""
        from dataclasses import replace

        from engine.runner import ModelRunner
        from engine.scheduler import ScheduledChunk, SchedulerOutput

        bs = self.grid.block_size
        config = replace(self.model, num_layers=p["layers"])
        per_seq = -(-max(p["kv_len"], p["extra_kv"]) // bs)
        sequences = [(p["q_len"], kv) for kv in forward_contexts(p)] + (
            [(p["extra_q"], p["extra_kv"])] if p["extra_q"] else [])
        # A serving pool is larger than one step's blocks and a request's blocks are scattered in
        # it: the same here (FORWARD_POOL_FACTOR times the blocks, tables drawn at random), so
        # KV gathers miss caches as they do in the engine.
        pool = per_seq * len(sequences) * FORWARD_POOL_FACTOR
        cache_config = CacheConfig(bs, pool)
        blocks = torch.randperm(pool, generator=torch.Generator().manual_seed(0)).tolist()
        model = self._forward_model(config)
        runner = ModelRunner(model, config, cache_config, self.device, self.torch_dtype)
        requests, chunks = {}, []
        greedy = SamplingParams(temperature=0.0, ignore_eos=True)
        for i, (q_len, kv_len) in enumerate(sequences):
            seq = Sequence(str(i), [1 + (i + t) % 100 for t in range(kv_len)], greedy, 0.0)
            seq.block_table = blocks[i * per_seq:(i + 1) * per_seq]
            seq.num_computed_tokens = kv_len - q_len
            requests[seq.request_id] = seq
            chunks.append(ScheduledChunk(seq.request_id, kv_len - q_len, q_len, q_len > 1, True))
        out = SchedulerOutput(chunks)
        return lambda: runner.execute(out, requests, {})

    def _forward_model(self, config: ModelConfig) -> DecoderModel:
        """A random-weight model of config's depth, made once per depth on the device and kept
        for every forward point of that depth (positions up to the deepest point's context)."""
        if self._held_model is None or self._held_model[0] != config.num_layers:
            self._held_model = None
            longest = max(max(p["kv_len"], p["extra_kv"]) for op, p in self.plan() if op == "forward")
            model = build_decoder(config, longest + self.grid.block_size, None, 0, self.device)
            self._held_model = (config.num_layers, model.prepare(self.device, self.torch_dtype))
        return self._held_model[1]

    def _moe(self, op: str, p: dict) -> Callable[[], object]:
        """engine/moe.py's parts: `active` experts each over `rows` rows (one GEMM pair per expert,
        as the engine runs them), or the router and the grouping and weighted sum of a step's rows
        without the experts."""
        from dataclasses import replace

        from engine.moe import SparseMoE

        c = self.model
        experts = p["active"] if op == "moe_experts" else 1

        def build() -> SparseMoE:
            moe = SparseMoE(replace(c, expert_parallel=False, num_local_experts=experts,
                                    shared_expert_intermediate_size=0))
            with torch.no_grad():
                for param in moe.parameters():
                    param.normal_(0.0, 0.02)
            moe = moe.to(self.device, self.torch_dtype)
            if self.device.type == "cpu":
                for expert in moe.experts:
                    expert.gate_up_proj.pack_for_cpu()
                    expert.down_proj.pack_for_cpu()
            return moe
        if op == "moe_experts":
            # Rotated through copies, like a GEMM's weights: in a step the experts are read after the
            # rest of the model has been through the caches.
            copies = [build() for _ in range(self._weight_copies(experts * 3 * c.hidden_size * c.moe_intermediate_size))]
            rows = self._tensor(p["rows"] * p["active"], c.hidden_size)
            counts = [p["rows"]] * p["active"]
            turn = itertools.cycle(copies)
            return lambda: next(turn)._run_experts(rows, counts)
        moe = build()
        moe.experts = torch.nn.ModuleList()  # the dispatch alone: no expert computes
        x = self._tensor(p["tokens"], c.hidden_size)
        return lambda: moe._combine(x, *moe.route(x))

    def _idle_wakeup(self, idle_ms: int) -> Callable[[], float]:
        """A callable measuring the first step after idle_ms of sleep minus a back-to-back step
        (medians over a few rounds; a small positive floor, as a profile time must be > 0)."""
        c = self.model
        forward = self._forward(dict(layers=min(c.num_layers, max(self.grid.forward_layers)), batch=1, q_len=1,
                                     kv_len=self.grid.decode_kv[0], spread=0, extra_q=0, extra_kv=0))

        def measure() -> float:
            cold, warm = [], []
            for _ in range(max(3, self.grid.min_repeats)):
                time.sleep(idle_ms / 1e3)
                started = time.perf_counter()
                forward()
                self.sync()
                cold.append(time.perf_counter() - started)
                started = time.perf_counter()
                forward()
                self.sync()
                warm.append(time.perf_counter() - started)
            return max(statistics.median(cold) - statistics.median(warm), 1e-7)

        return measure

    def _step_overhead(self, batch: int) -> Callable[[], object]:
        """Scheduling of one decode step of `batch` running requests: schedule() and update() (input
        preparation belongs to the forward op, which times the model runner)."""
        bs = self.grid.block_size
        scheduler = Scheduler(SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=max(batch, 512),
                                              max_model_len=4096),
                              CacheConfig(bs, batch * (4096 // bs)), eos_token_ids=())
        for i in range(batch):
            scheduler.add(Sequence(str(i), list(range(100)), SamplingParams(max_tokens=3000, ignore_eos=True), 0.0))
        first = scheduler.schedule()
        scheduler.update(first, {ch.request_id: 1 for ch in first.chunks if ch.samples}, 0.0)

        def step() -> None:
            out = scheduler.schedule()
            scheduler.update(out, {ch.request_id: 1 for ch in out.chunks if ch.samples}, 0.0)

        return step


def _groups(plan: list[tuple[str, dict]]) -> Iterator[list[tuple[str, dict]]]:
    """Consecutive points of the same operator (and layer / elementwise name)."""
    group: list[tuple[str, dict]] = []
    for point in plan:
        if group and (group[0][0], group[0][1].get("name")) != (point[0], point[1].get("name")):
            yield group
            group = []
        group.append(point)
    if group:
        yield group


def _one_layer(model: ModelConfig) -> ModelConfig:
    from dataclasses import replace

    return replace(model, num_layers=1, sliding_windows=(None,))


def profile_side_by_side(jobs: list[tuple["Profiler", Path]]) -> list[Profile]:
    """Profile several models in alternation, one operator group of each in turn, so that a
    shared machine's slow and fast spells fall on all of them alike (for comparisons between them)."""
    runs = [profiler.steps(path) for profiler, path in jobs]
    while runs:
        runs = [r for r in runs if next(r, None) is not None]
    return [Profile.load(path) for _, path in jobs]


def write_fitted_beside(path: Path) -> Path | None:
    """Fit the cost model on a finished profile and keep the terms beside it (FittedTerms), so the
    simulator reads them instead of fitting; None where the device is not in the catalog (users'
    own hardware files: the CLI fits in memory then)."""
    from calibrate.fitting import fit_profile
    from simulator.cost.fitted import FittedTerms
    from simulator.cost.model import CostModel

    try:
        model = CostModel.unfitted(Profile.load(path).hardware, path)
    except ValueError:
        return None
    return fit_profile(model, model.profile).save_beside(path)
