"""Model architecture facts: the bundled catalog (models/*.json, HF config.json subsets) or any
HF config.json path. Dense Llama-family and Mixtral-style MoE models."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

MODELS_DIR = Path(__file__).with_name("models")
SUPPORTED = {"llama", "mistral", "qwen2", "qwen3", "mixtral"}


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
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

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
        mlp = 3 * self.hidden_size * self.intermediate_size * self.num_experts
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        embed = self.vocab_size * self.hidden_size
        return self.num_layers * (attn + mlp + router + 2 * self.hidden_size) + embed * (
            1 if self.tie_word_embeddings else 2) + self.hidden_size

    @classmethod
    def from_hf_dict(cls, raw: dict, name: str) -> "ModelSpec":
        model_type = raw.get("model_type", "llama")
        if model_type not in SUPPORTED:
            raise ValueError(f"model {name}: architecture {model_type!r} is not supported; "
                             f"supported: {', '.join(sorted(SUPPORTED))}")
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            return cls(
                name=name, model_type=model_type, num_layers=int(raw["num_hidden_layers"]), hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]), num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads), vocab_size=int(raw["vocab_size"]),
                max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
                num_experts=int(raw.get("num_local_experts") or 1),
                experts_per_token=int(raw.get("num_experts_per_tok") or 1),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"))
        except KeyError as exc:
            raise ValueError(f"model {name}: config lacks {exc.args[0]!r}") from None


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
