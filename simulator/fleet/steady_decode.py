"""Steady decode runs: many scheduler steps applied at once, with exactly the engine's outcome.

Once the engine's next step will only decode (Scheduler.only_decodes_next: every running request
has just its last sampled token to compute, and no waiting request gets in), its scheduler keeps
making that same decision -- each running request, in admission order, one token -- until
something changes: a request arrives, a request finishes, or the block pool cannot give a growing
request its next block. Waiting requests that could not be admitted stay blocked meanwhile: the
running set and the token budget do not change, and the free pool only shrinks. A cached prefix
can only be evicted, never gained, in between, and only from its end (a block is freed no earlier
than the blocks after it, so it is queued for eviction after them): each block the waiting head
loses from its cached prefix is a block the pool handed out, so the blocks it lacks never
outgrow the free pool's shrinking.

`steady_steps` finds how many of those steps can be taken in bulk (up to and including the step
in which the first request finishes, and before the pool would run dry or the next arrival), and
`apply` performs them: the tokens, their times, the block allocations and prefix-cache
registrations in exactly the order the step-by-step scheduler would make them, and the finishes
of the last step, so the block manager ends in the same state.
tests/simulator/test_steady_decode.py checks that runs with and without it agree exactly.
"""

from __future__ import annotations

from engine.policy.scheduler import FinishedRequest, Scheduler


