"""Load transformers-format weights (a state_dict or a local safetensors directory) into DecoderModel."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from engine.policy.config import ModelConfig
from engine.model import DecoderModel


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    directory = Path(path)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {directory}: save the model with "
                         "save_pretrained(..., safe_serialization=True) or pass a state_dict")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def build_decoder(config: ModelConfig, max_positions: int, state_dict: Mapping[str, torch.Tensor] | None,
                  seed: int, device: torch.device | str = "cpu") -> DecoderModel:
    """A whole model (float32) with transformers-format weights (built on the CPU), or random ones
    seeded by seed, made on `device`: a real-size model's random weights drawn on a GPU take
    seconds where the CPU takes minutes (the same seed draws other weights on each device)."""
    if state_dict is None:
        with torch.device(device):
            model = DecoderModel(config, max_positions)
        model.init_random(seed)
    else:
        model = DecoderModel(config, max_positions)
        load_hf_weights(model, state_dict)
    return model


def load_hf_weights(model: DecoderModel, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy a transformers Llama/Mistral/Qwen2/Qwen3/Mixtral/Qwen2-MoE state_dict into the fused engine model."""
    weights = {name.removeprefix("model."): tensor for name, tensor in state_dict.items()}
    config = model.config
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in weights:
            raise ValueError(f"checkpoint lacks weight {name!r}: is it a {config.model_type} checkpoint "
                             "of this config?")
        used.add(name)
        return weights[name]

    def assign(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
        if param.shape != value.shape:
            raise ValueError(f"weight {name}: checkpoint shape {tuple(value.shape)} != model shape "
                             f"{tuple(param.shape)}: the config does not match the checkpoint")
        param.copy_(value)

    with torch.no_grad():
        assign(model.embed_tokens.weight, take("embed_tokens.weight"), "embed_tokens.weight")
        assign(model.norm.weight, take("norm.weight"), "norm.weight")
        if not config.tie_word_embeddings:
            assign(model.lm_head.weight, take("lm_head.weight"), "lm_head.weight")
        for i, layer in enumerate(model.layers):
            p = f"layers.{i}."
            attn = layer.self_attn
            qkv = [take(p + f"self_attn.{x}_proj.weight") for x in "qkv"]
            assign(attn.qkv_proj.weight, torch.cat(qkv), p + "self_attn.qkv_proj.weight")
            if config.qkv_bias:
                bias = [take(p + f"self_attn.{x}_proj.bias") for x in "qkv"]
                assign(attn.qkv_proj.bias, torch.cat(bias), p + "self_attn.qkv_proj.bias")
            assign(attn.o_proj.weight, take(p + "self_attn.o_proj.weight"), p + "self_attn.o_proj.weight")
            if config.o_bias:
                assign(attn.o_proj.bias, take(p + "self_attn.o_proj.bias"), p + "self_attn.o_proj.bias")
            if config.qk_norm:
                assign(attn.q_norm.weight, take(p + "self_attn.q_norm.weight"), p + "q_norm")
                assign(attn.k_norm.weight, take(p + "self_attn.k_norm.weight"), p + "k_norm")
            if config.sparse_layers[i]:
                _load_moe(layer.mlp, p, weights, take, assign)
                assign(layer.input_layernorm.weight, take(p + "input_layernorm.weight"), p + "input_layernorm")
                assign(layer.post_attention_layernorm.weight, take(p + "post_attention_layernorm.weight"),
                       p + "post_attention_layernorm")
                continue
            gate_up = [take(p + f"mlp.{x}_proj.weight") for x in ("gate", "up")]
            assign(layer.mlp.gate_up_proj.weight, torch.cat(gate_up), p + "mlp.gate_up_proj.weight")
            assign(layer.mlp.down_proj.weight, take(p + "mlp.down_proj.weight"), p + "mlp.down_proj.weight")
            if config.mlp_bias:
                gate_up_b = [take(p + f"mlp.{x}_proj.bias") for x in ("gate", "up")]
                assign(layer.mlp.gate_up_proj.bias, torch.cat(gate_up_b), p + "mlp.gate_up_proj.bias")
                assign(layer.mlp.down_proj.bias, take(p + "mlp.down_proj.bias"), p + "mlp.down_proj.bias")
            assign(layer.input_layernorm.weight, take(p + "input_layernorm.weight"), p + "input_layernorm")
            assign(layer.post_attention_layernorm.weight, take(p + "post_attention_layernorm.weight"),
                   p + "post_attention_layernorm")
    unused = [n for n in weights if n not in used and not n.endswith("rotary_emb.inv_freq")
              and not (config.tie_word_embeddings and n == "lm_head.weight")]
    if unused:
        raise ValueError(f"checkpoint has weights the {config.model_type} model does not use "
                         f"(first: {unused[:3]}): the config does not match the checkpoint")


def _load_moe(moe, prefix: str, weights: Mapping[str, torch.Tensor], take, assign) -> None:
    """A sparse MoE block's weights. transformers >= 5 stores each layer's experts as two 3-D
    tensors (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]); checkpoints
    saved by earlier versions keep one MLP per expert (Mixtral: block_sparse_moe.experts.j.w1 / w3 /
    w2 = gate / up / down; Qwen2-MoE: mlp.experts.j.gate_proj / up_proj / down_proj)."""
    mixtral_style = prefix + "block_sparse_moe.gate.weight" in weights
    block = prefix + ("block_sparse_moe." if mixtral_style else "mlp.")
    assign(moe.gate, take(block + "gate.weight"), block + "gate.weight")
    stacked = block + "experts.gate_up_proj" in weights
    if stacked:
        gate_up, down = take(block + "experts.gate_up_proj"), take(block + "experts.down_proj")
    for j, expert in enumerate(moe.experts):
        name = f"{block}experts.{j}."
        if stacked:
            assign(expert.gate_up_proj.weight, gate_up[j], name + "gate_up_proj")
            assign(expert.down_proj.weight, down[j], name + "down_proj")
        elif mixtral_style:
            assign(expert.gate_up_proj.weight, torch.cat([take(name + "w1.weight"), take(name + "w3.weight")]),
                   name + "w1|w3")
            assign(expert.down_proj.weight, take(name + "w2.weight"), name + "w2")
        else:
            assign(expert.gate_up_proj.weight,
                   torch.cat([take(name + "gate_proj.weight"), take(name + "up_proj.weight")]), name + "gate|up")
            assign(expert.down_proj.weight, take(name + "down_proj.weight"), name + "down_proj")
    if moe.shared_expert is not None:
        shared = block + "shared_expert."
        assign(moe.shared_expert.gate_up_proj.weight,
               torch.cat([take(shared + "gate_proj.weight"), take(shared + "up_proj.weight")]), shared + "gate|up")
        assign(moe.shared_expert.down_proj.weight, take(shared + "down_proj.weight"), shared + "down_proj")
        assign(moe.shared_expert_gate, take(block + "shared_expert_gate.weight"), block + "shared_expert_gate")
