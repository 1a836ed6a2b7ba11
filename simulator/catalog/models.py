"""Model architecture facts: the bundled catalog (models/*.json, HF config.json subsets) or any
HF config.json path. Dense Llama-family models and mixture-of-experts models (Mixtral, Qwen2-MoE,
Qwen3-MoE, gpt-oss, Llama 4, DeepSeek-V2: routed experts, optional shared experts, leading dense
layers; gpt-oss's interleaved sliding-window layers and attention sinks).

config.json is read by engine/policy/model_description.py (torch-free), the one reader the engine shares;
its ARCHITECTURES registry lists the families (how to add one: its docstring), and DeepSeek's
multi-head latent attention is read there as one KV head pair of half the latent's width shared by
every query head -- the same KV bytes per token. ModelSpec is the simulator's view of that
description; q_size, kv_size and num_parameters come from the same formula as the engine's
(DecoderShape), without the biases and norms the cost model does not time."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from engine.policy.model_description import ARCHITECTURES, DecoderShape, ModelDescription, describe

MODELS_DIR = Path(__file__).with_name("models")
SUPPORTED = frozenset(ARCHITECTURES)  # every family the description reads, engine-runnable or not


class ModelSpec(BaseModel, DecoderShape):
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
    # Interleaved local attention (gpt-oss, Gemma 3): this many layers attend only the last
    # sliding_window tokens, and hold only those in the KV cache where some layers attend fully.
    sliding_window: int | None = None
    num_sliding_layers: int = 0
    attention_sinks: bool = False  # learned per-head sink logits (a softmax term; not timed apart)
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def hybrid_attention(self) -> bool:
        """Some layers slide, some attend fully: the sliding ones keep only their window's KV (as
        vLLM's hybrid KV cache manager frees it), so a token's blocks count the full layers only."""
        return 0 < self.num_sliding_layers < self.num_layers

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
            description = describe(raw)
        except KeyError as exc:
            raise ValueError(f"model {name}: config lacks {exc.args[0]!r}") from None
        return cls.from_description(description, name)

    @classmethod
    def from_description(cls, d: ModelDescription, name: str) -> "ModelSpec":
        """The simulator's view of a model description. Where config.json is silent, the simulator's
        defaults (they differ from the engine's, engine/policy/config.py): max_position_embeddings 4096;
        dtype (torch_dtype read before dtype) bfloat16; head_dim hidden_size // num_heads; and no
        guessed MoE shape: a key the reader had to assume (d.assumed) is an error."""
        if d.assumed:
            raise ValueError(f"model {name}: config lacks {d.assumed[0]!r}")
        moe = {}
        if d.num_experts:  # dense: ModelSpec's defaults (num_experts 1, ...)
            moe = dict(num_experts=d.num_experts, experts_per_token=d.experts_per_token,
                       moe_intermediate_size=d.moe_intermediate_size or 0,  # 0 (None there): intermediate_size
                       shared_expert_intermediate_size=d.shared_expert_intermediate_size,
                       num_dense_layers=d.num_layers - sum(d.sparse_layers))
        windows = [w for w in d.sliding_windows if w is not None]
        sliding = dict(sliding_window=max(windows), num_sliding_layers=len(windows)) if windows else {}
        return cls(
            name=name, model_type=d.model_type, num_layers=d.num_layers, hidden_size=d.hidden_size,
            intermediate_size=d.intermediate_size, num_heads=d.num_heads, num_kv_heads=d.num_kv_heads,
            head_dim=d.head_dim or d.hidden_size // d.num_heads, vocab_size=d.vocab_size,
            max_position_embeddings=4096 if d.max_position_embeddings is None else d.max_position_embeddings,
            tie_word_embeddings=d.tie_word_embeddings, dtype=d.torch_dtype or d.dtype or "bfloat16",
            attention_sinks=d.attention_sinks, **sliding, **moe)


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
