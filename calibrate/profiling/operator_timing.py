"""Timing the engine's own operators one profile point at a time (calibrate/profiling/profiler.py runs
the plan of calibrate/profiling/plan.py through an OperatorTimer).

Every operator is the engine's code: packed-weight GEMMs (engine/linear.py), paged attention
(engine/attention.py), KV-cache writes and reads, RMSNorm / rotary / SwiGLU / residual adds,
sampling, the scheduler's work per step, whole model-runner steps, the first step after idle and
the parts of a mixture-of-experts layer. GEMMs rotate through copies of their weights and whole
forwards read a scattered KV pool, as in serving. Each point: warm-up, then the median of repeated
timed calls (median_time). Random weights: timing does not depend on their values.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from calibrate.profiling.plan import ProfileGrid
from engine.attention import attend, build_metadata
from engine.policy.config import CacheConfig, ModelConfig, SchedulerConfig
from engine.kv_cache import KVCache
from engine.linear import Linear
from engine.model import DecoderModel, RMSNorm
from engine.rope import RotaryEmbedding, apply_rotary
from engine.step_plan import slots_for
from engine.sampler import sample
from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import Scheduler
from engine.policy.sequence import Sequence
from engine.weights import build_decoder
from simulator.cost.profile_format import forward_contexts


# Weight rotation of GEMM timings (OperatorTimer._weight_copies): enough bytes to leave every cache.
ROTATION_BYTES = 256 * 2**20
MAX_WEIGHT_COPIES = 64
# Whole-forward timings use a KV pool this many times the blocks their sequences hold.
FORWARD_POOL_FACTOR = 4


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


class OperatorTimer:
    """Builds and times one operator of `model` at one point of the plan: the engine's code for
    that (op, params), on the device, in the profile's dtype. A real-size layer's weights (and a
    forward's model) are kept while the next points time the same one."""

    def __init__(self, model: ModelConfig, grid: ProfileGrid, device: torch.device, torch_dtype: torch.dtype,
                 sync: Callable[[], None], plan: Callable[[], list[tuple[str, dict]]]) -> None:
        self.model = model
        self.grid = grid
        self.device = device
        self.torch_dtype = torch_dtype
        self.sync = sync
        self.plan = plan  # the profile's points, for the deepest context a forward is timed at
        self._held_layers: tuple[tuple, list[Linear]] | None = None
        self._held_model: tuple[int, DecoderModel] | None = None

    @torch.inference_mode()
    def measure(self, op: str, p: dict) -> float:
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
            qk = self._tensor(tokens, c.num_heads + c.num_kv_heads, c.head_dim)  # as engine/model.py rotates them
            positions = torch.arange(tokens, device=self.device)
            return lambda: apply_rotary(qk, *rotary(positions, self.torch_dtype))
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
        from engine.policy.scheduler import ScheduledChunk, SchedulerOutput

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


def _one_layer(model: ModelConfig) -> ModelConfig:
    from dataclasses import replace

    return replace(model, num_layers=1, sliding_windows=(None,))
