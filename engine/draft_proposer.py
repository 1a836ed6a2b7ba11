"""Draft-model proposals: a smaller model with the target's vocabulary proposes tokens.

The draft keeps its own paged KV cache, indexed by the target's block tables (same block size and
block count, the draft's own head shapes), so every slot the target allocates exists for the draft
too and nothing else needs managing. Each step the draft first catches up on the positions the
target computes (prompt chunks, the last sampled token, and any accepted draft it has not
computed itself), then proposes autoregressively for the requests given lookahead slots: one
batched one-token forward per draft position.

The draft only shapes acceptance: rejection sampling makes the output exact whatever it proposes,
so a draft KV slot that is stale (a prefix-cache hit on a block the draft never filled, say) costs
acceptance, never correctness.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from engine.policy.config import CacheConfig, ModelConfig
from engine.kv_cache import KVCache
from engine.model import DecoderModel
from engine.step_plan import plan_step
from engine.sampler import probabilities
from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import ScheduledChunk, SchedulerOutput
from engine.policy.sequence import Sequence


@dataclass
class _DraftView:
    """What plan_step reads of a request, for the draft's forward passes."""

    token_ids: list[int]
    block_table: list[int]
    sampling: SamplingParams
    num_prompt_tokens: int


_NO_LOGITS = SamplingParams(max_tokens=1)  # plan_step asks for prompt logits only when told to


class DraftModelProposer:
    def __init__(self, model: DecoderModel, config: ModelConfig, cache_config: CacheConfig, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.model, self.config, self.device = model, config, device
        self.block_size = cache_config.block_size
        self.cache = KVCache(config, cache_config, dtype, device)
        self.windows = set(config.sliding_windows)
        # request id -> positions whose draft KV is computed (from 0, as far as it is valid)
        self._frontier: dict[str, int] = {}

    def forget(self, request_id: str) -> None:
        self._frontier.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, out: SchedulerOutput, requests: Mapping[str, Sequence],
                generators: Mapping[str, torch.Generator | None]) -> tuple[dict[str, list[int]], dict[str, torch.Tensor]]:
        """Drafts for the chunks with lookahead slots, and for sampled requests the draft's
        distributions they were drawn from ([drafts, vocab])."""
        catch_up, views, wanted = [], {}, {}
        for c in out.chunks:
            seq = requests[c.request_id]
            known = len(seq.token_ids)
            end = min(c.start + c.num_tokens, known)
            # Begin where the draft's valid KV ends, never past where the target begins (a
            # preemption restarts both).
            begin = min(self._frontier.get(c.request_id, c.start), c.start)
            slots = c.draft_slots(known)
            samples = slots > 0
            # A proposing request's view grows by its drafts: a copy of its tokens; the others are read as they are.
            views[c.request_id] = _DraftView(list(seq.token_ids) if samples else seq.token_ids, seq.block_table,
                                             _NO_LOGITS, seq.num_prompt_tokens)
            catch_up.append(ScheduledChunk(c.request_id, begin, end - begin, False, samples))
            self._frontier[c.request_id] = end
            if samples:
                wanted[c.request_id] = slots
        drafts: dict[str, list[int]] = {r: [] for r in wanted}
        probs: dict[str, list[torch.Tensor]] = {r: [] for r in wanted}
        step = SchedulerOutput(catch_up)
        while step.chunks:
            logits = self._forward(step, views)
            following = []
            for (request_id, row) in logits:
                seq = requests[request_id]
                token, q = self._draw(row, seq.sampling, generators.get(request_id))
                drafts[request_id].append(token)
                if q is not None:
                    probs[request_id].append(q)
                view = views[request_id]
                position = len(view.token_ids)
                view.token_ids.append(token)
                if len(drafts[request_id]) < wanted[request_id]:
                    # The draft computes the token it just proposed, to propose the next one.
                    following.append(ScheduledChunk(request_id, position, 1, False, True))
                    self._frontier[request_id] = position + 1
            step = SchedulerOutput(following)
        return drafts, {r: torch.stack(p) for r, p in probs.items() if p}

    def _forward(self, step: SchedulerOutput, views: dict[str, _DraftView]) -> list[tuple[str, torch.Tensor]]:
        # A fully accepted run leaves the draft two tokens to catch up on: short chunks attend together.
        plan = plan_step(step, views, self.block_size, batch_short=True)
        inputs = plan.tensors(self.block_size, self.windows, self.device)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.cache)
        if not plan.sample_rows:
            return []
        logits = self.model.compute_logits(hidden[torch.tensor(plan.sample_rows, device=self.device)])
        return list(zip(plan.sample_ids, logits))

    @staticmethod
    def _draw(logits: torch.Tensor, params: SamplingParams,
              generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
        if params.greedy:
            return int(logits.argmax()), None
        q = probabilities(logits, params)
        return int(torch.multinomial(q, 1, generator=generator).item()), q
