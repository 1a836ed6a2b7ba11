"""The step assembler: a replica's shape (simulator/cost/shape.py) and a step's chunks in, the
step's time out -- the one place a step's time is put together. The simulator calls step() and
plan_steady_run() millions of times; `servecast predict`, the framework fit and reports call
explain(), the same parts with every operator's provenance (step_cost). No torch.

A step's time is a sum of parts on a few integers each: the token operators on its token count
(with pp - 1 sends of hidden states under pipeline parallelism), prefill attention on each chunk's
(tokens, context), decode attention on (decodes, total context), verification on (chunks, queries,
total context), the head on its LM-head rows, the host overhead on its composition. A quantized KV
cache adds dequantization to attention; context parallelism (ContextParallel) shares tokens and
keys over its ranks and adds collectives. Each part is timed once per distinct argument, then
looked up: a simulated step costs a few dict lookups.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import ClassVar

from engine.policy.decode_groups import padded_decode_batches
from engine.policy.dtypes import DTYPE_BYTES
from engine.policy.scheduler import ScheduledChunk
from simulator.cost.context_parallel import ContextParallel
from simulator.cost.host import SHAPE_CHANGE_TERMS, framework_overhead, moe_host_features
from simulator.cost.moe import step_load
from simulator.cost.operators import kv_dequant_timer, verify_source
from simulator.cost.shape import ReplicaShape
from simulator.cost.steady_runs import PaddedSteadyRun, SteadyRun, UniformSteadyRun
from simulator.cost.step_parts import StepComposition, StepParts, StepTally
from simulator.cost.types import Chunk, CostReader, Prediction, StepCost

# Distinct arguments remembered per part before the memo starts afresh (bounds memory on long runs).
_MEMO_LIMIT = 200_000


def _timed(source, size, count: float, name: str, ledger: StepCost | None) -> float:
    """count x the source's time at size; booked with its provenance where a ledger is kept."""
    if ledger is None:
        return source.time(size) * count
    prediction = source.predict(size)
    ledger.add(name, prediction, count)
    return prediction.time_s * count


