"""Tiny random-weight transformers models (built from configs, never downloaded) and their references."""

from __future__ import annotations

import functools

import torch
import transformers

CONFIGS = {
    # MHA, head_dim 32
    "llama-mha-hd32": dict(cls="LlamaConfig", hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
                           intermediate_size=128, num_hidden_layers=2),
    # GQA, head_dim 64, llama3 rope scaling
    "llama-gqa-hd64": dict(cls="LlamaConfig", hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=256, num_hidden_layers=2,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    # MQA with tied embeddings
    "llama-mqa-tied": dict(cls="LlamaConfig", hidden_size=64, num_attention_heads=4, num_key_value_heads=1,
                           intermediate_size=96, num_hidden_layers=2, tie_word_embeddings=True),
    # Mistral: sliding-window attention shorter than the prompts
    "mistral-swa": dict(cls="MistralConfig", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, num_hidden_layers=2, sliding_window=12, head_dim=16),
    # Qwen2: q/k/v bias
    "qwen2-bias": dict(cls="Qwen2Config", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, num_hidden_layers=2),
    # Qwen3: per-head q/k RMSNorm
    "qwen3-qknorm": dict(cls="Qwen3Config", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, num_hidden_layers=2, head_dim=32),
    # Mixtral: 8 experts, top-2 (renormalized), GQA
    "mixtral-moe": dict(cls="MixtralConfig", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=96, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2),
    # Qwen2-MoE: top-4 of 6 experts (not renormalized), a gated shared expert, q/k/v bias, layer 1 dense
    "qwen2moe-shared": dict(cls="Qwen2MoeConfig", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=112, moe_intermediate_size=48, shared_expert_intermediate_size=80,
                            num_experts=6, num_experts_per_tok=4, mlp_only_layers=[1], num_hidden_layers=2),
    # Qwen3-MoE: Qwen3's q/k norms over top-4 of 6 renormalized experts, no shared expert
    "qwen3moe": dict(cls="Qwen3MoeConfig", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=112, moe_intermediate_size=48, num_experts=6, num_experts_per_tok=4,
                     norm_topk_prob=True, num_hidden_layers=2, head_dim=32),
}

VOCAB = 256


def hf_config(name: str):
    spec = dict(CONFIGS[name])
    cls = getattr(transformers, spec.pop("cls"))
    return cls(vocab_size=VOCAB, max_position_embeddings=512, **spec)


@functools.lru_cache(maxsize=None)
def hf_model(name: str, seed: int = 0):
    """A transformers CausalLM with random weights (scaled up so greedy picks are well separated)."""
    torch.manual_seed(seed)
    config = hf_config(name)
    config._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        # Bias terms default to zero; give them values so the bias path is really exercised.
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias"):
                param.normal_(0.0, 0.1)
    return model


def random_prompts(lengths, seed: int = 0, vocab: int = VOCAB) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def hf_logits(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float()
