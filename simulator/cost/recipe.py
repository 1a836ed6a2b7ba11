"""The step recipe: the one list of what a step of a model runs on one rank, with shapes and
counts, for (model, tp, expert parallelism, dtypes). No torch.

Everything that needs a layer's operators reads it: the step assembler (simulator/cost/step_timer.py)
times its ops, the StepTimer's FLOPs and bytes (MFU / MBU) come from its weights, and
adding an operator to a layer is adding it here.

A step's operators fall in three groups by what their size follows:
* token_ops  the step's token count (linear layers, KV writes, norms, rotary, activation,
             residual adds, TP all-reduces, a mixture-of-experts layer's router and experts);
* head_ops   the rows that go through the LM head (those that sample, and verified drafts);
* attention  per chunk or per batch of decodes: heads, KV heads and head dim per rank here,
             contexts from the step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from engine.policy.dtypes import DTYPE_BYTES, EXPERT_ONLY_WEIGHTS, WEIGHT_BYTES, canonical_dtype
from simulator.catalog.models import ModelSpec


@dataclass(frozen=True)
class Op:
    """count occurrences per step of operator `kind` at `shape` (the keys of CostModel.source),
    reported as `name`, each at a size that follows the step's tokens (or head rows):
    the count itself; times bytes_per_row (collectives: bytes), divided by `divisor`; or for an
    all-to-all the ceil(rows / shards) rows of one rank times bytes_per_row."""

    name: str
    kind: str
    shape: tuple
    count: float
    bytes_per_row: int = 0
    divisor: int = 1
    shards: int = 0

    def size(self, rows: int) -> int:
        if self.shards:
            return -(-rows // self.shards) * self.bytes_per_row
        if self.bytes_per_row:
            return rows * self.bytes_per_row // self.divisor
        return rows


@dataclass(frozen=True)
class StepRecipe:
    model: ModelSpec
    tp: int
    dtype: str  # canonical compute dtype
    weight_dtype: str | None
    expert_parallel: bool
    routing_skew: float
    token_ops: tuple[Op, ...]
    head_ops: tuple[Op, ...]
    heads: int  # attention per rank
    kv_heads: int
    # Work per step (per rank) for MFU / MBU: FLOPs per token through the linear layers (a MoE
    # layer's k routed experts and its shared one), per LM-head row, per attended key, all layers.
    flops_per_token: float
    flops_per_sample: float
    attention_flops_per_key: float
    weight_bytes: float  # every dense weight once and k experts per MoE layer
    expert_bytes: float  # one routed expert's weights, all MoE layers (a step reads those it touches)

    @property
    def layers(self) -> int:
        return self.model.num_layers

    def kv_bytes_per_token(self, kv_dtype: str | None) -> float:
        """K and V bytes per token of context, all layers, in the cache's format."""
        m = self.model
        return 2.0 * self.kv_heads * m.head_dim * DTYPE_BYTES.get(kv_dtype or self.dtype, 2) * m.num_layers

    @classmethod
    @functools.lru_cache(maxsize=256)
    def of(cls, model: ModelSpec, tp: int = 1, dtype: str = "bf16", weight_dtype: str | None = None,
           expert_parallel: bool = False, routing_skew: float = 0.0) -> "StepRecipe":
        dtype = canonical_dtype(dtype)
        m, layers = model, model.num_layers
        moe_layers = m.num_moe_layers
        dense_layers = layers - moe_layers
        heads, kv_heads = m.num_heads // tp, max(m.num_kv_heads // tp, 1)
        element = DTYPE_BYTES[dtype]
        shapes = m.linear_shapes(tp)
        # Under an experts-only format (mxfp4) every weight but the routed experts' is 16-bit.
        dense_weights = None if weight_dtype in EXPERT_ONLY_WEIGHTS else weight_dtype
        ops: list[Op] = []
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            n, k = shapes[name]
            count = dense_layers if name in ("gate_up_proj", "down_proj") else layers
            if count:
                ops.append(Op(name, "gemm", (n, k, dtype, name, dense_weights), count))
        ops.append(Op("kv_write", "kv_write", (kv_heads, m.head_dim, dtype), layers))
        for name, width in m.elementwise_widths(tp).items():
            count = (2 if name in ("rms_norm", "add") else 1) * (dense_layers if name == "swiglu" else layers)
            if count:
                ops.append(Op(name, "elementwise", (name, width, dtype), count))
        hidden_bytes = m.hidden_size * element
        if tp > 1:
            # After attention and after the MLP of every layer, and after the vocabulary-parallel
            # embedding. (An expert-parallel MoE layer's exchange is its own, below.)
            ops.append(Op("all_reduce", "all_reduce", (tp,), 2 * layers + 1 - (moe_layers if expert_parallel else 0),
                          bytes_per_row=hidden_bytes))
        if moe_layers:
            ops += _moe_ops(m, tp, dtype, moe_layers, weight_dtype, expert_parallel, routing_skew)
        n, k = shapes["lm_head"]
        head = [Op("lm_head", "gemm", (n, k, dtype, "lm_head", None), 1), Op("sample", "sample", (m.vocab_size, dtype), 1)]
        if tp > 1:  # the logits gathered from the vocabulary shards: a ring all-gather moves about
            # what an all-reduce of half the bytes does
            head.append(Op("all_reduce", "all_reduce", (tp,), 1, bytes_per_row=m.vocab_size * 4, divisor=2))

        per_token_linear = ((shapes["qkv_proj"][0] * shapes["qkv_proj"][1] + shapes["o_proj"][0] * shapes["o_proj"][1])
                            * layers + (shapes["gate_up_proj"][0] * shapes["gate_up_proj"][1]
                                        + shapes["down_proj"][0] * shapes["down_proj"][1]) * dense_layers)
        per_weight = WEIGHT_BYTES.get(weight_dtype or dtype, 2.0)
        dense_bytes = WEIGHT_BYTES.get(dense_weights or dtype, 2.0)
        per_token_dense = per_token_linear
        expert_bytes = 0.0
        if m.is_moe:
            experts = m.expert_shapes(tp)
            per_layer = m.experts_per_token * sum(n * k for name, (n, k) in experts.items() if name.startswith("expert_"))
            per_layer += sum(n * k for name, (n, k) in experts.items() if name.startswith("shared_"))
            per_token_linear += per_layer * moe_layers
            whole_or_sliced = m.expert_shapes(tp, expert_parallel)
            expert_bytes = sum(whole_or_sliced[name][0] * whole_or_sliced[name][1]
                               for name in ("expert_gate_up", "expert_down")) * per_weight * moe_layers
        weight_bytes = (per_token_linear + n * k) * per_weight if dense_weights == weight_dtype else \
            (per_token_dense + n * k) * dense_bytes + (per_token_linear - per_token_dense) * per_weight
        return cls(model, tp, dtype, weight_dtype, expert_parallel, routing_skew, tuple(ops), tuple(head), heads,
                   kv_heads, flops_per_token=2.0 * per_token_linear, flops_per_sample=2.0 * n * k,
                   attention_flops_per_key=4.0 * heads * m.head_dim * layers, weight_bytes=weight_bytes,
                   expert_bytes=expert_bytes)


