"""SchedulerOutput -> packed tensors -> one forward -> sampled tokens (and prompt logits)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from engine.attention import AttentionMetadata, build_metadata
from engine.config import CacheConfig, ModelConfig
from engine.kv_cache import KVCache
from engine.model import DecoderModel
from engine.sampler import sample
from engine.spec_decode import verify
from engine.scheduler import SchedulerOutput
from engine.sequence import Sequence

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class StepResult:
    sampled: dict[str, int] = field(default_factory=dict)
    # request id -> the draft tokens the target accepted (verification steps only)
    accepted: dict[str, list[int]] = field(default_factory=dict)
    # request id -> (first position, logits [n, vocab]) of prompt positions computed this step
    prompt_logits: dict[str, tuple[int, torch.Tensor]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: DecoderModel, model_config: ModelConfig, cache_config: CacheConfig,
                 device: torch.device, dtype: torch.dtype, kv_cache_dtype: str | None = None) -> None:
        self.model = model
        self.config = model_config
        self.device = device
        self.dtype = dtype
        self.block_size = cache_config.block_size
        self.cache = KVCache(model_config, cache_config, dtype, device, kv_cache_dtype)
        self.windows = set(model_config.sliding_windows)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, requests: Mapping[str, Sequence],
                generators: Mapping[str, torch.Generator | None],
                drafts: Mapping[str, list[int]] | None = None,
                draft_probs: Mapping[str, torch.Tensor] | None = None) -> StepResult:
        """drafts: request id -> draft tokens for the chunks scheduled with lookahead slots;
        draft_probs: the distributions sampled drafts were drawn from (none: point masses)."""
        drafts, draft_probs = drafts or {}, draft_probs or {}
        inputs = prepare_step(out, requests, self.block_size, self.windows, self.device, drafts)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.cache)
        result = StepResult()
        if inputs.sample_rows:
            logits = self.model.compute_logits(hidden[torch.tensor(inputs.sample_rows, device=self.device)])
            params = [requests[r].sampling for r in inputs.sample_ids]
            tokens = sample(logits, params, [generators.get(r) for r in inputs.sample_ids])
            result.sampled = dict(zip(inputs.sample_ids, tokens))
        if inputs.verify_ranges:  # every verified row's logits in one LM-head GEMM, then per request
            rows = [r for _, begin, n in inputs.verify_ranges for r in range(begin, begin + n)]
            all_logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)]).float()
            offset = 0
            for request_id, _, n in inputs.verify_ranges:
                accepted, token = verify(all_logits[offset:offset + n], drafts.get(request_id, []),
                                         requests[request_id].sampling, generators.get(request_id),
                                         draft_probs.get(request_id))
                offset += n
                result.sampled[request_id] = token
                result.accepted[request_id] = accepted
        for request_id, begin, n, first_pos in inputs.logit_ranges:
            result.prompt_logits[request_id] = (first_pos, self.model.compute_logits(hidden[begin:begin + n]).cpu())
        return result


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [tokens] packed over the step's chunks
    positions: torch.Tensor  # [tokens]
    meta: AttentionMetadata
    sample_rows: list[int]  # packed rows whose logits are sampled ...
    sample_ids: list[str]  # ... for these requests
    logit_ranges: list[tuple[str, int, int, int]]  # request, first row, rows, first position (prompt logits)
    # Verification chunks (lookahead slots): request, first row, rows (its last token + its drafts).
    verify_ranges: list[tuple[str, int, int]] = field(default_factory=list)


def slots_for(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """KV-cache slots of positions start..end-1 of a sequence with this block table."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


SHORT_CHUNK = 16  # batch_short: chunks of at most this many tokens over a cached context attend together


def prepare_step(out: SchedulerOutput, requests: Mapping[str, Sequence], block_size: int,
                 windows: set[int | None], device: torch.device,
                 drafts: Mapping[str, list[int]] | None = None, batch_short: bool = False) -> StepInputs:
    """The host-side work of a step: pack the scheduled chunks into tensors and attention metadata.

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
        if n > 1 and (draft_slots or (batch_short and chunk.start > 0 and n <= SHORT_CHUNK)):
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
    return StepInputs(torch.tensor(input_ids, dtype=torch.long, device=device),
                      torch.tensor(positions, dtype=torch.long, device=device),
                      build_metadata(slots, chunks, block_size, windows, device, verifying),
                      sample_rows, sample_ids, logit_ranges, verify_ranges)
