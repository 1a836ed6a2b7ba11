"""How a model splits over tensor-parallel ranks (Megatron-style), as plain arithmetic over names.

Rank r of `world` holds:
- query heads [r*h, (r+1)*h) with h = heads/world, and the KV heads they read: KV heads
  [r*g, (r+1)*g) with g = kv_heads/world when world divides the KV heads, otherwise the single KV
  head r*kv_heads//world (replicated: world must then be a multiple of the KV heads, so each rank's
  query heads share one KV head);
- the q|k|v and gate|up projections column-parallel (its rows of each part), o_proj and down_proj
  row-parallel (its columns; their bias on rank 0 only, since the partial outputs are summed);
- vocabulary rows [r*V, (r+1)*V) of the embedding and LM head, V = ceil(vocab/world) (the last
  rank's tail padded with zero rows; logits past the vocabulary are cut after the gather);
- norms whole;
- mixture-of-experts layers (engine/moe.py): the router and shared-expert gate whole; each expert
  split like the dense MLP, or under expert parallelism experts [r E/world, (r+1) E/world) whole
  (renumbered from 0 on each rank); the shared expert split like the dense MLP.
"""

from __future__ import annotations

import dataclasses

import torch

from engine.policy.config import ModelConfig


def check_tensor_parallel(config: ModelConfig, world: int) -> None:
    """Raise a ValueError naming the fix when `world` ranks cannot split this model."""
    if world < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {world}")
    divisors = [d for d in range(1, config.num_heads + 1) if config.num_heads % d == 0
                and (config.num_kv_heads % d == 0 or d % config.num_kv_heads == 0)
                and all(size % d == 0 for size, _ in _split_sizes(config))]
    fix = f"use tensor_parallel_size in {divisors}"
    if config.num_heads % world != 0:
        raise ValueError(f"tensor_parallel_size={world} does not divide the model's {config.num_heads} "
                         f"attention heads: {fix}")
    if config.num_kv_heads % world != 0 and world % config.num_kv_heads != 0:
        raise ValueError(f"tensor_parallel_size={world} neither divides the model's {config.num_kv_heads} KV "
                         f"heads nor is a multiple of them (to replicate each on whole ranks): {fix}")
    for size, what in _split_sizes(config):
        if size % world != 0:
            raise ValueError(f"tensor_parallel_size={world} does not divide the model's {what} {size}: {fix}")


def _split_sizes(config: ModelConfig) -> list[tuple[int, str]]:
    """The sizes tensor parallelism divides besides the heads: the dense MLP's intermediate size
    (where a layer is dense), and for MoE layers either the number of experts (expert parallel) or
    each expert's intermediate size, and the shared expert's."""
    sizes = []
    if not all(config.sparse_layers):
        sizes.append((config.intermediate_size, "intermediate size"))
    if config.num_experts:
        if config.expert_parallel:
            sizes.append((config.num_experts, "number of experts (expert parallel)"))
        else:
            sizes.append((config.moe_intermediate_size, "expert intermediate size"))
        if config.shared_expert_intermediate_size:
            sizes.append((config.shared_expert_intermediate_size, "shared expert intermediate size"))
    return sizes


def shard_config(config: ModelConfig, world: int) -> ModelConfig:
    """The architecture one rank holds: its heads, its slice of the MLP and of the vocabulary."""
    check_tensor_parallel(config, world)
    expert_parallel = config.expert_parallel and world > 1
    return dataclasses.replace(config, num_heads=config.num_heads // world,
                               num_kv_heads=max(config.num_kv_heads // world, 1),
                               intermediate_size=config.intermediate_size // world,
                               vocab_size=-(-config.vocab_size // world),
                               moe_intermediate_size=config.moe_intermediate_size // (1 if expert_parallel else world),
                               shared_expert_intermediate_size=config.shared_expert_intermediate_size // world,
                               num_local_experts=config.num_experts // world if expert_parallel
                               else config.num_local_experts)


def kv_heads_of(config: ModelConfig, rank: int, world: int) -> range:
    if config.num_kv_heads >= world:
        per_rank = config.num_kv_heads // world
        return range(rank * per_rank, (rank + 1) * per_rank)
    head = rank * config.num_kv_heads // world
    return range(head, head + 1)


def shard_state_dict(state: dict[str, torch.Tensor], config: ModelConfig, rank: int,
                     world: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s tensors of a whole DecoderModel state_dict (the engine's fused names)."""
    shard = shard_config(config, world)
    d = config.head_dim
    q_rows = _rows(rank * shard.num_heads * d, shard.num_heads * d)
    kv = kv_heads_of(config, rank, world)
    k_rows = _rows(config.q_size + kv.start * d, len(kv) * d)
    v_rows = _rows(config.q_size + config.kv_size + kv.start * d, len(kv) * d)
    qkv_rows = q_rows + k_rows + v_rows
    expert_parallel = config.expert_parallel and world > 1
    local = range(rank * shard.num_local_experts, (rank + 1) * shard.num_local_experts)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if expert_parallel and ".mlp.experts." in name:
            # Whole experts, this rank's, renumbered from 0.
            before, after = name.split(".mlp.experts.")
            index, rest = after.split(".", 1)
            if int(index) in local:
                out[f"{before}.mlp.experts.{int(index) - local.start}.{rest}"] = tensor.clone()
        elif ".qkv_proj." in name:
            out[name] = tensor[qkv_rows].clone()
        elif ".gate_up_proj." in name:  # a dense MLP, an expert or the shared expert: its own width
            inter = tensor.shape[0] // 2
            per_rank = inter // world
            out[name] = tensor[_rows(rank * per_rank, per_rank) + _rows(inter + rank * per_rank, per_rank)].clone()
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            per_rank = tensor.shape[1] // world
            out[name] = tensor[:, rank * per_rank:(rank + 1) * per_rank].clone()
        elif name.endswith(("o_proj.bias", "down_proj.bias")):
            out[name] = tensor.clone() if rank == 0 else torch.zeros_like(tensor)
        elif name in ("embed_tokens.weight", "lm_head.weight"):
            padded = torch.zeros((shard.vocab_size * world,) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
            padded[:config.vocab_size] = tensor
            out[name] = padded[rank * shard.vocab_size:(rank + 1) * shard.vocab_size].clone()
        else:  # norms and the rotary table: whole on every rank
            out[name] = tensor.clone()
    return out


def _rows(start: int, count: int) -> list[int]:
    return list(range(start, start + count))
