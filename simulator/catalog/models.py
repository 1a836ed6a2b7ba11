"""Model architecture facts: the bundled catalog (models/*.json, HF config.json subsets) or any
HF config.json path. Dense Llama-family models and mixture-of-experts models (Mixtral, Qwen2-MoE,
Llama 4, DeepSeek-V2: routed experts, optional shared experts, leading dense layers).

DeepSeek's multi-head latent attention (MLA) is read as what it costs a server: each token caches
one latent of kv_lora_rank + qk_rope_head_dim values per layer, which is modeled as one KV head
pair of half that width (head_dim) shared by every query head -- the same KV bytes per token and a
grouped-query attention of that width."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

MODELS_DIR = Path(__file__).with_name("models")
SUPPORTED = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "llama4_text", "deepseek_v2"}


class ModelSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    model_type: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    num_experts: int = 1  # 1: dense
    experts_per_token: int = 1
    moe_intermediate_size: int = 0  # each routed expert's (0: intermediate_size)
    shared_expert_intermediate_size: int = 0  # the shared expert(s) every token goes through; 0: none
    num_dense_layers: int = 0  # MoE models: layers whose feed-forward is a dense MLP (intermediate_size)
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def check_expert_parallel(self, tp: int) -> None:
        """Raise ValueError naming the fix when whole experts cannot be spread over tp ranks."""
        if not self.is_moe:
            raise ValueError(f"expert_parallel needs a mixture-of-experts model; {self.name} is dense: drop it")
        if self.num_experts % tp:
            divisors = [d for d in range(1, self.num_experts + 1) if self.num_experts % d == 0
                        and self.num_heads % d == 0]
            raise ValueError(f"expert parallel over tp={tp} ranks cannot split {self.name}'s "
                             f"{self.num_experts} experts evenly: use tp in {divisors}")

    def expert_shapes(self, tp: int = 1, expert_parallel: bool = False) -> dict[str, tuple[int, int]]:
        """(n, k) of one routed expert's gate_up and down GEMMs on one rank: a 1/tp slice of every
        expert, or whole experts under expert parallelism; and of the shared expert (sliced)."""
        ffn = self.expert_intermediate_size // (1 if expert_parallel else tp)
        shapes = {"expert_gate_up": (2 * ffn, self.hidden_size), "expert_down": (self.hidden_size, ffn)}
        if self.shared_expert_intermediate_size:
            shared = self.shared_expert_intermediate_size // tp
            shapes.update(shared_gate_up=(2 * shared, self.hidden_size), shared_down=(self.hidden_size, shared))
        return shapes

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

    def num_parameters(self) -> int:
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        dense = 3 * self.hidden_size * self.intermediate_size
        sparse = (3 * self.hidden_size * self.expert_intermediate_size * self.num_experts
                  + self.hidden_size * self.num_experts  # the router
                  + 3 * self.hidden_size * self.shared_expert_intermediate_size)
        mlp = (self.num_layers - self.num_moe_layers) * dense + self.num_moe_layers * sparse
        embed = self.vocab_size * self.hidden_size
        return self.num_layers * (attn + 2 * self.hidden_size) + mlp + embed * (
            1 if self.tie_word_embeddings else 2) + self.hidden_size

    def active_parameters(self) -> int:
        """Parameters one token computes with: the routed experts it picks, not all of them."""
        if not self.is_moe:
            return self.num_parameters()
        idle = 3 * self.hidden_size * self.expert_intermediate_size * (self.num_experts - self.experts_per_token)
        return self.num_parameters() - self.num_moe_layers * idle

    @classmethod
    def from_hf_dict(cls, raw: dict, name: str) -> "ModelSpec":
        model_type = raw.get("model_type", "llama")
        if model_type not in SUPPORTED:
            raise ValueError(f"model {name}: architecture {model_type!r} is not supported; "
                             f"supported: {', '.join(sorted(SUPPORTED))}")
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            kv_heads = int(raw.get("num_key_value_heads") or heads)
            head_dim = int(raw.get("head_dim") or hidden // heads)
            if model_type == "deepseek_v2":  # MLA: one latent per token (see the module's docstring)
                kv_heads = 1
                head_dim = (int(raw["kv_lora_rank"]) + int(raw["qk_rope_head_dim"])) // 2
            return cls(
                name=name, model_type=model_type, num_layers=int(raw["num_hidden_layers"]), hidden_size=hidden,
                intermediate_size=int(raw.get("intermediate_size_mlp") or raw["intermediate_size"]), num_heads=heads,
                num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=int(raw["vocab_size"]),
                max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"), **_moe_fields(raw, model_type))
        except KeyError as exc:
            raise ValueError(f"model {name}: config lacks {exc.args[0]!r}") from None


def _moe_fields(raw: dict, model_type: str) -> dict:
    """ModelSpec's mixture-of-experts fields from the config.json of each MoE family."""
    layers = int(raw["num_hidden_layers"])
    if model_type == "mixtral":
        return dict(num_experts=int(raw.get("num_local_experts") or 8), experts_per_token=int(raw.get("num_experts_per_tok") or 2))
    if model_type == "qwen2_moe":
        step = int(raw.get("decoder_sparse_step") or 1)
        dense = set(raw.get("mlp_only_layers") or [])
        return dict(num_experts=int(raw["num_experts"]), experts_per_token=int(raw["num_experts_per_tok"]),
                    moe_intermediate_size=int(raw["moe_intermediate_size"]),
                    shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0),
                    num_dense_layers=sum(1 for i in range(layers) if i in dense or (i + 1) % step))
    if model_type == "llama4_text":  # every interleave_moe_layer_step-th layer is MoE, with one shared expert
        step = int(raw.get("interleave_moe_layer_step") or 1)
        return dict(num_experts=int(raw["num_local_experts"]), experts_per_token=int(raw["num_experts_per_tok"]),
                    moe_intermediate_size=int(raw["intermediate_size"]),
                    shared_expert_intermediate_size=int(raw["intermediate_size"]),
                    num_dense_layers=layers - layers // step)
    if model_type == "deepseek_v2":
        moe = int(raw["moe_intermediate_size"])
        return dict(num_experts=int(raw["n_routed_experts"]), experts_per_token=int(raw["num_experts_per_tok"]),
                    moe_intermediate_size=moe, shared_expert_intermediate_size=moe * int(raw.get("n_shared_experts") or 0),
                    num_dense_layers=int(raw.get("first_k_dense_replace") or 0))
    return {}


def catalog_model_ids() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def model_config_path(model: str | Path) -> Path:
    """The config.json of a catalog id (e.g. 'llama-3.1-8b'), or of a path to one (or its directory)."""
    path = MODELS_DIR / f"{model}.json"
    if not path.is_file():
        path = Path(model)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"unknown model {str(model)!r}: use a catalog id ({', '.join(catalog_model_ids())}) "
                             "or a path to an HF config.json")
    return path


def load_model(model: str | Path) -> ModelSpec:
    """A catalog id (e.g. 'llama-3.1-8b') or a path to an HF config.json (or its directory)."""
    path = model_config_path(model)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    name = path.stem if path.parent == MODELS_DIR else str(path)
    return ModelSpec.from_hf_dict(raw, name)
