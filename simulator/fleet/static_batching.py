"""Classic static batching, for comparison with continuous batching. Plain Python, no torch.

A batch of up to max_num_seqs waiting requests is admitted only when the previous batch has
completely finished. Every prompt is padded to the batch's longest and prefilled in one step;
then the batch decodes in lockstep until its longest output is done: requests that finish early
keep their slot (their rows are padding the step still computes), and KV space is reserved up
front for the padded prompt plus the longest output. Same interface as engine.policy.scheduler.Scheduler
(add / schedule / update / has_unfinished), so a replica runs either.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from engine.policy.block_manager import BlockManager
from engine.policy.config import CacheConfig, SchedulerConfig
from engine.policy.scheduler import FinishedRequest, ScheduledChunk, SchedulerOutput
from engine.policy.sequence import RequestStatus, Sequence

PADDING = None  # request id of a padding row


class StaticBatchScheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.config = scheduler_config
        # No prefix caching: a static batch reserves and computes everything itself.
        self.block_manager = BlockManager(cache_config.num_blocks, cache_config.block_size, False)
        self.requests: dict[int, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # the current batch, finished members included until it ends
        self.num_preemptions = 0
        self._padded_prompt = 0
        self._step_in_batch = 0

    def check_request(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already in use: pick a unique id")
        total = seq.num_prompt_tokens + seq.sampling.max_tokens
        if total > self.config.max_model_len:
            raise ValueError(f"request {seq.request_id!r}: prompt ({seq.num_prompt_tokens}) + max_tokens "
                             f"({seq.sampling.max_tokens}) = {total} exceeds max_model_len={self.config.max_model_len}")
        if seq.num_prompt_tokens > self.config.max_num_batched_tokens:
            raise ValueError(f"request {seq.request_id!r}: a {seq.num_prompt_tokens}-token prompt does not fit one "
                             f"static-batching step of max_num_batched_tokens={self.config.max_num_batched_tokens}")
        if self.block_manager.blocks_needed(total) > self.block_manager.num_blocks:
            raise ValueError(f"request {seq.request_id!r} needs more KV blocks than the pool has")

    def add(self, seq: Sequence) -> None:
        self.check_request(seq)
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    def schedule(self, now: float = 0.0) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.running and all(s.finished for s in self.running):
            for seq in self.running:
                self.block_manager.free(seq)
            self.running = []
        if not self.running:
            self._admit(now)
            if not self.running:
                return out
            # One prefill step over the padded prompts.
            for seq in self.running:
                out.chunks.append(ScheduledChunk(seq.request_id, 0, self._padded_prompt, True, True))
            return out
        for seq in self.running:
            if seq.finished:
                out.chunks.append(ScheduledChunk(PADDING, self._padded_prompt + self._step_in_batch, 1, False, True))
            else:
                out.chunks.append(ScheduledChunk(seq.request_id, seq.num_computed_tokens, 1, False, True))
        return out

    def _admit(self, now: float) -> None:
        batch: list[Sequence] = []
        longest_prompt = longest_output = 0
        for seq in self.waiting:
            if len(batch) == self.config.max_num_seqs:
                break
            prompt = max(longest_prompt, seq.num_prompt_tokens)
            output = max(longest_output, seq.sampling.max_tokens)
            blocks = (len(batch) + 1) * self.block_manager.blocks_needed(prompt + output)
            if (len(batch) + 1) * prompt > self.config.max_num_batched_tokens or blocks > self.block_manager.num_blocks:
                break
            batch.append(seq)
            longest_prompt, longest_output = prompt, output
        for seq in batch:
            self.waiting.popleft()
            if not self.block_manager.allocate_slots(seq, longest_prompt + longest_output):
                raise AssertionError("static batch admitted beyond the KV pool")
            seq.status = RequestStatus.RUNNING
            seq.first_scheduled_time = now
        self.running = batch
        self._padded_prompt = longest_prompt
        self._step_in_batch = 0

    def update(self, out: SchedulerOutput, sampled: Mapping[int, int], now: float,
               accepted: Mapping | None = None) -> list[FinishedRequest]:
        # accepted: Scheduler.update's signature; static batches never verify drafts (SimConfig refuses it).
        finished: list[FinishedRequest] = []
        for chunk in out.chunks:
            if chunk.request_id is PADDING:
                continue
            seq = self.requests[chunk.request_id]
            seq.num_computed_tokens = seq.num_prompt_tokens if chunk.is_prefill else seq.num_computed_tokens + 1
            seq.append_token(sampled[chunk.request_id], now)
            if seq.num_output_tokens >= seq.sampling.max_tokens:
                seq.status = RequestStatus.FINISHED_LENGTH
                seq.finish_time = now
                del self.requests[seq.request_id]
                finished.append(FinishedRequest(seq.request_id, seq.status.value))
        self._step_in_batch += 1
        return finished
