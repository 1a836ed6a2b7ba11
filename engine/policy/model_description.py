"""One model description: an HF config.json read once, for the engine and the simulator alike. No torch.

`describe(raw)` turns a config.json dict into a ModelDescription: the Llama-family base reading
(`_llama`) overlaid with what the architecture's reader in ARCHITECTURES adds. The engine's
ModelConfig (engine/policy/config.py) and the simulator's ModelSpec (simulator/catalog/models.py) are both
derived from it, and both get q_size, kv_size and num_parameters from one formula (DecoderShape).

Where config.json is silent and the two consumers have always assumed different things, the
description says so instead of choosing: head_dim, max_position_embeddings and dtype are None (dtype
and torch_dtype kept apart, as each consumer has its own precedence), and `assumed` lists the keys a
reader filled with the family's transformers default (the engine takes those, the simulator asks
for them). Each consumer applies its own defaults in one commented place: ModelConfig.from_description
and ModelSpec.from_description.

To add a Llama-family variant: write a reader `def _family(raw, base) -> dict` returning the
ModelDescription fields where the family differs from `base` (the Llama reading; index raw[...] for
a key the family cannot do without: a KeyError becomes each consumer's "config lacks" message), and
add one line to ARCHITECTURES: `"model_type": Family(_family, engine=True)` where the engine can run
it (its layers exist in engine/model.py and engine/moe.py), engine=False where only the simulator
reads it (the engine then refuses it as unsupported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # default | linear | llama3 run on the engine; others are only read
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


class DecoderShape:
    """q_size, kv_size, the experts' width, the shapes of a layer's linear and elementwise operators
    on one shard (the step recipe and the profiler both read them) and the parameter count of a
    Llama-family decoder, for any
    class with its fields (ModelConfig, ModelSpec) and a num_moe_layers. The flags below are what a
    class without such fields counts: ModelSpec leaves out biases, q/k norms and Qwen2-MoE's
    shared-expert gate (a few weights the cost model does not time)."""

    qkv_bias = o_bias = mlp_bias = qk_norm = shared_expert_gate = False

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def expert_intermediate_size(self) -> int:
        """Each routed expert's intermediate size (moe_intermediate_size 0: intermediate_size)."""
        return self.moe_intermediate_size or self.intermediate_size

    def linear_shapes(self, tp: int = 1) -> dict[str, tuple[int, int]]:
        """(n, k) of each linear layer of one decoder layer on one tensor-parallel shard, plus the LM head.

        Fused like the engine: qkv_proj (q|k|v), gate_up_proj (gate|up). For MoE, the expert
        GEMMs are per expert.
        """
        kv_shard = max(self.kv_size // tp, self.head_dim)  # KV heads replicate when tp exceeds them
        return {
            "qkv_proj": (self.q_size // tp + 2 * kv_shard, self.hidden_size),
            "o_proj": (self.hidden_size, self.q_size // tp),
            "gate_up_proj": (2 * self.intermediate_size // tp, self.hidden_size),
            "down_proj": (self.hidden_size, self.intermediate_size // tp),
            "lm_head": (self.vocab_size // tp, self.hidden_size),
        }

    def elementwise_widths(self, tp: int = 1) -> dict[str, int]:
        """Width per token of each elementwise operator of one decoder layer on one shard: the norms
        and residual adds over the hidden state, rotary over the rank's q and k heads, the SwiGLU
        activation over its slice of the MLP."""
        heads, kv_heads = self.num_heads // tp, max(self.num_kv_heads // tp, 1)
        return {"rms_norm": self.hidden_size, "rope": (heads + kv_heads) * self.head_dim,
                "swiglu": self.intermediate_size // tp, "add": self.hidden_size}

    def num_parameters(self) -> int:
        hidden, q, kv = self.hidden_size, self.q_size, self.kv_size
        attn = (hidden * (q + 2 * kv) + q * hidden
                + (q + 2 * kv if self.qkv_bias else 0) + (hidden if self.o_bias else 0))
        dense = 3 * hidden * self.intermediate_size + (2 * self.intermediate_size + hidden if self.mlp_bias else 0)
        sparse = (hidden * self.num_experts  # the router
                  + 3 * hidden * self.expert_intermediate_size * self.num_experts
                  + 3 * hidden * self.shared_expert_intermediate_size
                  + (hidden if self.shared_expert_gate else 0))
        moe_layers = self.num_moe_layers
        mlp = (self.num_layers - moe_layers) * dense + moe_layers * sparse
        norms = 2 * hidden + (2 * self.head_dim if self.qk_norm else 0)
        embed = self.vocab_size * hidden
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * (attn + norms) + mlp + embed + head + hidden


@dataclass(frozen=True)
class ModelDescription:
    """What an HF config.json says about a decoder, read once (describe). None: config.json is silent."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense MLP's
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None  # None: not given (hidden_size / num_heads, as each consumer derives it)
    max_position_embeddings: int | None
    # The weights' dtype under its two keys (transformers >= 4.56 writes dtype, older files
    # torch_dtype); which one wins when both are given is each consumer's, as it always was.
    dtype: str | None
    torch_dtype: str | None
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_windows: tuple[int | None, ...]  # per layer (None: full attention); may be shorter than num_layers
    hidden_act: str
    eos_token_ids: tuple[int, ...]
    # Mixture of experts; num_experts 0: a dense model.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int | None = 0  # each routed expert's; None: intermediate_size (Mixtral's)
    shared_expert_intermediate_size: int = 0  # the shared expert(s) every token goes through; 0: none
    norm_topk_prob: bool = True
    sparse_layers: tuple[bool, ...] = ()  # per layer: True where the feed-forward is the MoE
    # Learned attention sinks: one logit per head added to the softmax's denominator (gpt-oss).
    attention_sinks: bool = False
    # config.json keys a reader did not find and took the family's transformers default for.
    assumed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    """An architecture: its reader (raw config.json, the Llama base fields) -> the fields it changes."""

    read: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    engine: bool  # the engine can run it (engine/model.py); otherwise only the simulator reads it


def describe(raw: dict[str, Any]) -> ModelDescription:
    """Read a config.json dict. KeyError names a required key it lacks; callers check model_type
    against ARCHITECTURES (or ENGINE_ARCHITECTURES) first, with their own message."""
    model_type = raw.get("model_type", "llama")
    base = _llama(raw)
    return ModelDescription(model_type=model_type, **{**base, **ARCHITECTURES[model_type].read(raw, base)})


# -- readers ---------------------------------------------------------------------------------------

def _llama(raw: dict[str, Any]) -> dict[str, Any]:
    """The Llama reading every family starts from."""
    hidden = int(raw["hidden_size"])
    heads = int(raw["num_attention_heads"])
    layers = int(raw["num_hidden_layers"])
    vocab = int(raw["vocab_size"])
    intermediate = int(raw["intermediate_size"])
    head_dim = raw.get("head_dim")
    bias = bool(raw.get("attention_bias", False))
    return dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_layers=layers, num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=None if head_dim is None else int(head_dim),
        # Present but null stays an error (int(None)), as it always was; absent is None.
        max_position_embeddings=int(raw["max_position_embeddings"]) if "max_position_embeddings" in raw else None,
        dtype=_text(raw.get("dtype")), torch_dtype=_text(raw.get("torch_dtype")),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope=_rope(raw),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=bias, o_bias=bias, mlp_bias=bool(raw.get("mlp_bias", False)), qk_norm=False,
        sliding_windows=_sliding_windows(raw, layers, gated=False),
        hidden_act=raw.get("hidden_act", "silu"),
        eos_token_ids=_int_tuple(raw.get("eos_token_id")),
        sparse_layers=tuple([False] * layers),
    )


def _as_llama(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Llama itself; Mistral too (its sliding window, when given, is on every layer)."""
    return {}


def _qwen2(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """q/k/v biases (never on o_proj); the sliding window only with use_sliding_window."""
    return dict(qkv_bias=True, o_bias=False, sliding_windows=_sliding_windows(raw, base["num_layers"], gated=True))


def _qwen3(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Per-head RMSNorm of q and k; the sliding window only with use_sliding_window."""
    return dict(qk_norm=True, sliding_windows=_sliding_windows(raw, base["num_layers"], gated=True))


def _mixtral(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Every layer's MLP is num_local_experts experts of intermediate_size, top-k renormalized."""
    num_experts = int(raw.get("num_local_experts", 8))
    return dict(num_experts=num_experts, experts_per_token=int(raw.get("num_experts_per_tok", 2)),
                moe_intermediate_size=None, norm_topk_prob=True,
                sparse_layers=tuple([num_experts > 0] * base["num_layers"]))


_QWEN2_MOE_DEFAULTS = {"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408}  # transformers'


def _qwen2_moe(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Qwen2's biases (its sliding window read as Llama's: not gated by use_sliding_window, as the
    engine always read it); every decoder_sparse_step-th layer not in mlp_only_layers is MoE, with
    an optional gated shared expert; top-k not renormalized unless norm_topk_prob."""
    assumed = tuple(key for key in _QWEN2_MOE_DEFAULTS if key not in raw)
    value = {key: raw[key] if key in raw else default for key, default in _QWEN2_MOE_DEFAULTS.items()}
    num_experts = int(value["num_experts"])
    step = int(raw.get("decoder_sparse_step") or 1)
    dense = set(raw.get("mlp_only_layers") or [])
    return dict(qkv_bias=True, o_bias=False, num_experts=num_experts,
                experts_per_token=int(value["num_experts_per_tok"]),
                moe_intermediate_size=int(value["moe_intermediate_size"]),
                shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0),
                norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
                sparse_layers=tuple(i not in dense and num_experts > 0 and (i + 1) % step == 0
                                    for i in range(base["num_layers"])),
                assumed=assumed)


_QWEN3_MOE_DEFAULTS = {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768}  # transformers'


def _qwen3_moe(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Qwen3's attention (q/k norms, attention_bias as given, the sliding window only with
    use_sliding_window) over Qwen2-MoE's sparse layers without a shared expert (Qwen3-30B-A3B,
    Qwen3-235B-A22B: 128 experts, top-8 renormalized)."""
    if "num_experts" not in raw and "num_local_experts" in raw:  # transformers >= 5 writes this name
        raw = {**raw, "num_experts": raw["num_local_experts"]}
    assumed = tuple(key for key in _QWEN3_MOE_DEFAULTS if key not in raw)
    value = {key: raw[key] if key in raw else default for key, default in _QWEN3_MOE_DEFAULTS.items()}
    num_experts = int(value["num_experts"])
    step = int(raw.get("decoder_sparse_step") or 1)
    dense = set(raw.get("mlp_only_layers") or [])
    return dict(qk_norm=True, sliding_windows=_sliding_windows(raw, base["num_layers"], gated=True),
                num_experts=num_experts, experts_per_token=int(value["num_experts_per_tok"]),
                moe_intermediate_size=int(value["moe_intermediate_size"]),
                norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
                sparse_layers=tuple(i not in dense and num_experts > 0 and (i + 1) % step == 0
                                    for i in range(base["num_layers"])),
                assumed=assumed)


def _gpt_oss(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss: biases on q/k/v/o, learned attention sinks, layer_types alternating
    sliding_window-token sliding attention and full attention (the base reading), and every
    layer's MLP num_local_experts experts of intermediate_size, top experts_per_token (softmax over
    the chosen: renormalized). Its experts' biases and clamped SwiGLU are not timed apart."""
    return dict(qkv_bias=True, o_bias=True, attention_sinks=True,
                num_experts=int(raw["num_local_experts"]),
                experts_per_token=int(raw.get("num_experts_per_tok") or raw["experts_per_token"]),
                moe_intermediate_size=None, norm_topk_prob=True,
                sparse_layers=tuple([True] * base["num_layers"]))


def _llama4_text(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Every interleave_moe_layer_step-th layer is MoE (experts of intermediate_size, one shared
    expert of the same width); the dense layers' MLP is intermediate_size_mlp."""
    step = int(raw.get("interleave_moe_layer_step") or 1)
    expert = int(raw["intermediate_size"])
    return dict(intermediate_size=int(raw.get("intermediate_size_mlp") or raw["intermediate_size"]),
                num_experts=int(raw["num_local_experts"]), experts_per_token=int(raw["num_experts_per_tok"]),
                moe_intermediate_size=expert, shared_expert_intermediate_size=expert,
                sparse_layers=tuple((i + 1) % step == 0 for i in range(base["num_layers"])))


def _deepseek_v2(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Multi-head latent attention read as what it costs a server: each token caches one latent of
    kv_lora_rank + qk_rope_head_dim values per layer, modeled as one KV head pair of half that width
    (head_dim) shared by every query head -- the same KV bytes per token. MoE after the first
    first_k_dense_replace layers, with n_shared_experts shared experts of the routed width."""
    head_dim = (int(raw["kv_lora_rank"]) + int(raw["qk_rope_head_dim"])) // 2
    moe = int(raw["moe_intermediate_size"])
    first_dense = int(raw.get("first_k_dense_replace") or 0)
    shared = moe * int(raw.get("n_shared_experts") or 0)
    return dict(num_kv_heads=1, head_dim=head_dim,
                num_experts=int(raw["n_routed_experts"]), experts_per_token=int(raw["num_experts_per_tok"]),
                moe_intermediate_size=moe, shared_expert_intermediate_size=shared,
                sparse_layers=tuple(i >= first_dense for i in range(base["num_layers"])))


# The registry: model_type -> its reader. One line per architecture.
ARCHITECTURES: dict[str, Family] = {
    "llama": Family(_as_llama, engine=True),
    "mistral": Family(_as_llama, engine=True),
    "qwen2": Family(_qwen2, engine=True),
    "qwen3": Family(_qwen3, engine=True),
    "mixtral": Family(_mixtral, engine=True),
    "qwen2_moe": Family(_qwen2_moe, engine=True),
    "llama4_text": Family(_llama4_text, engine=False),
    "deepseek_v2": Family(_deepseek_v2, engine=False),
    "qwen3_moe": Family(_qwen3_moe, engine=True),
    "gpt_oss": Family(_gpt_oss, engine=False),
}
ENGINE_ARCHITECTURES = frozenset(name for name, family in ARCHITECTURES.items() if family.engine)


# -- field readers shared by the families ---------------------------------------------------------

def _text(value: Any) -> str | None:
    return str(value) if value else None


def _int_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope(raw: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters` (with rope_theta inside); older config.json files
    # have `rope_theta` and `rope_scaling` at the top level. Which types can run is the engine's check.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    return RopeConfig(
        theta=float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
        rope_type=params.get("rope_type", params.get("type", "default")),
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _sliding_windows(raw: dict[str, Any], layers: int, gated: bool) -> tuple[int | None, ...]:
    """Per layer: layer_types decides where given; otherwise the window is on every layer (gated:
    only with use_sliding_window, as Qwen2 and Qwen3 have it)."""
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types")
    if window is None:
        return tuple([None] * layers)
    if layer_types:
        return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
    if gated and not raw.get("use_sliding_window", False):
        return tuple([None] * layers)
    return tuple([int(window)] * layers)
