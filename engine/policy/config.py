"""Configuration of the engine: model facts from an HF config, cache and scheduler knobs.

No torch here: the simulator builds the same SchedulerConfig / CacheConfig and runs the same
scheduler and block manager as the engine. The config.json itself is read by
engine/policy/model_description.py (its ARCHITECTURES registry: how to add a family); ModelConfig is the
engine's view of that description.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.policy.dtypes import ENGINE_DTYPES, dtype_bytes
from engine.policy.model_description import ENGINE_ARCHITECTURES, DecoderShape, ModelDescription, describe
from engine.policy.model_description import RopeConfig  # re-exported: engine/rope.py and ModelConfig.rope

SUPPORTED_ARCHITECTURES = ENGINE_ARCHITECTURES  # the registry's families with engine=True
ROPE_TYPES = ("default", "linear", "llama3")  # engine/rope.py


@dataclass(frozen=True)
class ModelConfig(DecoderShape):
    """Architecture facts of a Llama-family decoder the engine runs (q_size, kv_size and
    num_parameters: DecoderShape)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    # One entry per layer: the sliding-window size of that layer's attention, or None for full.
    sliding_windows: tuple[int | None, ...] = ()
    hidden_act: str = "silu"
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"
    # Mixture of experts (engine/moe.py); num_experts 0: a dense model.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0  # each expert's
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert; 0: none
    norm_topk_prob: bool = True  # renormalize the top-k routing weights to sum to one
    # One entry per layer: True where the feed-forward is the sparse MoE (Qwen2-MoE can keep some dense).
    sparse_layers: tuple[bool, ...] = ()
    # Deployment, not architecture: under tensor parallelism, whole experts per rank (expert
    # parallel) instead of a slice of every expert; a rank's shard holds num_local_experts of them.
    expert_parallel: bool = False
    num_local_experts: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"model config: num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}; grouped-query attention needs every KV head "
                f"to serve the same number of query heads: fix num_key_value_heads")
        if self.head_dim % 2 != 0:
            raise ValueError(f"model config: head_dim={self.head_dim} must be even for rotary embeddings")
        if self.hidden_act != "silu":
            raise ValueError(f"model config: hidden_act={self.hidden_act!r} is not supported; only 'silu' (SwiGLU)")
        if len(self.sliding_windows) != self.num_layers:
            object.__setattr__(self, "sliding_windows", tuple([None] * self.num_layers))
        if self.num_experts:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise ValueError(f"model config: num_experts_per_tok={self.experts_per_token} must be between 1 "
                                 f"and the {self.num_experts} experts")
            if self.moe_intermediate_size <= 0:
                raise ValueError("model config: a MoE model needs a positive expert intermediate size")
            if len(self.sparse_layers) != self.num_layers:
                object.__setattr__(self, "sparse_layers", tuple([True] * self.num_layers))
            if not self.num_local_experts:
                object.__setattr__(self, "num_local_experts", self.num_experts)
        elif len(self.sparse_layers) != self.num_layers:
            object.__setattr__(self, "sparse_layers", tuple([False] * self.num_layers))

    @property
    def num_moe_layers(self) -> int:
        return sum(self.sparse_layers)

    @property
    def shared_expert_gate(self) -> bool:  # engine/moe.py gates the shared expert (Qwen2-MoE's)
        return bool(self.shared_expert_intermediate_size)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V, all layers, for one token."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    @classmethod
    def from_hf(cls, source: Any) -> "ModelConfig":
        """From a transformers PretrainedConfig, a config dict, a config.json path or its directory."""
        if isinstance(source, (str, Path)):
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise ValueError(f"no HF config.json at {path}: pass a model directory or a config.json path")
            try:
                raw = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} is not valid JSON ({exc}): fix the file") from exc
        elif isinstance(source, dict):
            raw = dict(source)
        elif hasattr(source, "to_dict"):
            raw = source.to_dict()
        else:
            raise ValueError(f"cannot read a model config from {type(source).__name__}: "
                             "pass a transformers config, a dict or a path to config.json")
        return cls._from_dict(raw)

    @classmethod
    def _from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        model_type = raw.get("model_type", "llama")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"model_type {model_type!r} is not supported by the engine; "
                             f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
        try:
            description = describe(raw)
        except KeyError as exc:
            raise ValueError(f"model config lacks {exc.args[0]!r}: is this a Llama-family config.json?") from exc
        return cls.from_description(description)

    @classmethod
    def from_description(cls, d: ModelDescription) -> "ModelConfig":
        """The engine's view of a model description. Where config.json is silent, the engine's
        defaults (they differ from the simulator's, simulator/catalog/models.py): max_position_embeddings
        2048; dtype (read before torch_dtype) float32; head_dim hidden_size / num_heads, which must
        divide; and the family's transformers defaults for the keys in d.assumed. Only the rope
        types engine/rope.py computes."""
        head_dim = d.head_dim
        if head_dim is None:
            if d.num_heads <= 0 or d.hidden_size % d.num_heads != 0:
                raise ValueError(f"model config: hidden_size={d.hidden_size} is not divisible by "
                                 f"num_attention_heads={d.num_heads} and no head_dim is given: set head_dim")
            head_dim = d.hidden_size // d.num_heads
        if d.rope.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope type {d.rope.rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
        # None: the experts are as wide as the dense MLP (Mixtral); the engine keeps the width itself.
        expert_width = d.intermediate_size if d.moe_intermediate_size is None else d.moe_intermediate_size
        return cls(
            model_type=d.model_type, vocab_size=d.vocab_size, hidden_size=d.hidden_size,
            intermediate_size=d.intermediate_size, num_layers=d.num_layers, num_heads=d.num_heads,
            num_kv_heads=d.num_kv_heads, head_dim=head_dim,
            max_position_embeddings=2048 if d.max_position_embeddings is None else d.max_position_embeddings,
            rms_norm_eps=d.rms_norm_eps, rope=d.rope, tie_word_embeddings=d.tie_word_embeddings,
            qkv_bias=d.qkv_bias, o_bias=d.o_bias, mlp_bias=d.mlp_bias, qk_norm=d.qk_norm,
            sliding_windows=d.sliding_windows, hidden_act=d.hidden_act, eos_token_ids=d.eos_token_ids,
            dtype=d.dtype or d.torch_dtype or "float32",
            num_experts=d.num_experts, experts_per_token=d.experts_per_token, moe_intermediate_size=expert_width,
            shared_expert_intermediate_size=d.shared_expert_intermediate_size, norm_topk_prob=d.norm_topk_prob,
            sparse_layers=d.sparse_layers,
        )


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV pool as the block manager sees it."""

    block_size: int
    num_blocks: int
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_blocks <= 0:
            raise ValueError(f"the KV pool has {self.num_blocks} blocks: it needs at least one; "
                             "raise num_blocks or the KV byte budget")


def check_chunked_prefill(max_num_batched_tokens: int, max_model_len: int, enable_chunked_prefill: bool) -> None:
    """Without chunked prefill a whole prompt must fit one step: ValueError naming the fix where a
    prompt of max_model_len tokens could not (the engine's SchedulerConfig and SimConfig both ask)."""
    if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        raise ValueError(f"without chunked prefill a whole prompt must fit one step, but max_num_batched_tokens="
                         f"{max_num_batched_tokens} < max_model_len={max_model_len}, so longer prompts could never "
                         "be scheduled: enable chunked prefill, raise max_num_batched_tokens or lower max_model_len")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    # Speculative decoding: KV slots scheduled for this many draft tokens after a decoding
    # request's last token, verified in the same step (0: off).
    num_lookahead_tokens: int = 0

    def __post_init__(self) -> None:
        if self.num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens must be 0 or more, got {self.num_lookahead_tokens}")
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}")
        if self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")
        check_chunked_prefill(self.max_num_batched_tokens, self.max_model_len, self.enable_chunked_prefill)


# Weight-only int8 / int4 / fp8, and w8a8 (int8 weights and dynamically quantized int8
# activations, CPU only) -- engine/quantization.py.
QUANT_MODES = ("int8", "int4", "fp8", "w8a8")
INT4_GROUP_SIZES = (32, 64, 128, 256)


def check_quantization(mode: str, group_size: int, in_features: int | None = None) -> None:
    """Raise ValueError naming the fix when a quantization setting cannot work."""
    if mode not in QUANT_MODES:
        raise ValueError(f"quantization {mode!r} is not supported; use one of {', '.join(QUANT_MODES)}")
    if mode == "int4":
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"int4 group size must be one of {INT4_GROUP_SIZES}, got {group_size}")
        if in_features is not None and in_features % group_size:
            fitting = [g for g in INT4_GROUP_SIZES if in_features % g == 0]
            fix = (f"use quant_group_size in {fitting}" if fitting else
                   "no int4 group size divides it: use int8 or fp8")
            raise ValueError(f"int4 with group size {group_size} needs every layer's input width (per "
                             f"tensor-parallel shard) to be a multiple of it; a layer has {in_features}: {fix}")


