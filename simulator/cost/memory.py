"""Memory planning of one replica: weights, activation peak and runtime reserve per GPU, and the
KV-cache blocks that fit in the rest. No torch.

Per GPU of a replica with tensor parallelism tp, pipeline parallelism pp and context parallelism cp:

    usable      = memory x gpu_memory_utilization (memory: what CUDA reports where the catalog knows it)
    weights     = the largest pipeline stage's parameters / tp x bytes per weight (quantization scales included)
    activations = a forward over max_num_batched_tokens tokens (hidden states, qkv, MLP, a MoE's
                  expert caches, full-vocabulary logits of the sampled rows), as vLLM's profiling
                  run measures it
    reserve     = memory outside torch's tensors (RUNTIME_RESERVE_BYTES, + COLLECTIVE_RESERVE_BYTES
                  under tp > 1, else STAGE_RESERVE_BYTES under pp or cp > 1), and a hybrid model's sliding
                  layers' windows for max_num_seqs sequences (its blocks then hold the full layers)
    kv          = usable - weights - activations - reserve  ->  blocks of block_size tokens

Context parallelism (engine/context_parallel.py) replicates the weights on each of its cp ranks
and splits every sequence's KV over them by position: a rank's memory is planned as at cp=1, and
the block manager's block is a virtual block of block_size x cp tokens (block_size on each rank),
so the replica holds cp times a rank's tokens. A rank's activations are planned as at cp=1 (it
computes about 1/cp of a step's tokens; the rest covers the K/V shards in flight round the ring).

Catalog memory sizes are decimal GB (80 GB = 80e9 bytes), like the weights they are compared with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.catalog.hardware import GB, GIB, Accelerator  # noqa: F401 (GB, GIB imported from here too)
from simulator.catalog.models import ModelSpec
from engine.policy.dtypes import DTYPE_BYTES, EXPERT_ONLY_WEIGHTS, WEIGHT_BYTES

MXFP4_ALIGN = 256
# Bytes per cached K or V head and token beside its elements: int8 an fp32 scale (the servecast
# engine's per-token scales). fp8 none: vLLM's fp8 KV cache has a scale per layer (its pages are
# 2 x block x heads x head_dim bytes; its logs show twice bf16's tokens).
KV_SCALE_BYTES = {"int8": 4}
# Memory outside torch's tensors that a serving engine's profiling run counts against the KV cache
# (vLLM: non_torch_increase): next to nothing on one GPU; under tensor parallelism its collectives'
# buffers and workspaces. Fitted on vLLM startup logs (docs/kv-capacity.md: the figures, and the
# leave-one-out check). CUDA graphs are captured after the KV cache is sized, in what
# gpu_memory_utilization leaves (vLLM up to 0.19), so they take none of it.
RUNTIME_RESERVE_BYTES = 0.06 * GIB
COLLECTIVE_RESERVE_BYTES = 4.5 * GIB  # tp > 1
STAGE_RESERVE_BYTES = 0.5 * GB  # pipeline or context parallelism alone: their sends' buffers (not fitted)


class MemoryPlanError(ValueError):
    """The configuration does not fit; the message names the shortfall and the fix."""


@dataclass(frozen=True)
class MemoryPlan:
    memory_bytes: float  # per GPU
    usable_bytes: float
    weight_bytes: float  # per GPU (largest stage)
    activation_bytes: float
    reserve_bytes: float
    kv_bytes_per_token: float  # per GPU, all of its layers, K and V
    kv_bytes: float
    block_size: int  # tokens of a block on one GPU
    num_blocks: int  # per pipeline stage group (each GPU holds its layers of every block)
    cp: int = 1  # context-parallel ranks, each holding block_size tokens of every block

    @property
    def scheduled_block_size(self) -> int:
        """Tokens per block as the block manager counts them: a virtual block of block_size tokens
        on each context-parallel rank (engine/policy/config.py EngineConfig.scheduled_block_size)."""
        return self.block_size * self.cp

    @property
    def kv_tokens(self) -> int:
        """Tokens of context the replica's KV cache holds."""
        return self.num_blocks * self.scheduled_block_size

    @property
    def kv_bytes_per_sequence_token(self) -> float:
        """One GPU's KV bytes per token of a sequence: a rank holds 1/cp of every sequence's tokens."""
        return self.kv_bytes_per_token / self.cp

    def to_dict(self) -> dict:
        return {"memory_gb": self.memory_bytes / GB, "usable_gb": self.usable_bytes / GB,
                "weights_gb": self.weight_bytes / GB, "activations_gb": self.activation_bytes / GB,
                "reserve_gb": self.reserve_bytes / GB, "kv_cache_gb": self.kv_bytes / GB,
                "kv_bytes_per_token": self.kv_bytes_per_token, "num_blocks": self.num_blocks,
                "kv_tokens": self.kv_tokens}