class StepTimer:
    times_steady_runs: ClassVar[bool] = True  # plan_steady_run times decode steps as step() would (in bulk)
    # Step times depend on when the step starts: replicas set `now` before each step (calibrate/validation/speed_trace.py).
    follows_time: ClassVar[bool] = False

    def __init__(self, cost_model: CostReader, shape: ReplicaShape) -> None:
        self.cost_model, self.shape = cost_model, shape
        self.split = StepTally()
        self.last_sampled = 0  # rows that sampled a token in the last step timed
        model = self.model = shape.model
        self._layers = model.num_layers
        self._pads = cost_model.pads_decodes and shape.block_size is not None
        self._operator_scale = cost_model.framework.get("operator_scale", 1.0)
        # Whether shape_change can be nonzero: replicas count each step's tokens only then.
        self.times_shape_changes = any(cost_model.framework.get(term) for term in SHAPE_CHANGE_TERMS)
        recipe = self.recipe = shape.recipe
        self.context_parallel = ContextParallel(cost_model, shape) if shape.cp > 1 else None
        # (source, op) of each token / head operator, in the recipe's order.
        self._token_ops = [(cost_model.source(op.kind, op.shape), op) for op in recipe.token_ops]
        self._head_ops = [(cost_model.source(op.kind, op.shape), op) for op in recipe.head_ops]
        # On a catalog GPU attention reads the cache in its own precision (FlashAttention 3 reads FP8 as
        # FP8) -- but a GPU without FP8 tensor cores (A100) dequantizes it and is timed in the compute
        # dtype, as a profiled device is (its dequantization apart, below).
        kv, fp8 = shape.kv_dtype, cost_model.accelerator.peak_tflops.get("fp8")
        cache = kv if cost_model.profile is None and (kv in ("bf16", "fp16") or kv == "fp8" and fp8) else None
        self._attention = (recipe.heads, recipe.kv_heads, model.head_dim, cache or recipe.dtype)
        # Sliding layers attend their window (a chunk: and itself); a batch's, min(keys, batch x window).
        self._window = model.sliding_window if model.num_sliding_layers else None
        self._sliding_layers = model.num_sliding_layers
        self._full_layers = self._layers - self._sliding_layers
        # Reading a quantized KV cache dequantizes what it gathers (profiled kv_gather points), on
        # top of each attention call's time; None: a plain cache, or a profile without them.
        self._kv_dequant = kv_dequant_timer(cost_model, shape.kv_dtype, recipe.kv_heads, model.head_dim,
                                            recipe.dtype)
        self._kv_bytes_per_token = recipe.kv_bytes_per_token(shape.kv_dtype)
        self._tokens: dict[int, tuple[float, float]] = {}
        self._prefill: dict[tuple[int, int], float] = {}
        self._decode: dict[tuple[int, int], float] = {}  # (decodes, total context)
        self._decode_sources: dict = {}  # decodes -> the decode-attention source
        self._padded: dict[tuple[int, int], float] = {}  # (batch, padded context) of one padded group
        self._verify: dict[tuple[int, int, int], float] = {}  # (chunks, queries, total context)
        self._head: dict[int, float] = {}
        self._overhead: dict[int, float] = {}
        self._weight_reads: dict[int, float] = {}  # tokens -> weight bytes read by a step of that many
        self._moe_hosts: dict[int, tuple[float, float]] = {}  # tokens -> moe_host_features
        # decodes -> the parts of a steady decode step but its decode attention (plan_steady_run): its
        # times depend on the batch alone (only its flops and bytes read the context, and a run books
        # those itself).
        self._steady_bases: dict[int, StepParts] = {}

    def _memo(self, table: dict, key, compute):
        value = table.get(key)
        if value is None:
            if len(table) >= _MEMO_LIMIT:
                table.clear()
            value = table[key] = compute()
        return value

    def _share(self, count: int) -> int:
        """A rank's share of the step's tokens or keys (all of them without context parallelism)."""
        return count if self.context_parallel is None else self.context_parallel.share(count)

    # -- facts of a step ----------------------------------------------------------------------
    def _moe_host(self, tokens: int) -> tuple[float, float]:
        if not self.model.is_moe:
            return (0.0, 0.0)
        return self._memo(self._moe_hosts, tokens, lambda: moe_host_features(self.model, tokens))

    def weight_bytes(self, tokens: int) -> float:
        """Weight bytes one step of `tokens` tokens reads (per GPU): every dense weight once, and of
        a mixture-of-experts model the experts it is expected to touch (simulator/cost/moe.py).
        Under context parallelism every rank reads its copy for its share of the tokens."""
        recipe, copies = self.recipe, 1 if self.context_parallel is None else self.context_parallel.cp
        if not recipe.expert_bytes:  # dense: every weight once per step
            return copies * recipe.weight_bytes

        def compute() -> float:
            m, shape = self.model, self.shape
            load = step_load(self._share(tokens), m.num_experts, m.experts_per_token, shape.routing_skew,
                             shape.tp if shape.expert_parallel else 1)
            # The recipe counts k experts per MoE layer; a step reads those it touches.
            return copies * (recipe.weight_bytes + (load.active_experts - m.experts_per_token) * recipe.expert_bytes)
        return self._memo(self._weight_reads, tokens, compute)

    # -- parts (each with a ledger: the same numbers, booked with their provenance) -------------
    def token_ops(self, tokens: int, ledger: StepCost | None = None) -> tuple[float, float]:
        """(compute, communication) seconds of the token-proportional operators and pipeline sends."""
        def compute() -> tuple[float, float]:
            total_s = all_reduce_s = 0.0  # summed as StepCost.add sums them
            rows = self.cost_model.graph_tokens(self._share(tokens))
            for source, op in self._token_ops:
                t = _timed(source, op.size(rows), op.count, op.name, ledger)
                total_s += t
                if op.name == "all_reduce":
                    all_reduce_s += t
            comm = all_reduce_s
            pp = self.shape.pp
            if pp > 1:
                nbytes = tokens * self.model.hidden_size * DTYPE_BYTES[self.shape.dtype]
                # A point-to-point send costs about a two-rank all-reduce of the same bytes.
                send = self.cost_model.predict("all_reduce", nbytes, 2)
                if ledger is not None:
                    ledger.add("pipeline_send", send, pp - 1)
                comm += (pp - 1) * send.time_s
            return total_s - all_reduce_s, comm
        return compute() if ledger is not None else self._memo(self._tokens, tokens, compute)

    def _kv_read(self, tokens: int, ledger: StepCost | None = None) -> float:
        """Extra seconds, all layers, of reading `tokens` tokens from a quantized KV cache."""
        if self._kv_dequant is None:
            return 0.0
        t = self._kv_dequant(tokens) * self._layers
        if ledger is not None:
            ledger.add("kv_dequant", Prediction(t, "interpolated", self.cost_model.errors["interpolated"]))
        return t

    def prefill_attention(self, num_tokens: int, context_len: int, ledger: StepCost | None = None) -> float:
        """A prefill chunk's attention, all layers: a rank's queries of it over its whole context."""
        def compute() -> float:
            source = self.cost_model.source("attention_prefill", (self._share(num_tokens), *self._attention))
            local = min(context_len, num_tokens + (self._window or context_len))
            return 0.0 + self._attended(source, context_len, local, "attention_prefill", ledger) \
                + self._kv_read(context_len, ledger)
        return compute() if ledger is not None else self._memo(self._prefill, (num_tokens, context_len), compute)

    def verify_attention(self, batch: int, queries: int, total_context: int, ledger: StepCost | None = None) -> float:
        """Speculative verification chunks attended together, all layers (operators.verify_source)."""
        def compute() -> float:
            keys = self._share(total_context)
            source = verify_source(self.cost_model, queries, *self._attention)
            return 0.0 + _timed(source, (batch, keys), self._layers, source.name, ledger) + self._kv_read(keys, ledger)
        return compute() if ledger is not None else self._memo(self._verify, (batch, queries, total_context), compute)

    def padded_decode_attention(self, context_lens: list[int], ledger: StepCost | None = None) -> tuple[float, int]:
        """The engine's padded decode batches (profiled engine devices: CostModel.pads_decodes):
        (seconds, number of attention calls)."""
        total = 0.0
        groups = padded_decode_batches([self._share(c) for c in context_lens], self.shape.block_size)
        for batch, padded in groups:
            if ledger is not None:
                total += self._decode_group(batch, padded, ledger)
            else:
                total += self._memo(self._padded, (batch, padded), lambda b=batch, p=padded: self._decode_group(b, p))
        return total, len(groups)

    def _decode_group(self, batch: int, padded: int, ledger: StepCost | None = None) -> float:
        source = self.cost_model.source("attention_decode", (batch, *self._attention))
        return 0.0 + _timed(source, padded * batch, self._layers, "attention_decode", ledger) \
            + self._kv_read(batch * padded, ledger)

    def decode_attention(self, batch: int, total_context: int, ledger: StepCost | None = None,
                         remember: bool = True) -> float:
        """Decode attention of `batch` paged decodes over total_context keys, all layers.
        remember=False: neither looked up nor kept in the memo (a steady run's steps each have a
        context of their own, never asked again)."""
        remember = remember and ledger is None
        key = (batch, total_context)
        value = self._decode.get(key) if remember else None
        if value is None:  # the simulator's hottest lookup: memoized inline
            source = self._decode_sources.get(batch)
            if source is None:
                source = self._decode_sources[batch] = self.cost_model.source("attention_decode",
                                                                              (batch, *self._attention))
            keys = self._share(total_context)
            local = min(keys, batch * (self._window or keys))
            value = 0.0 + self._attended(source, keys, local, "attention_decode", ledger)  # as StepCost.add sums it
            if self._kv_dequant is not None:
                value += self._kv_read(keys, ledger)
            if remember:
                if len(self._decode) >= _MEMO_LIMIT:
                    self._decode.clear()
                self._decode[key] = value
        return value

    def _attended(self, source, keys: int, local: int, name: str, ledger: StepCost | None) -> float:
        """An attention call in every layer: over `keys`, the sliding layers over `local` of them."""
        if self._window is None:
            return _timed(source, keys, self._layers, name, ledger)
        return _timed(source, keys, self._full_layers, name, ledger) \
            + _timed(source, local, self._sliding_layers, name, ledger)

    def head(self, sampled: int, ledger: StepCost | None = None) -> float:
        def compute() -> float:
            total = 0.0
            for source, op in self._head_ops:
                total += _timed(source, op.size(sampled), op.count, op.name, ledger)
            return total
        return compute() if ledger is not None else self._memo(self._head, sampled, compute)

    def overhead(self, step: StepComposition) -> float:
        """Host-side time: the scheduler's, and the framework's per-step and per-layer overhead
        (the additive terms of the cost model's framework)."""
        f = self.cost_model.framework
        framework = framework_overhead(f, step.chunks, step.prefill_chunks, step.groups, step.tokens, self._layers,
                                       step.verifying, self._moe_host(step.tokens)) if f else 0.0
        return framework + self._memo(self._overhead, step.chunks,
                                      lambda: self.cost_model.predict("step_overhead", step.chunks).time_s)

    def wakeup(self, idle_s: float) -> float:
        """Extra time of the first step after idle_s seconds without work (profiled devices)."""
        return self.cost_model.predict("idle_wakeup", idle_s).time_s if idle_s > 0 else 0.0

    def shape_change(self, previous_tokens: int | None, tokens: int) -> float:
        """Extra time of a step of `tokens` tokens right after one of previous_tokens (None: after
        idle, or the first step). Not added to `split`, like wakeup."""
        if not self.times_shape_changes:
            return 0.0
        return self.cost_model.predict("shape_change", previous_tokens, tokens).time_s

    # -- steady decode runs -------------------------------------------------------------------
    def plan_steady_run(self, running, steps: int, start_s: float, context: int | None = None,
                        first_extra_s: float = 0.0) -> SteadyRun:
        """Up to `steps` steady decode steps from start_s (each running request decoding one token
        per step), timed as the caller asks for them (SteadyRun.plan, plan_until) and booked when it
        commits as many as it ends up taking (a replica whose run an arrival cuts short takes
        fewer). Each step's time is step()'s to the last bit, the first one's plus first_extra_s
        (its shape_change); committed steps add to `split` as step() would (its sums may differ
        in rounding)."""
        self.last_sampled = len(running)
        if self._pads:  # the engine's padded groups depend on every context: build each step
            return PaddedSteadyRun.timed(self, running, steps, start_s, first_extra_s)
        n = len(running)
        if context is None:  # the first step's total decode context, unless the caller summed it
            context = sum(seq.num_computed_tokens + 1 for seq in running)
        # n decodes of total context `context`: only decode attention changes from step to step.
        base = self._steady_bases.get(n)
        if base is None:
            decodes = StepComposition(tokens=n, sampled=n, decodes=n, decode_context=context, prefill_tokens=0,
                                      keys=0, prefill_context=0, chunks=n, prefill_chunks=0, groups=1, verifying=0)
            base = self._memo(self._steady_bases, n, lambda: self._complete(decodes, 0.0, 0.0))
        return UniformSteadyRun(self, n, context, steps, start_s, base, first_extra_s)

    # -- a step -------------------------------------------------------------------------------
    def step(self, chunks: Seq[ScheduledChunk], decodes: int = 0, decode_context: int = 0) -> float:
        """Seconds for the step that computes these chunks; adds it to `split`. decodes: that many
        more plain decode chunks, over decode_context keys in all, before them (a bulk step's,
        simulator/fleet/steady_decode.py: the same time as listing each one; not on padded devices)."""
        parts = self._parts(chunks, decodes=decodes, decode_context=decode_context)
        return self.split.record(parts) if parts is not None else 0.0

    def explain(self, chunks: Seq[ScheduledChunk], include_host: bool = True) -> StepCost:
        """The step's time by operator, each with its provenance and expected error: the parts
        step() sums, unscaled, with the framework's terms (its operator_scale's share of the
        operators among them) and the scheduler's overhead as two entries (include_host)."""
        ledger = StepCost(0.0)
        if not sum(chunk[2] for chunk in chunks):
            return ledger
        self._parts(chunks, ledger)
        if include_host:
            step, operators_s = self.compose(chunks), ledger.total_s
            ledger.add("step_overhead", self.cost_model.predict("step_overhead", step.chunks))
            ledger.add("framework", self.cost_model.predict(
                "framework", step.chunks, step.tokens, self._layers, operators_s, step.prefill_chunks, step.groups,
                step.verifying, self._moe_host(step.tokens)))
        return ledger

    def compose(self, chunks: Seq[ScheduledChunk]) -> StepComposition:
        """What the step is made of (what its host terms scale with), without timing it."""
        return self._parts(chunks, compose_only=True)

    def _parts(self, chunks: Seq[ScheduledChunk], ledger: StepCost | None = None, compose_only: bool = False,
               decodes: int = 0, decode_context: int = 0):
        """The step's parts (None for an empty step); its composition alone where compose_only.
        One pass over the chunks (the simulator's hottest loop: kept inline). decodes: as step()'s."""
        padded, cp = self._pads, self.context_parallel
        if decodes and padded:
            raise ValueError("padded decode groups need every decode's context: list the decode chunks")
        tokens = sampled = num_decodes = decodes
        prefill_tokens = head_rows = prefill_chunks = 0
        prefill_s = 0.0
        keys = prefill_context = ring_keys = 0
        if ledger is not None:  # booked first, as a step's operators are listed (the recipe's order)
            self.token_ops(sum(chunk[2] for chunk in chunks), ledger)
        contexts: list[int] = []
        verify = verify_context = verify_queries = 0  # speculative verification chunks: attended in one batch
        for _, start, n, is_prefill, samples in chunks:
            tokens += n
            if samples:
                sampled += 1
            if n == 1:
                num_decodes += 1
                decode_context += start + 1
                if padded:
                    contexts.append(start + 1)
            elif not is_prefill:  # the last token and its drafts (engine/attention.py VerifyBatch)
                verify += 1
                verify_context += start + n
                verify_queries = max(verify_queries, n)
                head_rows += n - 1  # every verified row goes through the LM head, not just the sampled one
                keys += n * start + n * (n + 1) // 2
                prefill_context += start + n
            else:
                prefill_chunks += 1
                prefill_tokens += n
                if not compose_only:
                    prefill_s += self.prefill_attention(n, start + n, ledger)
                keys += n * start + n * (n + 1) // 2
                prefill_context += start + n
                if cp is not None:  # its sequence's shard of keys goes round the ring
                    ring_keys += cp.share(start + n)
        if ledger is None and not compose_only:  # a step the simulator takes (explain() times one aside)
            self.last_sampled = sampled
        if not tokens:
            return None
        groups = 1 if num_decodes else 0
        if compose_only:
            if num_decodes and padded:
                groups = len(padded_decode_batches([self._share(c) for c in contexts], self.shape.block_size))
            decode_s = 0.0
        elif not num_decodes:
            decode_s = 0.0
        elif padded:
            decode_s, groups = self.padded_decode_attention(contexts, ledger)
        else:
            decode_s = self.decode_attention(num_decodes, decode_context, ledger)
        if verify:  # one padded batch (engine/attention.py VerifyBatch), counted as one more group
            if not compose_only:
                decode_s += self.verify_attention(verify, verify_queries, verify_context, ledger)
            groups += 1
        step = StepComposition(tokens, sampled + head_rows, num_decodes + verify, decode_context, prefill_tokens,
                               keys, prefill_context, len(chunks) + decodes, prefill_chunks, groups,
                               1 if verify else 0, ring_keys)
        return step if compose_only else self._complete(step, prefill_s, decode_s, ledger)

    def _complete(self, step: StepComposition, prefill_s: float, decode_s: float,
                  ledger: StepCost | None = None) -> StepParts:
        """The token-proportional, head, communication and host parts of a step whose attention is known."""
        compute_s, comm_s = self.token_ops(step.tokens)  # a ledger has them already (_parts)
        head_s = self.head(step.sampled, ledger) if step.sampled else 0.0
        cp, scale = self.context_parallel, self._operator_scale
        # Context parallelism: the decode queries gathered, the head rows summed, the ring's wait.
        extra_s = cp.extra_s(step.tokens - step.prefill_tokens, step.sampled, step.ring_keys, prefill_s, ledger) \
            if cp is not None else 0.0
        if scale != 1.0:  # operators in situ vs timed alone (calibrate's fit_framework)
            compute_s, comm_s, prefill_s, decode_s, head_s = (compute_s * scale, comm_s * scale, prefill_s * scale,
                                                              decode_s * scale, head_s * scale)
        if cp is not None:
            comm_s += extra_s * scale
        overhead_s = self.overhead(step) if ledger is None else 0.0  # explain() books the host terms itself
        recipe = self.recipe
        return StepParts(compute_s, comm_s, prefill_s, decode_s, head_s, overhead_s, step.prefill_tokens / step.tokens,
                         recipe.flops_per_token * step.tokens + recipe.flops_per_sample * step.sampled
                         + recipe.attention_flops_per_key * (step.keys + step.decode_context),
                         self.weight_bytes(step.tokens)
                         + self._kv_bytes_per_token * (step.decode_context + step.prefill_context))


def scheduled(chunks: Seq[Chunk]) -> list[ScheduledChunk]:
    """Chunks described by their sizes (Chunk) as the scheduler hands them to a step."""
    return [ScheduledChunk("", c.context_len - c.num_tokens, c.num_tokens, not c.verify, c.samples) for c in chunks]


def step_cost(cost_model: CostReader, shape: ReplicaShape, chunks: Seq[Chunk], include_host: bool = True) -> StepCost:
    """One step of `chunks` on a replica of this shape, by operator with provenance: what the
    simulator times for the same step (StepTimer.explain)."""
    return StepTimer(cost_model, shape).explain(scheduled(chunks), include_host)
