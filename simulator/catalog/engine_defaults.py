"""What a serving engine's launcher picks when the user gives no limits: max_num_seqs,
max_num_batched_tokens (SGLang's chunked_prefill_size), gpu_memory_utilization and the largest
CUDA-graph batch, by the GPU's class. No torch.

An engine profile lists rules (its "limits"); the first whose condition holds for the GPU gives
the defaults, as vLLM's `get_batch_defaults` and SGLang's server_args do: by the total memory
CUDA reports and, for vLLM, by the device's name (an A100 gets the small-GPU limits at 80 GB). The
sources of each profile's rules are in docs/engine-versions.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.catalog.hardware import GB, GIB, Accelerator

# The knobs an engine's rules may give, and what they are without one (this project's own engine,
# a profile without rules): the values SimConfig's knobs had before engines gave their own.
DEFAULTED = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization")
PLAIN = {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9}


@dataclass(frozen=True)
class LimitRule:
    """Defaults for the GPUs a condition selects: total memory below memory_below_gib, or an id
    containing one of names (either; a rule without a condition takes every GPU)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float | None = None
    memory_below_gib: float | None = None
    names: tuple[str, ...] = ()
    # The largest decode batch the engine captures as a CUDA graph, below TP 4 and from it (SGLang's
    # cuda_graph_max_bs); None: the profile's graph sizes, capped at 2 x max_num_seqs (vLLM's rule).
    graph_max: int | None = None
    graph_max_tp4: int | None = None

    def holds(self, accelerator: Accelerator) -> bool:
        if self.memory_below_gib is None and not self.names:
            return True
        if any(name in accelerator.id for name in self.names):
            return True
        return self.memory_below_gib is not None and total_gib(accelerator) < self.memory_below_gib

    def graph_limit(self, tp: int) -> int | None:
        return self.graph_max_tp4 if tp >= 4 and self.graph_max_tp4 is not None else self.graph_max

    @classmethod
    def from_dict(cls, raw: dict) -> "LimitRule":
        return cls(int(raw["max_num_seqs"]), int(raw["max_num_batched_tokens"]),
                   None if raw.get("gpu_memory_utilization") is None else float(raw["gpu_memory_utilization"]),
                   None if raw.get("memory_below_gib") is None else float(raw["memory_below_gib"]),
                   tuple(str(n) for n in raw.get("names", ())),
                   None if raw.get("graph_max") is None else int(raw["graph_max"]),
                   None if raw.get("graph_max_tp4") is None else int(raw["graph_max_tp4"]))

    def to_dict(self) -> dict:
        out = {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
               "gpu_memory_utilization": self.gpu_memory_utilization, "memory_below_gib": self.memory_below_gib,
               "names": list(self.names), "graph_max": self.graph_max, "graph_max_tp4": self.graph_max_tp4}
        return {k: v for k, v in out.items() if v not in (None, [])}


def total_gib(accelerator: Accelerator) -> float:
    """The total memory CUDA reports, GiB (what the launchers' thresholds read); the datasheet's GB
    where the catalog has no measured figure. Infinite for a device without a memory figure."""
    if accelerator.visible_memory_gib is not None:
        return accelerator.visible_memory_gib
    return accelerator.memory_gb * GB / GIB if accelerator.memory_gb is not None else float("inf")


def rule_for(rules: tuple[LimitRule, ...], accelerator: Accelerator) -> LimitRule | None:
    """The first rule that holds for the GPU; None without rules."""
    return next((rule for rule in rules if rule.holds(accelerator)), None)


def defaults_for(rules: tuple[LimitRule, ...], accelerator: Accelerator | None) -> dict:
    """DEFAULTED's values for a GPU under these rules (PLAIN's where none holds or none is given)."""
    rule = rule_for(rules, accelerator) if accelerator is not None else None
    if rule is None:
        return dict(PLAIN)
    return {"max_num_seqs": rule.max_num_seqs, "max_num_batched_tokens": rule.max_num_batched_tokens,
            "gpu_memory_utilization": rule.gpu_memory_utilization or PLAIN["gpu_memory_utilization"]}
