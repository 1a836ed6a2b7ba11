"""Prefill-first scheduling, SGLang's default: a step is either prefills or decodes, never both.
Plain Python, no torch.

Whenever a prompt can make progress (a running request's unfinished prompt, or a waiting request
that can be admitted) the step runs prompts alone, up to the token budget (SGLang's
chunked_prefill_size), the unfinished one first; the running requests' decodes wait for a step in
which no prompt can run (SGLang's get_next_batch_to_run with enable_mixed_chunk off). Admission,
chunking, preemption and the block pool are the token-budget scheduler's (scheduler.py).

Admission is SGLang's conservative one (srt/managers/schedule_policy.py PrefillAdder): a request
is admitted only if its uncached prompt and its output tokens (at most CLIP_MAX_NEW_TOKENS) fit
in the free KV cache beside a reserve: new_token_ratio of every running request's remaining
output, in full for the requests admitted this step, and the unfinished prompts. The ratio
(srt/managers/scheduler.py) starts at INIT_NEW_TOKEN_RATIO, falls by a step's share each decode
step down to MIN_FACTOR of it, goes back to the start when the scheduler idles, and after a
decode step that had to retract (preempt) is re-estimated from the requests still running
(schedule_batch.py retract_decode). So it admits fewer than vLLM while the ratio is high, and
preempts less often.
"""

from __future__ import annotations

from engine.policy.scheduler import NextStep, Scheduler, SchedulerOutput
from engine.policy.sequence import Sequence

# SGLang 0.5's defaults (srt/environ.py / global_config.py; schedule_policy.py's clip).
INIT_NEW_TOKEN_RATIO = 0.7
MIN_FACTOR = 0.14  # the lowest ratio, as a share of the starting one
DECAY_STEPS = 600  # decode steps from the start to the lowest ratio
RETRACT_DECODE_STEPS = 20  # tokens a retraction's estimate gives each request still running
CLIP_MAX_NEW_TOKENS = 4096  # a request's output counts at most this much in the reserve


class PrefillFirstScheduler(Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._admitted_now: set[str] = set()

    def schedule(self, now: float = 0.0) -> SchedulerOutput:
        if not self.running:
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO  # an idle scheduler starts conservative again
        self._admitted_now.clear()
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        # The unfinished prompts first, in admission order. A prompt never preempts anyone (SGLang
        # retracts requests only in a decode step): one whose next chunk does not fit waits for the
        # decodes to free blocks, and cannot then take back the blocks it was refused every step.
        for seq in self.running:
            if budget <= 0:
                break
            if seq.num_computed_tokens >= seq.num_prefill_tokens:
                continue
            num_new = min(len(seq.token_ids) - seq.num_computed_tokens, budget)
            if self.block_manager.allocate_slots(seq, num_new):
                out.chunks.append(self._chunk(seq, num_new))
                budget -= num_new
        self._admit(out, budget, now)
        return out if out.chunks else self._decode(out)

    def _has_room(self, seq: Sequence, num_new: int) -> bool:
        bs = self.block_manager.block_size
        reserve = 0.0
        for r in self.running:  # their outputs to come, and the prompt tokens they hold no slot for yet
            ratio = 1.0 if r.request_id in self._admitted_now else self.new_token_ratio
            reserve += (ratio * min(r.sampling.max_tokens - r.num_output_tokens, CLIP_MAX_NEW_TOKENS)
                        + max(r.num_prefill_tokens - len(r.block_table) * bs, 0))
        wanted = num_new + min(seq.sampling.max_tokens - seq.num_output_tokens, CLIP_MAX_NEW_TOKENS)
        if wanted >= self.block_manager.num_free_blocks * bs - reserve:
            return False
        self._admitted_now.add(seq.request_id)  # reserved in full from here (if its blocks are given)
        return True

    def decoded_in_bulk(self, steps: int) -> None:
        self._decay(steps)

    def _decay(self, steps: int) -> None:
        floor = INIT_NEW_TOKEN_RATIO * MIN_FACTOR
        self.new_token_ratio = max(self.new_token_ratio - steps * (INIT_NEW_TOKEN_RATIO - floor) / DECAY_STEPS, floor)

    def _decode(self, out: SchedulerOutput) -> SchedulerOutput:
        """Every running request past its prompt computes its sampled token, preempting the most
        recently admitted requests for blocks; where none can (every running prompt is stuck on
        blocks), the newest is preempted so that the others can go on."""
        running, budget, i = self.running, self.config.max_num_batched_tokens, 0
        while i < len(running) and budget > 0:
            seq = running[i]
            if seq.num_computed_tokens < seq.num_prefill_tokens:
                i += 1
                continue
            num_new = min(len(seq.token_ids) - seq.num_computed_tokens, budget)
            if not self._allocate_or_preempt(seq, num_new, out):
                continue  # seq itself was preempted (it was the last running request)
            out.chunks.append(self._chunk(seq, num_new))
            budget -= num_new
            i += 1
        if not out.chunks and not out.preempted and len(running) > 1:
            victim = running.pop()
            self._preempt(victim)
            out.preempted.append(victim.request_id)
        if out.preempted:  # retracted: the ratio re-estimated from how far the rest have come
            decoded = sum(r.num_output_tokens for r in running) + RETRACT_DECODE_STEPS * len(running)
            self.new_token_ratio = min(1.0, decoded / (sum(r.sampling.max_tokens for r in running) + 1))
        elif out.chunks:
            self._decay(1)
        return out

    def next_step_beside_decodes(self, decode_blocks: int) -> NextStep:
        """A waiting request that may be admitted makes the next step a prefill (OTHER, for
        schedule() to decide); never decodes beside admissions."""
        if self.waiting and len(self.running) < self.config.max_num_seqs:
            return NextStep.OTHER
        step = super().next_step_beside_decodes(decode_blocks)
        return NextStep.OTHER if step is NextStep.DECODES_AND_ADMISSIONS else step
