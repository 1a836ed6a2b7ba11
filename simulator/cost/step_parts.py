"""The small types the step assembler (simulator/cost/step_timer.py) works in: what a step is made
of (StepComposition), what its time splits into (StepParts), and where a replica's busy time went
over many steps (StepTally: the sums the summary's time split and MFU / MBU are made from). No torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class StepComposition(NamedTuple):
    """What a step computes, counted from its chunks (StepTimer.compose): what every part of its
    time and the framework terms scale with."""

    tokens: int  # new tokens, every chunk's
    sampled: int  # rows through the LM head: those that sample, and every verified draft
    decodes: int  # decode and verification chunks (both attended in batches, not one by one)
    decode_context: int  # the decodes' total context
    prefill_tokens: int
    keys: int  # attention (query, key) pairs of the prefill and verification chunks
    prefill_context: int  # the prefill and verification chunks' total context (KV read)
    chunks: int
    prefill_chunks: int
    groups: int  # attention calls for the decodes, plus one for a verification batch
    verifying: int  # 1 where the step verifies drafts
    ring_keys: int = 0  # context parallelism: a rank's shard of every prefill chunk's keys


class StepParts(NamedTuple):
    compute_s: float
    comm_s: float
    prefill_s: float
    decode_s: float
    head_s: float
    overhead_s: float
    prefill_share: float
    flops: float
    bytes_moved: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s + self.prefill_s + self.decode_s + self.head_s + self.overhead_s


@dataclass
class StepTally:
    """Where a replica's busy time went, in seconds, and the work it did, summed over its steps
    (the summary's TimeSplit and utilization read it)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    communication_s: float = 0.0
    overhead_s: float = 0.0
    flops: float = 0.0  # per GPU
    bytes_moved: float = 0.0  # per GPU: weights and KV read
    steps: int = 0

    def merge(self, other: "StepTally") -> None:
        for name in ("prefill_s", "decode_s", "communication_s", "overhead_s", "flops", "bytes_moved", "steps"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def record(self, parts: StepParts) -> float:
        """Add one step's parts; its time."""
        self.prefill_s += parts.prefill_s + (parts.compute_s + parts.head_s) * parts.prefill_share
        self.decode_s += parts.decode_s + (parts.compute_s + parts.head_s) * (1.0 - parts.prefill_share)
        self.communication_s += parts.comm_s
        self.overhead_s += parts.overhead_s
        self.flops += parts.flops
        self.bytes_moved += parts.bytes_moved
        self.steps += 1
        return parts.total_s
