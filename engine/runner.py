"""SchedulerOutput -> packed tensors -> one forward -> sampled tokens (and prompt logits)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from engine.policy.config import CacheConfig, ModelConfig
from engine.context_parallel import CPRank, gather_rows, local_step
from engine.kv_cache import KVCache
from engine.model import DecoderModel
from engine.sampler import sample
from engine.spec_decode import verify
from engine.step_plan import StepPlan, plan_step
from engine.policy.scheduler import SchedulerOutput
from engine.policy.sequence import Sequence

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
