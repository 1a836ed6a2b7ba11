"""SchedulerOutput -> packed tensors -> one forward -> sampled tokens (and prompt logits)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from engine.attention import AttentionMetadata, build_metadata
from engine.config import CacheConfig, ModelConfig
from engine.context_parallel import CPRank, gather_rows, local_step
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
                 device: torch.device, dtype: torch.dtype, kv_cache_dtype: str | None = None,
                 cp: CPRank | None = None) -> None:
        """cp: this rank of a context-parallel engine (its cache holds cp.block_size positions of
        each of the block manager's blocks)."""
        self.model = model
        self.config = model_config
        self.device = device
        self.dtype = dtype
        self.block_size = cache_config.block_size
        self.cp = cp
        if cp is not None:
            cache_config = dataclasses.replace(cache_config, block_size=cp.block_size)
        self.cache = KVCache(model_config, cache_config, dtype, device, kv_cache_dtype)
        self.windows = set(model_config.sliding_windows)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, requests: Mapping[str, Sequence],
                generators: Mapping[str, torch.Generator | None],
                drafts: Mapping[str, list[int]] | None = None,
                draft_probs: Mapping[str, torch.Tensor] | None = None,
                on_plan: Callable[[StepPlan], None] | None = None) -> StepResult:
        """drafts: request id -> draft tokens for the chunks scheduled with lookahead slots;
        draft_probs: the distributions sampled drafts were drawn from (none: point masses);
        on_plan: called with the step's plan before the forward (tensor parallelism hands it to
        the other ranks there)."""
        drafts, draft_probs = drafts or {}, draft_probs or {}
        plan = plan_step(out, requests, self.block_size, drafts)
        if on_plan is not None:
            on_plan(plan)
        logits = self.forward_logits(plan)
        result = StepResult()
        if plan.sample_rows:
            params = [requests[r].sampling for r in plan.sample_ids]
            sampled_logits = logits[:len(plan.sample_rows)]
            for row, (request_id, p) in enumerate(zip(plan.sample_ids, params)):
                if p.min_tokens and requests[request_id].num_output_tokens < p.min_tokens:
                    banned = [*p.stop_token_ids, *(() if p.ignore_eos else self.config.eos_token_ids)]
                    sampled_logits[row, banned] = float("-inf")
            tokens = sample(sampled_logits, params, [generators.get(r) for r in plan.sample_ids])
            result.sampled = dict(zip(plan.sample_ids, tokens))
        offset = len(plan.sample_rows)
        for request_id, _, n in plan.verify_ranges:
            accepted, token = verify(logits[offset:offset + n], drafts.get(request_id, []),
                                     requests[request_id].sampling, generators.get(request_id),
                                     draft_probs.get(request_id))
            offset += n
            result.sampled[request_id] = token
            result.accepted[request_id] = accepted
        for request_id, _, n, first_pos in plan.logit_ranges:
            result.prompt_logits[request_id] = (first_pos, logits[offset:offset + n].cpu().clone())
            offset += n
        return result

    @torch.inference_mode()
    def forward_logits(self, plan: StepPlan) -> torch.Tensor | None:
        """One forward over the plan's packed tokens; logits (float32, whole vocabulary) of its
        plan.logit_rows(), in that order, in one LM-head GEMM (None when it needs none, and on
        context-parallel ranks other than 0)."""
        if self.cp is not None:
            local = local_step(plan, self.cp, self.windows, self.device)
            inputs = local.inputs
        else:
            inputs = plan.tensors(self.block_size, self.windows, self.device)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.cache)
        rows = plan.logit_rows()
        if not rows:
            return None
        if self.cp is not None:
            hidden = gather_rows(hidden, local, rows, self.cp.group)
            return self.model.compute_logits(hidden) if self.cp.rank == 0 else None
        return self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])


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
