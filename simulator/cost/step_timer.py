"""Step times of one replica for the simulator: CostModel.step_time, composed from cached parts.

A step's time is a sum of parts that each depend on a few integers: the step recipe's token
operators on the step's token count, prefill attention on each chunk's (tokens, context), decode
attention on (number of decodes, their total context), the recipe's head operators on the number
of sampled rows, and the host overhead on the number of chunks. Each part is timed by the cost
model's sources (the same ones CostModel.step_time reads, so the result equals it) once per
distinct argument and then looked up, so a simulated step costs a few dict lookups. Under pipeline parallelism a micro-batch crosses pp - 1 stage boundaries, each
a point-to-point send of its hidden states.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import ClassVar

from engine.policy.decode_groups import padded_decode_batches
from engine.policy.scheduler import ScheduledChunk
from engine.policy.dtypes import DTYPE_BYTES
from simulator.catalog.models import ModelSpec
from simulator.cost.host import SHAPE_CHANGE_TERMS, framework_overhead, moe_host_features
from simulator.cost.model import CostModel
from simulator.cost.moe import step_load
from simulator.cost.recipe import StepRecipe
from simulator.cost.steady_runs import PaddedSteadyRun, SteadyRun, StepParts, UniformSteadyRun

# Distinct arguments remembered per part before the memo starts afresh (bounds memory on long runs).
_MEMO_LIMIT = 200_000


@dataclass
class TimeSplit:
    """Where a replica's busy time went, in seconds (summed over steps)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    communication_s: float = 0.0
    overhead_s: float = 0.0
    flops: float = 0.0  # per GPU
    bytes_moved: float = 0.0  # per GPU: weights and KV read
    steps: int = 0

    def merge(self, other: "TimeSplit") -> None:
        for name in ("prefill_s", "decode_s", "communication_s", "overhead_s", "flops", "bytes_moved", "steps"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class StepTimer:
    # plan_steady_run times decode steps as step() would: replicas may take them in bulk.
    times_steady_runs: ClassVar[bool] = True
    # Step times depend on when the step starts: replicas set `now` before each step (calibrate/validation/speed_trace.py).
    follows_time: ClassVar[bool] = False
    cost_model: CostModel
    model: ModelSpec
    tp: int = 1
    pp: int = 1
    dtype: str = "bf16"
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    block_size: int = 16
    split: TimeSplit = field(default_factory=TimeSplit)
    # Mixture-of-experts models (the recipe's MoE layers): whole experts per rank, and the router's skew.
    expert_parallel: bool = False
    routing_skew: float = 0.0

    def __post_init__(self) -> None:
        self.last_sampled = 0  # rows that sampled a token in the last step timed
        self._layers = self.model.num_layers
        self._pads = self.cost_model.pads_decodes
        self._operator_scale = self.cost_model.framework.get("operator_scale", 1.0)
        # Whether shape_change can be nonzero: replicas count each step's tokens only then.
        self.times_shape_changes = any(self.cost_model.framework.get(term) for term in SHAPE_CHANGE_TERMS)
        self._tokens: dict[int, tuple[float, float]] = {}
        recipe = self.recipe = StepRecipe.of(self.model, self.tp, self.dtype, self.weight_dtype, self.expert_parallel,
                                             self.routing_skew)
        cm = self.cost_model
        # (time(size), count, size(rows), is an all-reduce) of each token / head operator, in the recipe's order.
        self._token_ops = [(cm.source(op.kind, op.shape).time, op.count, op.size, op.name == "all_reduce")
                           for op in recipe.token_ops]
        self._head_ops = [(cm.source(op.kind, op.shape).time, op.count, op.size) for op in recipe.head_ops]
        self._attention = (recipe.heads, recipe.kv_heads, self.model.head_dim, recipe.dtype)
        self._prefill: dict[tuple[int, int], float] = {}
        self._decode: dict[tuple[int, int], float] = {}  # (decodes, total context)
        self._decode_timers: dict = {}  # decodes -> the decode-attention source's time
        self._padded: dict[tuple[int, int], float] = {}  # (batch, padded context) of one padded group
        self._verify: dict[tuple[int, int, int], float] = {}  # (chunks, queries, total context)
        # Reading a quantized KV cache dequantizes what it gathers (profiled kv_gather points), on
        # top of each attention call's time; None: a plain cache, or a profile without them.
        self._kv_dequant = cm.kv_dequant_timer(self.kv_dtype, recipe.kv_heads, self.model.head_dim, self.dtype)
        self._head: dict[int, float] = {}
        self._overhead: dict[int, float] = {}
        self._kv_bytes_per_token = recipe.kv_bytes_per_token(self.kv_dtype)
        self._weight_reads: dict[int, float] = {}  # tokens -> weight bytes read by a step of that many
        self._moe_hosts: dict[int, tuple[float, float]] = {}  # tokens -> moe_host_features

    def _moe_host(self, tokens: int) -> tuple[float, float]:
        if not self.model.is_moe:
            return (0.0, 0.0)
        return self._memo(self._moe_hosts, tokens, lambda: moe_host_features(self.model, tokens))

    def weight_bytes(self, tokens: int) -> float:
        """Weight bytes one step of `tokens` tokens reads (per GPU): every dense weight once, and of
        a mixture-of-experts model the experts it is expected to touch (simulator/cost/moe.py)."""
        recipe = self.recipe
        if not recipe.expert_bytes:  # dense: every weight once per step
            return recipe.weight_bytes
        def compute() -> float:
            m = self.model
            load = step_load(tokens, m.num_experts, m.experts_per_token, self.routing_skew,
                             self.tp if self.expert_parallel else 1)
            # The recipe counts k experts per MoE layer; a step reads those it touches.
            return recipe.weight_bytes + (load.active_experts - m.experts_per_token) * recipe.expert_bytes
        return self._memo(self._weight_reads, tokens, compute)

    # -- parts --------------------------------------------------------------------------------
    def _memo(self, table: dict, key, compute):
        value = table.get(key)
        if value is None:
            if len(table) >= _MEMO_LIMIT:
                table.clear()
            value = table[key] = compute()
        return value

    def token_ops(self, tokens: int) -> tuple[float, float]:
        """(compute, communication) seconds of the token-proportional operators and pipeline sends."""
        def compute() -> tuple[float, float]:
            total_s = all_reduce_s = 0.0  # summed as StepCost.add sums them
            rows = self.cost_model.graph_tokens(tokens)
            for time_of, count, size, is_all_reduce in self._token_ops:
                t = time_of(size(rows)) * count
                total_s += t
                if is_all_reduce:
                    all_reduce_s += t
            comm = all_reduce_s
            if self.pp > 1:
                nbytes = tokens * self.model.hidden_size * DTYPE_BYTES[self.dtype]
                # A point-to-point send costs about a two-rank all-reduce of the same bytes.
                comm += (self.pp - 1) * self.cost_model.predict_all_reduce(nbytes, 2).time_s
            return total_s - all_reduce_s, comm
        return self._memo(self._tokens, tokens, compute)

    def prefill_attention(self, num_tokens: int, context_len: int) -> float:
        def compute() -> float:
            source = self.cost_model.source("attention_prefill", (num_tokens, *self._attention))
            return 0.0 + source.time(context_len) * self._layers + self._kv_read(context_len)
        return self._memo(self._prefill, (num_tokens, context_len), compute)

    def _kv_read(self, tokens: int) -> float:
        """Extra seconds, all layers, of reading `tokens` tokens from a quantized KV cache."""
        return self._kv_dequant(tokens) * self._layers if self._kv_dequant is not None else 0.0

    def verify_attention(self, batch: int, queries: int, total_context: int) -> float:
        """Speculative verification chunks attended together, all layers (CostModel.verify_source)."""
        def compute() -> float:
            source = self.cost_model.verify_source(queries, *self._attention)
            return 0.0 + source.time((batch, total_context)) * self._layers + self._kv_read(total_context)
        return self._memo(self._verify, (batch, queries, total_context), compute)

    def padded_decode_attention(self, context_lens: list[int]) -> tuple[float, int]:
        """The engine's padded decode batches (profiled engine devices: CostModel.pads_decodes):
        (seconds, number of attention calls)."""
        total = 0.0
        groups = padded_decode_batches(context_lens, self.block_size)
        for batch, padded in groups:
            total += self._memo(self._padded, (batch, padded), lambda b=batch, p=padded: self._decode_group(b, p))
        return total, len(groups)

    def _decode_group(self, batch: int, padded: int) -> float:
        source = self.cost_model.source("attention_decode", (batch, *self._attention))
        return 0.0 + source.time(padded * batch) * self._layers + self._kv_read(batch * padded)

    def decode_attention(self, batch: int, total_context: int) -> float:
        """Decode attention of `batch` paged decodes over total_context keys, all layers (what
        CostModel.step_time adds, from the cost model's source for the batch size)."""
        key = (batch, total_context)
        value = self._decode.get(key)
        if value is None:
            time_of = self._decode_timers.get(batch)
            if time_of is None:
                time_of = self._decode_timers[batch] = self.cost_model.source(
                    "attention_decode", (batch, *self._attention)).time
            if len(self._decode) >= _MEMO_LIMIT:
                self._decode.clear()
            value = 0.0 + time_of(total_context) * self._layers  # as StepCost.add sums it
            if self._kv_dequant is not None:
                value += self._kv_read(total_context)
            self._decode[key] = value
        return value

    def head(self, sampled: int) -> float:
        def compute() -> float:
            total = 0.0
            for time_of, count, size in self._head_ops:
                total += time_of(size(sampled)) * count
            return total
        return self._memo(self._head, sampled, compute)

    def overhead(self, num_chunks: int, prefill_chunks: int, decode_groups: int, tokens: int,
                 verifying: int = 0) -> float:
        """Host-side time: the scheduler's, and the framework's per-step and per-layer overhead
        (the additive terms of CostModel.predict_framework)."""
        f = self.cost_model.framework
        framework = framework_overhead(f, num_chunks, prefill_chunks, decode_groups, tokens, self._layers,
                                       verifying, self._moe_host(tokens)) if f else 0.0
        return framework + self._memo(self._overhead, num_chunks,
                                      lambda: self.cost_model.predict_step_overhead(num_chunks).time_s)

    def wakeup(self, idle_s: float) -> float:
        """Extra time of the first step after idle_s seconds without work (profiled devices)."""
        return self.cost_model.predict_idle_wakeup(idle_s).time_s if idle_s > 0 else 0.0

    def shape_change(self, previous_tokens: int | None, tokens: int) -> float:
        """Extra time of a step of `tokens` tokens right after one of previous_tokens (None: after
        idle, or the first step): CostModel.predict_shape_change. Not added to `split`, like wakeup."""
        if not self.times_shape_changes:
            return 0.0
        return self.cost_model.predict_shape_change(previous_tokens, tokens).time_s

    def plan_steady_run(self, running, steps: int, start_s: float, context: int | None = None,
                        first_extra_s: float = 0.0) -> "SteadyRun":
        """Up to `steps` steady decode steps from start_s (each running request decoding one token
        per step), timed as the caller asks for them (SteadyRun.plan, plan_until) and booked when it
        commits as many as it ends up taking (a replica whose run an arrival cuts short takes
        fewer). Each step's time is step()'s to the last bit, the first one's plus first_extra_s
        (its shape_change); committed steps add to `split` as step() would (its sums may differ
        in rounding)."""
        self.last_sampled = len(running)
        if self._pads:  # the engine's padded groups depend on every context: build each step
            return self._padded_steady_run(running, steps, start_s, first_extra_s)
        n = len(running)
        if context is None:  # the first step's total decode context, unless the caller summed it
            context = sum(seq.num_computed_tokens + 1 for seq in running)
        # n decodes of total context `context`: only decode attention changes from step to step.
        return UniformSteadyRun(self, n, context, steps, start_s,
                                 self._complete(n, n, n, context, 0, 0.0, 0, 0, n, 0.0, 1), first_extra_s)

    def _padded_steady_run(self, running, steps: int, start_s: float, first_extra_s: float) -> "SteadyRun":
        times: list[float] = []
        parts_of_steps: list[StepParts] = []
        now = start_s
        for k in range(steps):
            parts = self._parts([ScheduledChunk(s.request_id, s.num_computed_tokens + k, 1, False, True)
                                 for s in running])
            now += parts.total_s + first_extra_s if k == 0 else parts.total_s
            times.append(now)
            parts_of_steps.append(parts)
        return PaddedSteadyRun(self, steps, times, parts_of_steps)

    # -- a step -------------------------------------------------------------------------------
    def step(self, chunks: Seq[ScheduledChunk]) -> float:
        """Seconds for the step that computes these chunks; adds it to `split`."""
        parts = self._parts(chunks)
        return self._record(parts) if parts is not None else 0.0

    def _parts(self, chunks: Seq[ScheduledChunk]) -> "StepParts | None":
        tokens = sampled = decodes = decode_context = prefill_tokens = head_rows = 0
        prefill_s = 0.0
        keys = prefill_context = 0
        padded = self._pads
        contexts: list[int] = []
        verify = verify_context = verify_queries = 0  # speculative verification chunks: attended in one batch
        for _, start, n, is_prefill, samples in chunks:
            tokens += n
            if samples:
                sampled += 1
            if n == 1:
                decodes += 1
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
                prefill_tokens += n
                prefill_s += self.prefill_attention(n, start + n)
                keys += n * start + n * (n + 1) // 2
                prefill_context += start + n
        self.last_sampled = sampled
        if not tokens:
            return None
        groups = 1 if decodes else 0
        if not decodes:
            decode_s = 0.0
        elif padded:
            decode_s, groups = self.padded_decode_attention(contexts)
        else:
            decode_s = self.decode_attention(decodes, decode_context)
        if verify:  # one padded batch (engine/attention.py VerifyBatch), counted as one more group
            decode_s += self.verify_attention(verify, verify_queries, verify_context)
            groups += 1
        return self._complete(tokens, sampled + head_rows, decodes + verify, decode_context, prefill_tokens,
                              prefill_s, keys, prefill_context, len(chunks), decode_s, groups, 1 if verify else 0)

    def _complete(self, tokens: int, sampled: int, decodes: int, decode_context: int, prefill_tokens: int,
                  prefill_s: float, keys: int, prefill_context: int, num_chunks: int, decode_s: float,
                  groups: int, verifying: int = 0) -> "StepParts":
        """The token-proportional, head and host parts of a step whose attention is known."""
        compute_s, comm_s = self.token_ops(tokens)
        head_s = self.head(sampled) if sampled else 0.0
        if self._operator_scale != 1.0:  # operators in situ vs timed alone (calibrate.fitting.device.fit_framework)
            scale = self._operator_scale
            compute_s, comm_s, prefill_s, decode_s, head_s = (compute_s * scale, comm_s * scale, prefill_s * scale,
                                                              decode_s * scale, head_s * scale)
        overhead_s = self.overhead(num_chunks, num_chunks - decodes, groups, tokens, verifying)
        recipe = self.recipe
        return StepParts(compute_s, comm_s, prefill_s, decode_s, head_s, overhead_s, prefill_tokens / tokens,
                          recipe.flops_per_token * tokens + recipe.flops_per_sample * sampled
                          + recipe.attention_flops_per_key * (keys + decode_context),
                          self.weight_bytes(tokens) + self._kv_bytes_per_token * (decode_context + prefill_context))

    def _record(self, parts: "StepParts") -> float:
        """Add a step's parts to `split`; its time."""
        split = self.split
        split.prefill_s += parts.prefill_s + (parts.compute_s + parts.head_s) * parts.prefill_share
        split.decode_s += parts.decode_s + (parts.compute_s + parts.head_s) * (1.0 - parts.prefill_share)
        split.communication_s += parts.comm_s
        split.overhead_s += parts.overhead_s
        split.flops += parts.flops
        split.bytes_moved += parts.bytes_moved
        split.steps += 1
        return parts.total_s