def _moe_ops(m: ModelSpec, tp: int, dtype: str, layers: int, weight_dtype: str | None, expert_parallel: bool,
             routing_skew: float) -> list[Op]:
    """The feed-forward of `layers` MoE layers (engine/moe.py):
    - router, dispatch and combine (moe_dispatch);
    - the routed experts at the step's expected load (simulator/cost/moe.py): few tokens touch
      few experts and read only their weights, many touch all and run them compute-bound; on the
      most loaded rank under expert parallelism (every rank waits for it);
    - the shared expert, every token;
    - under expert parallelism, the all-to-all out and back of each rank's share of the rows and
      the gather of the token shares; under tensor parallelism, the shared expert's own
      all-reduce (the routed experts' is the per-layer one)."""
    element = DTYPE_BYTES[dtype]
    ranks = tp if expert_parallel else 1
    shapes = m.expert_shapes(tp, expert_parallel)
    ops = [Op("moe_dispatch", "moe_dispatch", (m.num_experts, m.experts_per_token, m.hidden_size, dtype), layers),
           Op("moe_experts", "moe_experts", (m.num_experts, m.experts_per_token, routing_skew, ranks, m.hidden_size,
                                             shapes["expert_down"][1], dtype, weight_dtype), layers)]
    if "shared_gate_up" in shapes:
        for name in ("shared_gate_up", "shared_down"):
            n, k = shapes[name]
            ops.append(Op(name, "gemm", (n, k, dtype, "gate_up_proj" if "gate_up" in name else "down_proj",
                                         weight_dtype), layers))
        ops.append(Op("swiglu", "elementwise", ("swiglu", shapes["shared_down"][1], dtype), layers))
        if tp > 1:
            ops.append(Op("all_reduce", "all_reduce", (tp,), layers, bytes_per_row=m.hidden_size * element))
    if expert_parallel and tp > 1:
        ops.append(Op("all_to_all", "all_to_all", (tp,), 2 * layers,
                      bytes_per_row=m.experts_per_token * (m.hidden_size + 1) * element, shards=tp))
        ops.append(Op("all_reduce", "all_reduce", (tp,), layers, bytes_per_row=m.hidden_size * element, divisor=2))
    return ops