def weight_bytes_per_gpu(model: ModelSpec, precision: str, tp: int, pp: int) -> float:
    """Parameters of the largest pipeline stage on one tensor-parallel shard."""
    per_weight = WEIGHT_BYTES[precision]
    embed = model.vocab_size * model.hidden_size
    per_layer = (model.num_parameters() - embed * (1 if model.tie_word_embeddings else 2)
                 - model.hidden_size) / model.num_layers
    layers_per_stage = math.ceil(model.num_layers / pp)
    # Embedding on the first stage, LM head on the last (the same stage when pp == 1); embeddings
    # and norms stay in 16 bits under weight-only quantization.
    ends = embed * (1 if pp > 1 or model.tie_word_embeddings else 2)
    if precision in EXPERT_ONLY_WEIGHTS:  # the routed experts narrow, the rest of each layer 16-bit
        experts = 3 * model.hidden_size * model.expert_intermediate_size * model.num_experts \
            * model.num_moe_layers / model.num_layers
        # vLLM's MXFP4 MoE kernels on Hopper pad the experts' hidden size to a multiple of 256
        # (mxfp4_round_up_hidden_size_and_intermediate_size): gpt-oss's 2,880 is stored as 3,072.
        padded = experts * -(-model.hidden_size // MXFP4_ALIGN) * MXFP4_ALIGN / model.hidden_size
        return (layers_per_stage * (padded * per_weight + (per_layer - experts) * 2.0) + ends * 2.0) / tp
    return (layers_per_stage * per_layer * per_weight + ends * 2.0) / tp


def activation_bytes(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int, tp: int) -> float:
    # The widest feed-forward a token goes through: a dense MLP, or its k experts and the shared one.
    h = model.hidden_size
    ffn = max(model.intermediate_size if model.num_dense_layers or not model.is_moe else 0,
              model.expert_intermediate_size * model.experts_per_token + model.shared_expert_intermediate_size
              if model.is_moe else 0)
    qkv = (model.q_size + 2 * model.kv_size) / tp
    per_token = (4 * h + qkv + 3 * ffn / tp) * 2.0  # 16-bit activations, live at once at the MLP
    if model.is_moe:  # the fused-MoE kernel's caches: each token's k rows in and out of its experts
        per_token += model.experts_per_token * (h + 2 * model.expert_intermediate_size / tp) * 2.0
    # fp32 logits of the sampled rows over the whole vocabulary (gathered from the TP shards)
    logits = min(max_num_seqs, max_num_batched_tokens) * model.vocab_size * 4.0
    return max_num_batched_tokens * per_token + logits


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str, tp: int, pp: int, layers: int | None = None) -> float:
    """K and V bytes per token on one GPU: the stage's layers, or `layers` of them."""
    kv_heads = max(model.num_kv_heads // tp, 1)  # KV heads replicate when tp exceeds them
    layers = math.ceil(model.num_layers / pp) if layers is None else layers
    element = float(DTYPE_BYTES[kv_dtype]) * model.head_dim + KV_SCALE_BYTES.get(kv_dtype, 0)
    return 2.0 * layers * kv_heads * element


def sliding_kv_bytes(model: ModelSpec, kv_dtype: str, tp: int, pp: int, block_size: int, max_num_seqs: int) -> float:
    """The sliding layers' KV of a hybrid model (ModelSpec.hybrid_attention) on one GPU, held
    apart from the token blocks: each running sequence keeps its last window's blocks, plus the one
    being filled, in each sliding layer (vLLM's hybrid manager frees the older ones)."""
    if not model.hybrid_attention:
        return 0.0
    layers = math.ceil(model.num_sliding_layers / pp)
    window_blocks = -(-model.sliding_window // block_size) + 1
    return kv_bytes_per_token(model, kv_dtype, tp, pp, layers) * window_blocks * block_size * max_num_seqs


def block_layers(model: ModelSpec, pp: int) -> int:
    """The layers a token's KV blocks hold on one GPU: the full-attention ones of a hybrid model."""
    layers = model.num_layers - model.num_sliding_layers if model.hybrid_attention else model.num_layers
    return math.ceil(layers / pp)


def plan_memory(model: ModelSpec, accelerator: Accelerator, *, tp: int, pp: int, weight_precision: str,
                kv_dtype: str, gpu_memory_utilization: float, block_size: int, max_num_batched_tokens: int,
                max_num_seqs: int, max_model_len: int | None, memory_bytes: float | None = None,
                draft: ModelSpec | None = None, cp: int = 1) -> MemoryPlan:
    """The replica's memory plan; MemoryPlanError with the cause and a fix when it cannot serve.
    draft: a speculative-decoding draft model, whose weights and KV (a slot per target slot) share
    the GPUs. cp: context-parallel ranks (the module's docstring)."""
    if memory_bytes is None:
        if accelerator.memory_gb is None:
            profiled = (f"{accelerator.id} is timed from its profile (--profile FILE; `servecast profile` makes "
                        "one) and ") if accelerator.profiled else f"{accelerator.id} "
            raise MemoryPlanError(f"{profiled}has no memory size in the catalog: give --num-gpu-blocks N (the KV "
                                  "blocks to simulate) or memory_gb in a --hardware-file entry")
        memory_bytes = accelerator.memory_gb * GB if accelerator.visible_memory_gib is None \
            else accelerator.visible_memory_gib * GIB
    usable = memory_bytes * gpu_memory_utilization
    weights = weight_bytes_per_gpu(model, weight_precision, tp, pp)
    if draft is not None:
        weights += weight_bytes_per_gpu(draft, weight_precision, tp, pp)
    if weights > usable:
        raise MemoryPlanError(_weights_do_not_fit(model, accelerator, weight_precision, tp, pp, usable, memory_bytes,
                                               gpu_memory_utilization))
    activations = activation_bytes(model, max_num_batched_tokens, max_num_seqs, tp)
    reserve = RUNTIME_RESERVE_BYTES + (COLLECTIVE_RESERVE_BYTES if tp > 1 else STAGE_RESERVE_BYTES if pp * cp > 1
                                       else 0.0)
    reserve += sliding_kv_bytes(model, kv_dtype, tp, pp, block_size, max_num_seqs)
    kv = usable - weights - activations - reserve
    per_token = kv_bytes_per_token(model, kv_dtype, tp, pp, block_layers(model, pp))
    if draft is not None:
        per_token += kv_bytes_per_token(draft, kv_dtype, tp, pp)
    num_blocks = int(max(kv, 0) // (per_token * block_size))
    # Without a stated max_model_len the replica serves whatever fits (at least one block).
    needed = -(-max_model_len // (block_size * cp)) if max_model_len is not None else 1
    if num_blocks < needed:
        ranks = f", cp={cp}" if cp > 1 else ""
        raise MemoryPlanError(
            f"{model.name} on {tp * pp * cp} x {accelerator.id} (tp={tp}, pp={pp}{ranks}, {weight_precision} weights) "
            f"leaves {max(kv, 0) / GB:.1f} GB for the KV cache after {weights / GB:.1f} GB of weights and "
            f"{(activations + reserve) / GB:.1f} GB of activations and reserve: {num_blocks} KV blocks, fewer than "
            f"the {needed} block{'s' if needed != 1 else ''} one {max_model_len or block_size}-token request needs. "
            "Use a larger tp, pp or cp, a smaller "
            "weight or KV precision, a lower max_num_batched_tokens or a shorter max_model_len")
    return MemoryPlan(memory_bytes, usable, weights, activations, reserve, per_token, kv, block_size, num_blocks, cp)


def _weights_do_not_fit(model: ModelSpec, accelerator: Accelerator, precision: str, tp: int, pp: int,
                        usable: float, memory: float, utilization: float) -> str:
    total = weight_bytes_per_gpu(model, precision, 1, 1)
    fixes = []
    for more_tp in (2, 4, 8, 16):
        if more_tp > tp and model.num_heads % more_tp == 0 and weight_bytes_per_gpu(model, precision, more_tp, pp) < usable:
            fixes.append(f"tp>={more_tp}")
            break
    smaller = [p for p in ("fp8", "int8", "int4") if WEIGHT_BYTES[p] < WEIGHT_BYTES[precision]
               and weight_bytes_per_gpu(model, p, tp, pp) < usable]
    if smaller:
        fixes.append("/".join(smaller))
    fix = " or ".join(fixes) if fixes else "a larger accelerator or more pipeline stages (pp)"
    return (f"{model.name} at {precision} needs {total / GB:.0f} GB of weights per replica; tp={tp}, pp={pp} on "
            f"{accelerator.id} has {memory / GB:.0f} GB per GPU ({usable / GB:.0f} GB usable at "
            f"gpu_memory_utilization={utilization:g}): use {fix}")