@dataclass(frozen=True)
class EngineConfig:
    """What a user sets on the engine (vLLM's names)."""

    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    # On CPU, run GEMMs through oneDNN on weights packed at load time (engine/linear.py).
    pack_cpu_weights: bool = True
    # Used only when neither num_blocks nor kv_cache_memory_bytes is given.
    default_kv_cache_memory_bytes: int = 256 * 2**20
    # Speculative decoding: "ngram" (prompt lookup) proposes up to num_speculative_tokens tokens
    # per decoding request per step; the target verifies them in one forward (engine/spec_decode.py).
    # "draft": a smaller model with the same vocabulary (draft_model: an HF config dict or path;
    # random weights seeded by draft_seed unless LLMEngine gets the draft's weights).
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    ngram_min: int = 1
    ngram_max: int = 4
    draft_model: Any = None
    draft_seed: int = 1
    # Weight-only quantization of every linear layer (engine/quantization.py): int8, int4 (groups of
    # quant_group_size inputs) or fp8 storage; or w8a8 (int8 activations too, CPU); None keeps the
    # model's dtype.
    quantization: str | None = None
    quant_group_size: int = 128
    # The kernel of every quantized layer (engine/quant_kernels.py KERNELS); None: the fastest per
    # layer shape and row bucket, measured at load.
    quant_kernel: str | None = None
    # KV cache stored as int8 or fp8 with a scale per token and KV head (engine/kv_cache.py); None: dtype.
    kv_cache_dtype: str | None = None
    # Tensor parallelism (engine/tp_workers.py): the model's heads, MLP and vocabulary split over
    # this many ranks, one process each (gloo on CPU, NCCL over consecutive GPUs on CUDA).
    tensor_parallel_size: int = 1
    # Mixture-of-experts models under tensor parallelism: whole experts per rank, tokens exchanged
    # with all-to-all (engine/moe.py), instead of a slice of every expert.
    expert_parallel: bool = False
    # Context parallelism (engine/context_parallel.py): every sequence's KV split over this many
    # ranks by position, one process each; prefills attend by ring attention, decodes each over
    # their rank's shard. The block manager's block is then block_size tokens per rank.
    context_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}")
        if self.context_parallel_size < 1:
            raise ValueError(f"context_parallel_size must be at least 1, got {self.context_parallel_size}")
        if self.context_parallel_size > 1 and self.tensor_parallel_size > 1:
            raise ValueError(f"context_parallel_size={self.context_parallel_size} with tensor_parallel_size="
                             f"{self.tensor_parallel_size}: the engine runs one of them at a time (context "
                             "parallelism composes with tensor_parallel_size=1 only): set one of them to 1")
        if self.kv_cache_dtype not in (None, "int8", "fp8"):
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported; use int8, fp8 or None")
        if self.quantization is not None:
            check_quantization(self.quantization, self.quant_group_size)
        elif self.quant_kernel is not None:
            raise ValueError(f"quant_kernel={self.quant_kernel!r} names the kernel of quantized layers: set "
                             "quantization too, or leave quant_kernel unset")
        if self.speculative_method not in (None, "ngram", "draft"):
            raise ValueError(f"speculative_method {self.speculative_method!r} is not supported; "
                             "use 'ngram', 'draft' or None")
        if self.speculative_method == "draft" and self.draft_model is None:
            raise ValueError("speculative_method='draft' needs draft_model (an HF config dict or path)")
        if self.speculative_method is not None and not 1 <= self.num_speculative_tokens <= 8:
            raise ValueError(f"num_speculative_tokens must be 1..8 with speculative decoding on, "
                             f"got {self.num_speculative_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"n-gram sizes need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if self.dtype not in ENGINE_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported; use one of {', '.join(ENGINE_DTYPES)}")
        if self.num_blocks is not None and self.kv_cache_memory_bytes is not None:
            raise ValueError("give either num_blocks or kv_cache_memory_bytes, not both")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")

    def resolve_max_model_len(self, model: ModelConfig) -> int:
        if self.max_model_len is None:
            return model.max_position_embeddings
        if self.max_model_len > model.max_position_embeddings:
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's "
                             f"max_position_embeddings={model.max_position_embeddings}: lower it")
        return self.max_model_len

    def scheduler_config(self, model: ModelConfig) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.resolve_max_model_len(model),
            enable_chunked_prefill=self.enable_chunked_prefill,
            num_lookahead_tokens=self.num_speculative_tokens if self.speculative_method else 0,
        )

    @property
    def scheduled_block_size(self) -> int:
        """Tokens per block as the block manager counts them: under context parallelism a block is
        block_size tokens on each rank (vLLM's decode context parallelism's virtual block)."""
        return self.block_size * self.context_parallel_size

    def block_bytes(self, model: ModelConfig) -> int:
        """Bytes of one rank's part of a block (a whole block without context parallelism)."""
        if self.kv_cache_dtype is None:
            return self.block_size * model.kv_bytes_per_token(dtype_bytes(self.dtype))
        # A byte per value, plus one scale (in the model's dtype) per token, KV head and K or V.
        per_token = 2 * model.num_layers * model.num_kv_heads * (model.head_dim + dtype_bytes(self.dtype))
        return self.block_size * per_token

    def cache_config(self, model: ModelConfig) -> CacheConfig:
        """Size the KV pool: an explicit block count, or as many blocks as a byte budget holds."""
        if self.num_blocks is not None:
            num_blocks = self.num_blocks
        else:
            budget = self.kv_cache_memory_bytes
            if budget is None:
                # Default: never more than every sequence slot at full length needs.
                full = self.max_num_seqs * math.ceil(self.resolve_max_model_len(model) / self.scheduled_block_size)
                num_blocks = min(self.default_kv_cache_memory_bytes // self.block_bytes(model), full)
            else:
                num_blocks = budget // self.block_bytes(model)
                if num_blocks <= 0:
                    raise ValueError(
                        f"a KV byte budget of {budget} bytes holds no block of {self.block_bytes(model)} "
                        "bytes: raise kv_cache_memory_bytes or lower block_size")
        return CacheConfig(self.scheduled_block_size, num_blocks, self.enable_prefix_caching)
