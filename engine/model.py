"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3; Mixtral and Qwen2-MoE with engine/moe.py)
over packed tokens and a paged KV cache.

Projections are fused (q|k|v and gate|up) so a step runs one GEMM where transformers runs three
or two; weights.py maps transformers' names onto them. Under tensor parallelism the model is one
rank's shard (engine/tp_shard.py: its config has the rank's heads, MLP and vocabulary slice) and
sums or gathers partial results over its TPGroup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata
from engine.policy.config import ModelConfig
from engine.kv_cache import KVCache
from engine.linear import Linear
from engine.mlp import MLP
from engine.moe import SparseMoE
from engine.rope import RotaryEmbedding, apply_rotary

if TYPE_CHECKING:
    from engine.tp_group import TPGroup


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # transformers' order: normalise in float32, round to the model's dtype, then scale.
        if x.dtype == torch.float32:  # nothing to round: one fused op
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.to(torch.float32), self.weight.shape, eps=self.eps).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, group: TPGroup | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.group = group
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.window = config.sliding_windows[layer]
        self.scale = self.head_dim ** -0.5
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata, cache: KVCache) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        qk = qkv[:, :self.q_size + self.kv_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size:].view(-1, self.num_kv_heads, self.head_dim)
        heads = [self.num_heads, self.num_kv_heads]
        if self.q_norm is None:  # queries and keys are adjacent heads: rotated in one pass
            q, k = apply_rotary(qk, *rope).split(heads, dim=1)
        else:
            q, k = qk.split(heads, dim=1)
            q, k = apply_rotary(self.q_norm(q), *rope), apply_rotary(self.k_norm(k), *rope)
        out = meta.attention(q, k, v, cache, self.layer, self.window, self.scale)
        out = self.o_proj(out.reshape(-1, self.q_size))
        return out if self.group is None else self.group.all_reduce(out)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, group: TPGroup | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer, group)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = (SparseMoE(config, group) if config.sparse_layers[layer]
                    else MLP(config.hidden_size, config.intermediate_size, config.mlp_bias, group))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata, cache: KVCache) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, meta, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int, group: TPGroup | None = None,
                 full_vocab_size: int | None = None) -> None:
        """group: this rank's tensor-parallel group (config is then the rank's shard and
        full_vocab_size the whole vocabulary, where the gathered logits are cut)."""
        super().__init__()
        self.config = config
        self.group = group
        self.full_vocab_size = full_vocab_size or config.vocab_size
        self.vocab_start = 0 if group is None else group.rank * config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, group) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, max_positions)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                cache: KVCache) -> torch.Tensor:
        """Hidden states [tokens, hidden] of a packed batch."""
        x = self.embed(input_ids)
        rope = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, meta, cache)
        return self.norm(x)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return self.embed_tokens(input_ids)
        # Vocabulary-parallel: each rank embeds the tokens in its slice, zeros the rest, and the
        # sum over ranks is every token's row.
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.config.vocab_size)
        x = self.embed_tokens(torch.where(mine, local, 0)) * mine.unsqueeze(-1).to(self.embed_tokens.weight.dtype)
        return self.group.all_reduce(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if self.group is None:
            return logits
        return self.group.all_gather_last(logits)[..., :self.full_vocab_size]

    def prepare(self, device: torch.device, dtype: torch.dtype, quantization: str | None = None,
                quant_group_size: int = 128, pack_cpu_weights: bool = True,
                quant_kernel: str | None = None) -> DecoderModel:
        """Ready loaded weights for serving: device and dtype, quantization, CPU packing."""
        model = self.to(device=device, dtype=dtype).eval()
        # The rotary table stays float32 (as transformers computes it) whatever the model dtype.
        model.rotary.to(device=device, dtype=torch.float32)
        if quantization is not None:
            model.quantize_linears(quantization, quant_group_size, quant_kernel)
        if pack_cpu_weights and device.type == "cpu":
            model.pack_linears_for_cpu()
        return model

    def quantize_linears(self, mode: str, group_size: int = 128, kernel: str | None = None) -> int:
        """Weight-only quantization of every linear layer (a tied LM head stays in float: its weight
        is the embedding table); returns how many were quantized."""
        tied = self.lm_head.weight is self.embed_tokens.weight
        layers = [m for m in self.modules() if isinstance(m, Linear) and not (tied and m is self.lm_head)]
        for m in layers:
            m.quantize(mode, group_size, kernel)
        return len(layers)

    def quant_kernels(self) -> dict[str, str]:
        """Each quantized layer's kernels per row bucket (engine/quant_kernels.py), by layer name."""
        return {name: m.quantized.choice.describe() for name, m in self.named_modules()
                if isinstance(m, Linear) and m.quantized is not None and m.quantized.choice is not None}

    def weight_bytes(self) -> int:
        """Bytes of weights as allocated: parameters plus quantized weights and their scales."""
        params = sum(p.numel() * p.element_size() for p in self.parameters())
        return params + sum(m.quantized.nbytes for m in self.modules() if isinstance(m, Linear) and m.quantized)

    def pack_linears_for_cpu(self) -> int:
        """Pack every linear layer's weight for oneDNN (CPU only); returns how many were packed."""
        return sum(m.pack_for_cpu() for m in self.modules() if isinstance(m, Linear))

    @torch.no_grad()
    def init_random(self, seed: int, std: float = 0.02) -> None:
        """Random weights for a model with no checkpoint (benchmarks, demos, tests)."""
        device = self.embed_tokens.weight.device
        gen = torch.Generator(device=device).manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen, device=device) * std)
