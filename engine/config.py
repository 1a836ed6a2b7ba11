"""Configuration of the engine: model facts from an HF config, cache and scheduler knobs.

No torch here: the simulator builds the same SchedulerConfig / CacheConfig and runs the same
scheduler and block manager as the engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe"}


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """Architecture facts of a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3)."""

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
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V, all layers, for one token."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def num_parameters(self) -> int:
        attn = (self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
                + (self.q_size + 2 * self.kv_size if self.qkv_bias else 0) + (self.hidden_size if self.o_bias else 0))
        dense = 3 * self.hidden_size * self.intermediate_size + (
            2 * self.intermediate_size + self.hidden_size if self.mlp_bias else 0)
        sparse = (self.hidden_size * self.num_experts  # router
                  + 3 * self.hidden_size * self.moe_intermediate_size * self.num_experts
                  + (3 * self.hidden_size * self.shared_expert_intermediate_size + self.hidden_size
                     if self.shared_expert_intermediate_size else 0))
        mlp = sum(sparse if s else dense for s in self.sparse_layers)
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * (attn + norms) + mlp + embed + head + self.hidden_size

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
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            layers = int(raw["num_hidden_layers"])
            vocab = int(raw["vocab_size"])
            intermediate = int(raw["intermediate_size"])
        except KeyError as exc:
            raise ValueError(f"model config lacks {exc.args[0]!r}: is this a Llama-family config.json?") from exc
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = raw.get("head_dim")
        if head_dim is None:
            if heads <= 0 or hidden % heads != 0:
                raise ValueError(f"model config: hidden_size={hidden} is not divisible by "
                                 f"num_attention_heads={heads} and no head_dim is given: set head_dim")
            head_dim = hidden // heads
        return cls(
            model_type=model_type,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(head_dim),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_dict(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=bool(raw.get("attention_bias", False)) or model_type in ("qwen2", "qwen2_moe"),
            o_bias=bool(raw.get("attention_bias", False)) and model_type not in ("qwen2", "qwen2_moe"),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            sliding_windows=_sliding_windows(raw, model_type, layers),
            hidden_act=raw.get("hidden_act", "silu"),
            eos_token_ids=_int_tuple(raw.get("eos_token_id")),
            dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
            **_moe_from_dict(raw, model_type, layers, intermediate),
        )


def _moe_from_dict(raw: dict[str, Any], model_type: str, layers: int, intermediate: int) -> dict[str, Any]:
    """ModelConfig's mixture-of-experts fields from a Mixtral or Qwen2-MoE config.json."""
    if model_type == "mixtral":
        return dict(num_experts=int(raw.get("num_local_experts", 8)),
                    experts_per_token=int(raw.get("num_experts_per_tok", 2)),
                    moe_intermediate_size=intermediate, norm_topk_prob=True)
    if model_type == "qwen2_moe":
        step = int(raw.get("decoder_sparse_step", 1) or 1)
        dense = set(raw.get("mlp_only_layers") or [])
        num_experts = int(raw.get("num_experts", 60))
        return dict(num_experts=num_experts, experts_per_token=int(raw.get("num_experts_per_tok", 4)),
                    moe_intermediate_size=int(raw.get("moe_intermediate_size", 1408)),
                    shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size", 0) or 0),
                    norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
                    sparse_layers=tuple(i not in dense and num_experts > 0 and (i + 1) % step == 0
                                        for i in range(layers)))
    return {}


def _int_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope_from_dict(raw: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters` (with rope_theta inside); older config.json files
    # have `rope_theta` and `rope_scaling` at the top level.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "linear", "llama3"):
        raise ValueError(f"rope type {rope_type!r} is not supported; supported: default, linear, llama3")
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _sliding_windows(raw: dict[str, Any], model_type: str, layers: int) -> tuple[int | None, ...]:
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types")
    if window is None:
        return tuple([None] * layers)
    if layer_types:
        return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
    if model_type in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        return tuple([None] * layers)
    return tuple([int(window)] * layers)


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
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill a whole prompt must fit one step, but max_num_batched_tokens="
                f"{self.max_num_batched_tokens} < max_model_len={self.max_model_len}: enable chunked "
                "prefill, raise max_num_batched_tokens or lower max_model_len")


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
QUANT_MODES = ("int8", "int4", "fp8")  # weight-only (engine/quantization.py)
INT4_GROUP_SIZES = (32, 64, 128, 256)


def check_quantization(mode: str, group_size: int, in_features: int | None = None) -> None:
    """Raise ValueError naming the fix when a weight-only quantization setting cannot work."""
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
    # quant_group_size inputs) or fp8 storage; None keeps the model's dtype.
    quantization: str | None = None
    quant_group_size: int = 128
    # KV cache stored as int8 or fp8 with a scale per token and KV head (engine/kv_cache.py); None: dtype.
    kv_cache_dtype: str | None = None
    # Tensor parallelism (engine/tp_workers.py): the model's heads, MLP and vocabulary split over
    # this many ranks, one process each (gloo on CPU, NCCL over consecutive GPUs on CUDA).
    tensor_parallel_size: int = 1
    # Mixture-of-experts models under tensor parallelism: whole experts per rank, tokens exchanged
    # with all-to-all (engine/moe.py), instead of a slice of every expert.
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}")
        if self.kv_cache_dtype not in (None, "int8", "fp8"):
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported; use int8, fp8 or None")
        if self.quantization is not None:
            check_quantization(self.quantization, self.quant_group_size)
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
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {self.dtype!r} is not supported; use one of {', '.join(DTYPE_BYTES)}")
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

    def block_bytes(self, model: ModelConfig) -> int:
        if self.kv_cache_dtype is None:
            return self.block_size * model.kv_bytes_per_token(DTYPE_BYTES[self.dtype])
        # A byte per value, plus one scale (in the model's dtype) per token, KV head and K or V.
        per_token = 2 * model.num_layers * model.num_kv_heads * (model.head_dim + DTYPE_BYTES[self.dtype])
        return self.block_size * per_token

    def cache_config(self, model: ModelConfig) -> CacheConfig:
        """Size the KV pool: an explicit block count, or as many blocks as a byte budget holds."""
        if self.num_blocks is not None:
            num_blocks = self.num_blocks
        else:
            budget = self.kv_cache_memory_bytes
            if budget is None:
                # Default: never more than every sequence slot at full length needs.
                full = self.max_num_seqs * math.ceil(self.resolve_max_model_len(model) / self.block_size)
                num_blocks = min(self.default_kv_cache_memory_bytes // self.block_bytes(model), full)
            else:
                num_blocks = budget // self.block_bytes(model)
                if num_blocks <= 0:
                    raise ValueError(
                        f"a KV byte budget of {budget} bytes holds no block of {self.block_bytes(model)} "
                        "bytes: raise kv_cache_memory_bytes or lower block_size")
        return CacheConfig(self.block_size, num_blocks, self.enable_prefix_caching)
