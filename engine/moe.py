"""Sparse mixture-of-experts feed-forward (Mixtral, Qwen2-MoE) over a packed batch of tokens.

A router scores every expert per token (softmax in float32), the top-k experts are kept (their
weights renormalized to sum to one where the model does so), and each token's output is the
weighted sum of those experts' SwiGLU MLPs -- plus, for Qwen2-MoE, a shared expert every token
goes through, scaled by a sigmoid gate.

Dispatch is batched: the (token, expert) pairs of a step are sorted by expert, so each expert
that received tokens runs one GEMM over all of them (its rows are contiguous), and the weighted
rows are summed back per token with one index_add. Experts are engine/mlp.py MLPs (engine Linear
layers), so they are packed for oneDNN on CPU and quantized like every other projection.

Parallelism (the model's group, engine/tp_group.py):
- tensor parallel (default): every rank holds a 1/world slice of every expert's intermediate
  dimension and of the shared expert; partial outputs are summed with one all-reduce, as the dense
  MLP's are.
- expert parallel (expert_parallel=True): rank r holds whole experts [r E/world, (r+1) E/world).
  Each rank routes its 1/world share of the step's tokens, sends every (token, expert) row to the
  rank holding that expert (all-to-all), computes what it received, sends the results back
  (all-to-all), combines its tokens' rows, and the token shares are gathered so every rank holds
  the whole output again (the attention that follows is tensor parallel over all tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.policy.config import ModelConfig
from engine.mlp import MLP

if TYPE_CHECKING:
    from engine.tp_group import TPGroup


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig, group: TPGroup | None = None) -> None:
        """config is this rank's shard under tensor parallelism (engine/tp_shard.py): its experts'
        intermediate slice, or under expert parallelism its num_local_experts whole experts."""
        super().__init__()
        self.group = group
        self.num_experts = config.num_experts
        self.top_k = config.experts_per_token
        self.normalize = config.norm_topk_prob
        self.expert_parallel = config.expert_parallel and group is not None and group.world > 1
        self.num_local = config.num_local_experts
        self.first_local = group.rank * self.num_local if self.expert_parallel else 0
        # The router stays in float (a plain parameter, not a quantized Linear): quantizing it would
        # change which experts tokens go to.
        self.gate = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        # Routed experts sum nothing themselves (_combine / _expert_parallel gather their rows); the
        # shared expert is a tensor-parallel slice that sums over the ranks like a dense MLP.
        self.experts = nn.ModuleList(MLP(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(self.num_local))
        self.shared_expert = (MLP(config.hidden_size, config.shared_expert_intermediate_size, group=group)
                              if config.shared_expert_intermediate_size else None)
        self.shared_expert_gate = (nn.Parameter(torch.empty(1, config.hidden_size))
                                   if config.shared_expert_intermediate_size else None)
        # Rows routed to each expert since the model was built (this rank's tokens under expert
        # parallelism): the measured imbalance the simulator's routing_skew is fitted to.
        self.register_buffer("expert_load", torch.zeros(config.num_experts, dtype=torch.long), persistent=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [tokens, k] in x's dtype, expert ids [tokens, k]) -- transformers' router."""
        probs = torch.softmax(F.linear(x, self.gate).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.expert_parallel:
            out = self._expert_parallel(x)
        else:
            weights, experts = self.route(x)
            out = self._combine(x, weights, experts)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(F.linear(x, self.shared_expert_gate)) * self.shared_expert(x)
        return out

    # -- one rank holds every expert (whole or a tensor-parallel slice of each) -------------------
    def _combine(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
        token_of = order // self.top_k
        counts = torch.bincount(flat, minlength=self.num_experts)
        self.expert_load += counts
        rows = self._run_experts(x[token_of], counts.tolist())
        rows = rows * weights.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros_like(x).index_add_(0, token_of, rows)
        if self.group is not None and self.group.world > 1:
            out = self.group.all_reduce(out)
        return out

    def _run_experts(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows grouped by expert (counts[e] rows for local expert e, in order): each expert that
        got rows runs one GEMM over them."""
        out = torch.empty_like(rows)
        start = 0
        for expert, count in zip(self.experts, counts):
            if count:
                out[start:start + count] = expert(rows[start:start + count])
            start += count
        return out

    # -- expert parallel --------------------------------------------------------------------------
    def _expert_parallel(self, x: torch.Tensor) -> torch.Tensor:
        group, world = self.group, self.group.world
        tokens = x.shape[0]
        share = -(-tokens // world)
        mine = x[group.rank * share:(group.rank + 1) * share]
        weights, experts = self.route(mine)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # by expert, hence by the rank that holds it
        token_of = order // self.top_k
        sorted_experts = flat[order]
        self.expert_load += torch.bincount(flat, minlength=self.num_experts)
        send_counts = torch.bincount(sorted_experts // self.num_local, minlength=world)
        recv_counts = group.all_to_all(send_counts.view(world, 1), [1] * world, [1] * world).view(-1)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        # Each row travels with its expert id as one more column (one exchange, not two); 16-bit
        # floats hold integers exactly only up to 256, so more experts than that travel in float32.
        wire = torch.float32 if self.num_experts > 256 and x.element_size() < 4 else x.dtype
        payload = torch.cat([mine[token_of].to(wire), sorted_experts.unsqueeze(-1).to(wire)], dim=-1)
        received = group.all_to_all(payload, send, recv)
        rows, local = received[:, :-1].to(x.dtype), received[:, -1].round().long() - self.first_local
        # Rows from several senders, each already grouped by expert: regroup them by local expert.
        regroup = torch.argsort(local, stable=True)
        results = torch.empty_like(rows)
        results[regroup] = self._run_experts(rows[regroup], torch.bincount(local, minlength=self.num_local).tolist())
        returned = group.all_to_all(results, recv, send)  # back to the ranks that sent them, same order
        returned = returned * weights.reshape(-1)[order].unsqueeze(-1)
        combined = torch.zeros_like(mine).index_add_(0, token_of, returned)
        padded = torch.zeros((share, x.shape[1]), dtype=x.dtype, device=x.device)
        padded[:combined.shape[0]] = combined
        return group.all_gather_first(padded)[:tokens]
