"""Token-budget continuous batching with chunked prefill and preemption. Plain Python, no torch.

Each step shares one token budget (max_num_batched_tokens) between running requests (decodes
and unfinished prefill chunks, served first, in admission order) and waiting requests (admitted
first come, first served, their prompts chunked to fit the budget when chunked prefill is on).
When the block pool runs dry, the most recently admitted running request is preempted by
recompute: its blocks are freed and it goes back to the head of the queue, keeping its tokens.

The simulator runs this very class with a cost model in place of the model runner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from engine.policy.block_manager import BlockManager
from engine.policy.config import CacheConfig, SchedulerConfig
from engine.policy.sequence import RequestStatus, Sequence


new_tuple = tuple.__new__


class ScheduledChunk(NamedTuple):
    """num_tokens tokens of one request from position start, computed this step (a NamedTuple, not
    a dataclass: one is made per running request per step, millions of them in the simulator)."""

    request_id: str
    start: int
    num_tokens: int
    is_prefill: bool
    # True when the chunk reaches the request's last known token, so the step samples a token.
    samples: bool

    def draft_slots(self, num_known_tokens: int) -> int:
        """Lookahead slots past the request's num_known_tokens tokens (speculative decoding): the
        draft tokens this chunk can verify; 0 for every other chunk."""
        return max(0, self.start + self.num_tokens - num_known_tokens)


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class NextStep(Enum):
    """What the next schedule() does (Scheduler.next_step)."""

    ONLY_DECODES = "only decodes"  # every running request decodes its one token; nobody is admitted
    DECODES_AND_ADMISSIONS = "decodes and admissions"  # the same decodes, and the waiting head is admitted
    OTHER = "other"  # a prompt chunk of a running request, a preemption or draft slots


@dataclass(frozen=True)
class FinishedRequest:
    request_id: str
    reason: str


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 eos_token_ids: Iterable[int] = (), block_manager_class: type[BlockManager] = BlockManager) -> None:
        self.config = scheduler_config
        # block_manager_class: a subclass whose hooks keep the pool's decisions (the simulator's
        # exact-key pool, simulator/fleet/block_pool.py), built from cache_config as the engine's is.
        self.block_manager = block_manager_class(cache_config.num_blocks, cache_config.block_size,
                                                 cache_config.enable_prefix_caching)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.requests: dict[str, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0

    # -- admission ----------------------------------------------------------------------------
    def check_request(self, seq: Sequence) -> None:
        """Raise ValueError if the request can never be served by this scheduler."""
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already in use: pick a unique id")
        if seq.num_prompt_tokens == 0:
            raise ValueError(f"request {seq.request_id!r} has an empty prompt: give at least one token")
        max_len = seq.num_prompt_tokens + seq.sampling.max_tokens
        if max_len > self.config.max_model_len:
            raise ValueError(
                f"request {seq.request_id!r}: prompt ({seq.num_prompt_tokens}) + max_tokens "
                f"({seq.sampling.max_tokens}) = {max_len} exceeds max_model_len="
                f"{self.config.max_model_len}: shorten the prompt or lower max_tokens")
        needed = self.block_manager.blocks_needed(max_len)
        if needed > self.block_manager.num_blocks:
            raise ValueError(
                f"request {seq.request_id!r} needs up to {needed} KV blocks but the pool has "
                f"{self.block_manager.num_blocks}: raise num_blocks / the KV byte budget or lower max_tokens")

    def add(self, seq: Sequence) -> None:
        self.check_request(seq)
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def abort(self, request_id: str, now: float) -> Sequence:
        seq = self.requests.get(request_id)
        if seq is None:
            raise ValueError(f"no unfinished request with id {request_id!r} to abort")
        (self.running if seq.status is RequestStatus.RUNNING else self.waiting).remove(seq)
        self._finish(seq, RequestStatus.FINISHED_ABORTED, now)
        return seq

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    # -- one step -----------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens

        # Hot loop (the simulator runs it per request per step): a request whose new tokens fit the
        # blocks it already holds needs no allocation call.
        running, chunks = self.running, out.chunks
        block_size = self.block_manager.block_size
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            start = seq.num_computed_tokens
            num_tokens = len(seq.token_ids)
            num_new = num_tokens - start
            if num_new > budget:
                num_new = budget
            if start + num_new > len(seq.block_table) * block_size and not self._allocate_or_preempt(seq, num_new, out):
                continue  # seq itself was preempted (it was the last running request)
            # tuple.__new__ skips the NamedTuple's Python-level constructor (same object).
            chunks.append(new_tuple(ScheduledChunk, (seq.request_id, start, num_new, start < seq.num_prefill_tokens,
                                                     start + num_new == num_tokens)))
            budget -= num_new
            i += 1

        # A step that preempted has no blocks to spare for newcomers.
        if not out.preempted:
            budget = self._admit(out, budget, now)
        if self.config.num_lookahead_tokens and budget > 0 and not out.preempted:
            self._add_lookahead(out, budget)
        return out

    def admit_beside_decodes(self, now: float = 0.0) -> SchedulerOutput:
        """schedule()'s admissions alone, where every running request decodes its one token and holds
        its block for it (the simulator's bulk steps, simulator/fleet/steady_decode.py): the chunks
        of the waiting requests admitted beside them, in what the decodes leave of the budget."""
        out = SchedulerOutput()
        self._admit(out, self.config.max_num_batched_tokens - len(self.running), now)
        return out

    def _admit(self, out: SchedulerOutput, budget: int, now: float) -> int:
        """Admit waiting requests, first come first served, into what is left of the budget (their
        prompts chunked to fit it when chunked prefill is on); returns what they leave."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            computed = self.block_manager.get_computed_blocks(seq)
            num_cached = len(computed) * self.block_manager.block_size
            num_new = seq.num_tokens - num_cached
            if not self._has_room(seq, num_new):
                break
            if num_new > budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = budget
            if not self.block_manager.allocate_slots(seq, num_new, computed):
                break
            self.waiting.popleft()
            seq.num_computed_tokens = num_cached
            seq.num_prefill_tokens = seq.num_tokens
            seq.status = RequestStatus.RUNNING
            if seq.first_scheduled_time is None:
                # Counted at the first admission only, as vLLM does: a readmission after preemption
                # would count the prompt again (and its outputs), past the prompt's length.
                seq.num_cached_prompt_tokens = num_cached
                seq.first_scheduled_time = now
            self.running.append(seq)
            out.chunks.append(self._chunk(seq, num_new))
            budget -= num_new
        return budget

    def _has_room(self, seq: Sequence, num_new: int) -> bool:
        """Whether the policy admits seq, num_new of its tokens uncached, as far as the KV cache goes
        beyond the blocks its chunk takes now (vLLM: no further reserve; prefill_first.py: SGLang's)."""
        return True

    def decoded_in_bulk(self, steps: int) -> None:
        """Decode steps the simulator took in bulk, without schedule() (fleet/steady_decode.py)."""

    def only_decodes_next(self) -> bool:
        """Whether the next schedule() only decodes: every running request computes its last sampled
        token without a preemption, nobody is admitted. Changes nothing (the simulator takes such
        steps in bulk: simulator/fleet/steady_decode.py)."""
        return self.next_step() is NextStep.ONLY_DECODES

    def next_step(self) -> NextStep:
        """What the next schedule() will do (only_decodes_next's reading, with the step that admits
        the waiting head beside the decodes told apart from the rest). Changes nothing."""
        block_size = self.block_manager.block_size
        decode_blocks = 0
        for seq in self.running:
            computed = seq.num_computed_tokens
            if computed != len(seq.token_ids) - 1 or computed < seq.num_prefill_tokens:
                return NextStep.OTHER
            if computed + 1 > len(seq.block_table) * block_size:
                decode_blocks += 1
        return self.next_step_beside_decodes(decode_blocks)

    def next_step_beside_decodes(self, decode_blocks: int) -> NextStep:
        """next_step() where every running request is known to have just its last sampled token to
        compute, decode_blocks of them needing a new block for it (the simulator keeps such
        requests in a cohort, simulator/fleet/steady_decode.py). Changes nothing."""
        if self.config.num_lookahead_tokens or len(self.running) > self.config.max_num_batched_tokens:
            return NextStep.OTHER
        bm = self.block_manager
        block_size = bm.block_size
        free = bm.num_free_blocks - decode_blocks  # after the decodes' blocks, taken first
        if free < 0:
            return NextStep.OTHER  # someone would be preempted
        budget = self.config.max_num_batched_tokens - len(self.running)
        if not self.waiting or budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return NextStep.ONLY_DECODES
        head = self.waiting[0]
        computed_blocks = bm.get_computed_blocks(head)
        if computed_blocks and decode_blocks:
            # The decodes' blocks may evict some of the head's cached prefix: its hits end there.
            taken = set(bm.next_free_blocks(decode_blocks))
            for i, block_id in enumerate(computed_blocks):
                if block_id in taken:
                    computed_blocks = computed_blocks[:i]
                    break
        num_new = head.num_tokens - len(computed_blocks) * block_size
        if num_new > budget:
            if not self.config.enable_chunked_prefill:
                return NextStep.ONLY_DECODES
            num_new = budget
        refused = bm.free_blocks_needed(head, num_new, computed_blocks) > free
        return NextStep.ONLY_DECODES if refused else NextStep.DECODES_AND_ADMISSIONS

    def _add_lookahead(self, out: SchedulerOutput, budget: int) -> None:
        """Speculative decoding: decode chunks get draft slots from what the step leaves over (token
        budget, free blocks), never what a request needed this step nor by preempting. Such a chunk
        reaches past its request's last token; it samples, and update() takes the accepted drafts."""
        chunks, requests, bm = out.chunks, self.requests, self.block_manager
        for i, chunk in enumerate(chunks):
            if budget <= 0:
                break
            if chunk.num_tokens != 1 or chunk.is_prefill or not chunk.samples:
                continue
            seq = requests[chunk.request_id]
            k = min(self.config.num_lookahead_tokens, budget,
                    seq.sampling.max_tokens - seq.num_output_tokens - 1,  # accepted drafts + one sampled token
                    self.config.max_model_len - len(seq.token_ids))
            room = len(seq.block_table) * bm.block_size - len(seq.token_ids) + bm.num_free_blocks * bm.block_size
            k = min(k, room)
            if k <= 0 or not bm.allocate_slots(seq, 1 + k):
                continue
            chunks[i] = chunk._replace(num_tokens=1 + k)
            budget -= k

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        """Blocks for seq's new tokens, preempting the most recently admitted requests until they
        fit. False when seq itself had to go."""
        while not self.block_manager.allocate_slots(seq, num_new):
            victim = self.running.pop()
            self._preempt(victim)
            out.preempted.append(victim.request_id)
            if victim is seq:
                return False
        return True

    @staticmethod
    def _chunk(seq: Sequence, num_new: int) -> ScheduledChunk:
        start = seq.num_computed_tokens
        return ScheduledChunk(seq.request_id, start, num_new, start < seq.num_prefill_tokens,
                              start + num_new == len(seq.token_ids))

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = RequestStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # -- results of a step --------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: Mapping[str, int], now: float,
               accepted: Mapping[str, Seq[int]] | None = None) -> list[FinishedRequest]:
        """Advance the scheduled requests by their computed tokens and append sampled tokens.

        sampled maps request id -> new token for every chunk with samples=True; accepted maps a
        request verified with draft tokens to the drafts the target accepted (they come before
        its sampled token). Returns the requests that finished this step (their blocks are
        already freed).
        """
        finished: list[FinishedRequest] = []
        block_manager = self.block_manager
        block_size = block_manager.block_size
        lookup, running_status = self.requests.get, RequestStatus.RUNNING
        eos_token_ids, max_model_len = self.eos_token_ids, self.config.max_model_len
        for request_id, start, num_tokens, _, samples in out.chunks:
            seq = lookup(request_id)
            if seq is None or seq.status is not running_status:
                continue
            if start + num_tokens > len(seq.token_ids):  # draft_slots() > 0, inlined: a verification step
                done = self._advance_speculative(seq, start, accepted.get(request_id, ()) if accepted else (),
                                                 sampled[request_id], now)
                if done is not None:
                    finished.append(done)
                continue
            computed = seq.num_computed_tokens + num_tokens
            seq.num_computed_tokens = computed
            if computed // block_size > seq.num_registered_blocks:
                block_manager.cache_full_blocks(seq)
            if not samples:
                continue
            token = sampled[request_id]
            seq.token_ids.append(token)  # Sequence.append_token, inlined in this per-request loop
            seq.token_times.append(now)
            if seq.first_token_time is None:
                seq.first_token_time = now
            # Cheap screen first (this runs per request per step); the exact rule decides only
            # when a stop is possible.
            params = seq.sampling
            num_total = len(seq.token_ids)
            if (params.stop_token_ids or (not params.ignore_eos and token in eos_token_ids)
                    or num_total - len(seq.prompt_token_ids) >= params.max_tokens or num_total >= max_model_len):
                done = self.stop_if_done(seq, token, now)
                if done is not None:
                    finished.append(done)
        return finished

    def _advance_speculative(self, seq: Sequence, start: int, accepted: Seq[int], token: int,
                             now: float) -> FinishedRequest | None:
        """A verification step: the accepted drafts and the sampled token are appended (up to the
        first that meets a stop rule); the last known token and the accepted drafts are now
        computed. Rejected drafts leave nothing behind: their positions are past
        num_computed_tokens (their KV slots are overwritten later) and blocks held only for them go
        back to the pool."""
        status = None
        for t in (*accepted, token):
            seq.token_ids.append(t)
            seq.token_times.append(now)
            if seq.first_token_time is None:
                seq.first_token_time = now
            status = self._stop_status(seq, t)
            if status is not None:
                break
        seq.num_computed_tokens = min(start + 1 + len(accepted), len(seq.token_ids))
        # Registered before any finish frees the blocks, and only verified tokens: registration
        # stops at num_computed_tokens.
        if seq.num_computed_tokens // self.block_manager.block_size > seq.num_registered_blocks:
            self.block_manager.cache_full_blocks(seq)
        if status is not None:
            return self._finish_running(seq, status, now)
        self.block_manager.trim(seq, len(seq.token_ids))
        return None

    def stop_if_done(self, seq: Sequence, token: int, now: float) -> FinishedRequest | None:
        """Finish a running request if its last token (token) meets a stop rule: it leaves the
        running set and its blocks are freed."""
        status = self._stop_status(seq, token)
        return None if status is None else self._finish_running(seq, status, now)

    def _stop_status(self, seq: Sequence, token: int) -> RequestStatus | None:
        params = seq.sampling
        num_tokens = len(seq.token_ids)
        if ((params.stop_token_ids and token in params.stop_token_ids)
                or (not params.ignore_eos and token in self.eos_token_ids)) and (
                num_tokens - len(seq.prompt_token_ids) >= params.min_tokens):
            return RequestStatus.FINISHED_STOPPED
        if num_tokens - len(seq.prompt_token_ids) >= params.max_tokens or num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish_running(self, seq: Sequence, status: RequestStatus, now: float) -> FinishedRequest:
        self.running.remove(seq)
        self._finish(seq, status, now)
        return FinishedRequest(seq.request_id, status.value)

    def _finish(self, seq: Sequence, status: RequestStatus, now: float) -> None:
        self.block_manager.free(seq, finished=True)
        seq.status = status
        seq.finish_time = now
        del self.requests[seq.request_id]
