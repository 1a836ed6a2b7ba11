"""The SwiGLU feed-forward (fused gate|up, then down): a dense layer's MLP, and each expert and
the shared expert of a mixture-of-experts layer (engine/moe.py).

Under tensor parallelism it is one rank's slice (its columns of gate|up, its rows of down) and
sums the ranks' partial outputs over its TPGroup; without a group (a routed expert, whose caller
sums) it returns its own output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.linear import Linear

if TYPE_CHECKING:
    from engine.tp_group import TPGroup


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 group: TPGroup | None = None) -> None:
        super().__init__()
        self.group = group
        self.intermediate_size = intermediate_size
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        out = self.down_proj(F.silu(gate) * up)
        return out if self.group is None else self.group.all_reduce(out)
