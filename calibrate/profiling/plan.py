"""What a profile times (`servecast profile`, calibrate/profiling/profiler.py): the grid of shapes and
settings (ProfileGrid) and, for one model, every point of the plan in the order it is measured
(profile_plan), with the attention head layouts it is timed at (attention_shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.policy.config import ModelConfig


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


def profile_plan(model: ModelConfig, grid: ProfileGrid, dtype: str, tp: int,
                 element_bytes: int, cp: int = 1) -> list[tuple[str, dict]]:
    """(op, params) of every measurement, in order."""
    c, g, d = model, grid, dtype
    plan: list[tuple[str, dict]] = []
    shapes = c.linear_shapes()  # the step recipe's shapes, on one rank
    for name, (n, k) in shapes.items():
        for m in g.gemm_rows:
            plan.append(("gemm", dict(name=name, m=m, n=n, k=k, dtype=d)))
    for heads in attention_shapes(c, g, d):
        for q in g.prefill_q:
            for mult in g.prefill_kv_multiples:
                plan.append(("attention_prefill", dict(q_len=q, kv_len=q * mult, **heads)))
        for batch in g.decode_batch:
            for kv in g.decode_kv:
                plan.append(("attention_decode", dict(batch=batch, kv_len=kv, **heads)))
    own_heads = attention_shapes(c, g, d)[0]  # verification is timed at the model's own layout only
    for q in g.verify_q:
        for batch in g.decode_batch:
            for kv in g.decode_kv:
                if kv > q:
                    plan.append(("attention_verify", dict(batch=batch, q_len=q, kv_len=kv, **own_heads)))
    widths = c.elementwise_widths()
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
    if tp > 1:
        # The all-reduce after attention and after the MLP of every layer: tokens x hidden.
        for m in g.tokens:
            plan.append(("all_reduce", dict(nbytes=m * c.hidden_size * element_bytes, world=tp)))
        if c.num_experts and c.expert_parallel:
            # Expert parallel: each rank's rows (its token share x top-k, hidden + the expert id)
            # out to the experts' ranks and back.
            for m in g.tokens:
                rows = -(-m // tp) * c.experts_per_token
                plan.append(("all_to_all", dict(nbytes=rows * (c.hidden_size + 1) * element_bytes, world=tp)))
    if cp > 1:
        # Ring attention's hop (engine/ring_attention.py): a rank's K and V of a sequence of each
        # context, one layer's, to the next rank; and the decodes' queries gathered by all-reduce.
        for context in g.kv_gather_tokens:
            plan.append(("kv_ring", dict(nbytes=-(-context // cp) * 2 * c.kv_size * element_bytes, world=cp)))
        for m in g.tokens:
            plan.append(("all_reduce", dict(nbytes=m * c.q_size * element_bytes, world=cp)))
    return plan


def attention_shapes(model: ModelConfig, grid: ProfileGrid, dtype: str) -> list[dict]:
    """The model's own head layout; the same query / KV widths at other head dims; and at each
    of those head dims, other query heads per KV head over the same KV width."""
    c = model
    layouts = [(c.num_heads, c.num_kv_heads, c.head_dim)]
    for head_dim in grid.attention_head_dims:
        if head_dim != c.head_dim and not c.q_size % head_dim and not c.kv_size % head_dim:
            layouts.append((c.q_size // head_dim, c.kv_size // head_dim, head_dim))
    for _, kv_heads, head_dim in list(layouts):
        for group in grid.attention_groups:
            if (kv_heads * group, kv_heads, head_dim) not in layouts:
                layouts.append((kv_heads * group, kv_heads, head_dim))
    return [dict(num_heads=h, num_kv_heads=kv, head_dim=hd, dtype=dtype) for h, kv, hd in layouts]