def steady_steps(scheduler: Scheduler, limit: int) -> tuple[int, int]:
    """How many identical all-decode steps (at most limit) can be applied in bulk from now, and
    the first step's total decode context (what StepTimer.plan_steady_run times from). Its caller
    has seen the scheduler's next step only decode (Scheduler.next_step), so every running request
    has computed all its tokens but the last; and the simulator's requests stop on their length
    alone (ignore_eos, no stop tokens: Replica.submit makes them so), so their finishes are known.
    One pass over the running requests (the simulator calls this for every run); a second only
    where the free pool may run dry within the run."""
    running = scheduler.running
    if not running or limit <= 0 or len(running) > scheduler.config.max_num_batched_tokens:
        return 0, 0
    max_len = scheduler.config.max_model_len
    steps, context = limit, 0
    for seq in running:
        num_tokens = len(seq.token_ids)
        # Up to the step in which the first request finishes (apply finishes it as update() would):
        # steps until the length limits stop it (the earlier of max_tokens and max_model_len).
        end = seq.sampling.max_tokens + len(seq.prompt_token_ids)
        if end > max_len:
            end = max_len
        if end - num_tokens < steps:
            steps = end - num_tokens
        context += num_tokens  # the context of its next step: every token, the last one computed then
    if steps <= 0:
        return 0, 0
    # Before the pool would run dry: the new blocks for k more steps must all be free now. Each
    # request takes at most 1 + (k - 1) // block_size of them; counted exactly only if that is too many.
    bm = scheduler.block_manager
    bs, free = bm.block_size, bm.num_free_blocks
    if len(running) * (1 + (steps - 1) // bs) > free:
        # first_block[j]: requests whose next new block is needed in step j (then every bs steps).
        first_block: dict[int, int] = {}
        for seq in running:
            # A step computes the request's last token: step j needs a block when its tokens outgrow them.
            j = len(seq.block_table) * bs - len(seq.token_ids) + 2
            first_block[j] = first_block.get(j, 0) + 1
        if _new_blocks(first_block, steps, bs) > free:
            low, high = 0, steps  # largest k with _new_blocks(k) <= free
            while low < high:
                mid = (low + high + 1) // 2
                if _new_blocks(first_block, mid, bs) <= free:
                    low = mid
                else:
                    high = mid - 1
            steps = low
    return steps, context


def _new_blocks(first_block: dict[int, int], steps: int, block_size: int) -> int:
    """Blocks the running requests allocate over `steps` decode steps, from the step in which each
    first needs one (first_block: that step -> how many requests)."""
    return sum(count * (1 + (steps - j) // block_size) for j, count in first_block.items() if j <= steps)


def apply(scheduler: Scheduler, step_end_times: list[float], token: int = 0,
          finishing: bool = True) -> list[FinishedRequest]:
    """Perform len(step_end_times) steady decode steps: what schedule() + update() would do.
    Returns the requests that finished in the last step (only the last can finish one: steady_steps
    ends the run there); finishing=False: the run was cut short of that step (DecodeSteps.finish)."""
    return DecodeSteps(scheduler, len(step_end_times), token).finish(step_end_times, finishing)


class DecodeSteps:
    """`steps` steady decode steps of the scheduler's running requests, applied in two parts:
    allocate() gives them their blocks through the last step's (what that step's schedule() does
    for them), finish() does the rest. In between, the last step's schedule() may admit waiting
    requests beside the decodes (Scheduler.admit_beside_decodes), as it would: the admissions take
    from the pool after the decodes' blocks, and their update() comes after the decodes'."""

    def __init__(self, scheduler: Scheduler, steps: int, token: int = 0) -> None:
        self.scheduler, self.steps, self.token = scheduler, steps, token
        bm = scheduler.block_manager
        bs = bm.block_size
        running = self.running = list(scheduler.running)
        # Block events in the order the step-by-step scheduler makes them: in step j, schedule()
        # allocates (running order), then update() registers newly full blocks (running order).
        events: list[tuple[int, int, int]] = []  # (step, phase 0 = allocate / 1 = register, running index)
        caching = bm.enable_prefix_caching
        filler = [token] * steps
        context = 0
        for i, seq in enumerate(running):
            computed = seq.num_computed_tokens  # every token but the last (a steady decode)
            context += computed
            # Allocation in step j when computed + j > blocks held (then every block_size steps after).
            j = len(seq.block_table) * bs - computed + 1
            while j <= steps:
                events.append((j, 0, i))
                j += bs
            if caching:
                # Registration in step j when (computed + j) is a multiple of block_size.
                j = bs - computed % bs
                while j <= steps:
                    events.append((j, 1, i))
                    j += bs
            seq.token_ids.extend(filler)  # every token of the run is known up front (block hashes read them)
        events.sort()
        self.events, self.done = events, 0
        # The last step's total decode context (each request's context counts its new token).
        self.last_context = context + steps * len(running)

    def allocate(self) -> None:
        """Every block event before the last step's registrations: the decodes hold their blocks
        for every step (steady_steps checked the free pool holds them all)."""
        self._events_until((self.steps, 1, -1))

    def _events_until(self, end: tuple[int, int, int]) -> None:
        """The block events before `end`, a (step, phase, -1) bound, not yet made."""
        events, running, ahead = self.events, self.running, self.steps + 1
        bm = self.scheduler.block_manager
        k = self.done
        while k < len(events) and events[k] < end:
            j, phase, i = events[k]
            seq = running[i]
            if phase == 0:
                bm.allocate_block(seq)
            else:  # registered with the tokens computed by step j (the run's are all in token_ids)
                seq.num_computed_tokens = len(seq.token_ids) - ahead + j
                bm.cache_full_blocks(seq)
            k += 1
        self.done = k

    def finish(self, step_end_times: list[float], finishing: bool = True) -> list[FinishedRequest]:
        """The rest of the steps (ending at step_end_times): their block events, tokens and times,
        and the finishes of the last step. Returns the requests that finished. finishing=False:
        the caller knows none can (steady_steps ended its run later), so none is looked for."""
        self._events_until((self.steps + 1, 0, -1))
        finished: list[FinishedRequest] = []
        if not finishing:
            for seq in self.running:
                seq.num_computed_tokens = len(seq.token_ids) - 1
                seq.token_times.extend(step_end_times)
            return finished
        # The last step's finishes, in running order as update() makes them. Freeing a request's
        # blocks there interleaves with the other requests' registrations and token bookkeeping,
        # which touch neither the free pool nor the freed blocks, so finishing here, after all
        # registrations, ends in the same state.
        scheduler, token = self.scheduler, self.token
        end = step_end_times[-1]
        max_len = scheduler.config.max_model_len
        for seq in self.running:
            num_tokens = len(seq.token_ids)
            seq.num_computed_tokens = num_tokens - 1
            seq.token_times.extend(step_end_times)
            # The cheap screen of update(); the scheduler's rule decides.
            if num_tokens - len(seq.prompt_token_ids) >= seq.sampling.max_tokens or num_tokens >= max_len:
                done = scheduler.stop_if_done(seq, token, end)
                if done is not None:
                    finished.append(done)
        return finished
