"""ReplicaShape: what one replica runs, as one value -- the model, how its GPUs split it, and the
precisions it computes and stores in. The step assembler (simulator/cost/step_timer.py) turns a
shape and a step's chunks into the step's time; everything that prices a step (the simulator,
`servecast predict`, the framework fit) passes one of these rather than loose knobs. No torch."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from simulator.catalog.models import ModelSpec
from simulator.cost.recipe import StepRecipe

# Weight precisions a GEMM computes in directly; any other is weight-only quantization (narrower
# weights read, widened to the compute dtype).
_PLAIN_WEIGHTS = ("bf16", "fp16", "fp32")


def weight_dtype_of(quant: str, compute_dtype: str) -> str | None:
    """The stored weights' precision where it differs from what GEMMs compute in, else None."""
    return None if quant in _PLAIN_WEIGHTS or quant == compute_dtype else quant


@dataclass(frozen=True)
class ReplicaShape:
    model: ModelSpec
    tp: int = 1
    pp: int = 1
    # Context-parallel ranks, each a TP group (simulator/cost/context_parallel.py); 1: none.
    cp: int = 1
    dtype: str = "bf16"  # what GEMMs compute in
    weight_dtype: str | None = None  # narrower stored weights (weight-only quantization), else None
    kv_dtype: str | None = None  # the KV cache's precision; None: the compute dtype's
    block_size: int | None = 16  # None: decodes attended unpadded even on a profiled servecast device
    # Mixture-of-experts models: whole experts per rank (all-to-all), and the router's skew.
    expert_parallel: bool = False
    routing_skew: float = 0.0

    def __post_init__(self) -> None:
        if self.cp > 1 and self.pp != 1:
            raise ValueError("context parallelism is simulated without pipeline parallelism: use pp=1")

    @functools.cached_property
    def recipe(self) -> StepRecipe:
        """The one operator list of a step of this shape (per rank)."""
        return StepRecipe.of(self.model, self.tp, self.dtype, self.weight_dtype, self.expert_parallel,
                             self.routing_skew)
