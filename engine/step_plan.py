"""A scheduled step as plain lists (StepPlan) and as device tensors (StepInputs).

Every rank (tensor or context parallel) receives the same StepPlan; plan_step packs the scheduler's
chunks into it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from engine.attention import AttentionMetadata, build_metadata
from engine.policy.scheduler import SchedulerOutput
from engine.policy.sequence import Sequence


@dataclass
class StepPlan:
    """A step as plain lists: what every tensor-parallel rank needs to run the same forward."""

    input_ids: list[int]  # packed over the step's chunks
    positions: list[int]
    slots: list[int]
    chunks: list[tuple[int, int, list[int]]]  # (start, tokens, block table) per chunk
    verifying: set[int]  # chunks that attend as multi-token verification chunks
    sample_rows: list[int]  # packed rows whose logits are sampled ...
    sample_ids: list[str]  # ... for these requests
    logit_ranges: list[tuple[str, int, int, int]]  # request, first row, rows, first position (prompt logits)
    # Verification chunks (lookahead slots): request, first row, rows (its last token + its drafts).
    verify_ranges: list[tuple[str, int, int]] = field(default_factory=list)

    def logit_rows(self) -> list[int]:
        """Rows whose logits the step needs: sampled rows, then verified rows, then prompt rows."""
        rows = list(self.sample_rows)
        for _, begin, n in self.verify_ranges:
            rows.extend(range(begin, begin + n))
        for _, begin, n, _ in self.logit_ranges:
            rows.extend(range(begin, begin + n))
        return rows

    def tensors(self, block_size: int, windows: set[int | None], device: torch.device) -> StepInputs:
        return StepInputs(torch.tensor(self.input_ids, dtype=torch.long, device=device),
                          torch.tensor(self.positions, dtype=torch.long, device=device),
                          build_metadata(self.slots, self.chunks, block_size, windows, device, self.verifying))


@dataclass
class StepInputs:
    """A StepPlan as tensors on the device."""

    input_ids: torch.Tensor  # [tokens] packed over the step's chunks
    positions: torch.Tensor  # [tokens]
    meta: AttentionMetadata


def slots_for(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """KV-cache slots of positions start..end-1 of a sequence with this block table."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


SHORT_CHUNK = 16  # batch_short: chunks of at most this many tokens over a cached context attend together


def is_short_chunk(start: int, num_tokens: int) -> bool:
    """A chunk plan_step(batch_short=True) attends with the verification batch, not as a prefill."""
    return 1 < num_tokens <= SHORT_CHUNK and start > 0


def plan_step(out: SchedulerOutput, requests: Mapping[str, Sequence], block_size: int,
              drafts: Mapping[str, list[int]] | None = None, batch_short: bool = False) -> StepPlan:
    """Pack the scheduled chunks into token, position and KV-slot lists.

    A chunk that reaches past its request's last token (lookahead slots) carries that token and the
    request's drafts (as many as were proposed, up to the slots) and is verified on every row."""
    verify_ranges: list[tuple[str, int, int]] = []
    verifying: set[int] = set()  # indices (in chunks) of multi-token verification chunks
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    chunks = []
    sample_rows: list[int] = []
    sample_ids: list[str] = []
    logit_ranges: list[tuple[str, int, int, int]] = []
    for chunk in out.chunks:
        seq = requests[chunk.request_id]
        begin = len(input_ids)
        draft_slots = chunk.draft_slots(len(seq.token_ids))
        tokens = seq.token_ids[chunk.start:chunk.start + chunk.num_tokens]
        if draft_slots:  # verification: the last known token, then the drafts proposed (up to the slots)
            tokens = tokens + (drafts or {}).get(chunk.request_id, [])[:draft_slots]
        n = len(tokens)
        input_ids.extend(tokens)
        positions.extend(range(chunk.start, chunk.start + n))
        slots.extend(slots_for(seq.block_table, chunk.start, chunk.start + n, block_size))
        if n > 1 and (draft_slots or (batch_short and is_short_chunk(chunk.start, n))):
            verifying.add(len(chunks))
        chunks.append((chunk.start, n, seq.block_table))
        if draft_slots:
            verify_ranges.append((chunk.request_id, begin, n))
            continue
        end_pos = chunk.start + n
        if chunk.samples:
            sample_rows.append(begin + chunk.num_tokens - 1)
            sample_ids.append(chunk.request_id)
        if seq.sampling.return_prompt_logits and chunk.start < seq.num_prompt_tokens:
            n = min(end_pos, seq.num_prompt_tokens) - chunk.start
            logit_ranges.append((chunk.request_id, begin, n, chunk.start))
    return StepPlan(input_ids, positions, slots, chunks, verifying, sample_rows, sample_ids, logit_ranges,
                    verify_ranges)
