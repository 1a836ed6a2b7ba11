"""Prefill-first scheduling, SGLang's default: a step is either prefills or decodes, never both.
Plain Python, no torch.

Whenever a prompt can make progress (a running request's unfinished prompt, or a waiting request
that can be admitted) the step runs prompts alone, up to the token budget (SGLang's
chunked_prefill_size), the unfinished one first; the running requests' decodes wait for a step in
which no prompt can run (SGLang's get_next_batch_to_run with enable_mixed_chunk off). Admission,
chunking, preemption and the block pool are the token-budget scheduler's (scheduler.py).

Not modelled: SGLang's conservative admission (it reserves new_token_ratio of the running
requests' remaining output tokens before admitting), which matters only when the KV cache is full.
"""

from __future__ import annotations

from engine.policy.scheduler import NextStep, Scheduler, SchedulerOutput


class PrefillFirstScheduler(Scheduler):
    def schedule(self, now: float = 0.0) -> SchedulerOutput:
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
        return out

    def next_step_beside_decodes(self, decode_blocks: int) -> NextStep:
        """A waiting request that may be admitted makes the next step a prefill (OTHER, for
        schedule() to decide); never decodes beside admissions."""
        if self.waiting and len(self.running) < self.config.max_num_seqs:
            return NextStep.OTHER
        step = super().next_step_beside_decodes(decode_blocks)
        return NextStep.OTHER if step is NextStep.DECODES_AND_ADMISSIONS else step
