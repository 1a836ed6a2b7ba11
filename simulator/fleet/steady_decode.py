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
from engine.policy.sequence import RequestStatus


def steady_steps(scheduler: Scheduler, limit: int) -> tuple[int, int]:
    """How many identical all-decode steps (at most limit) can be applied in bulk from now, and
    the first step's total decode context (what StepTimer.plan_steady_run times from). One pass
    over the running requests: the simulator calls this for every run."""
    running = scheduler.running
    if not running or limit <= 0 or len(running) > scheduler.config.max_num_batched_tokens:
        return 0, 0
    max_len = scheduler.config.max_model_len
    bm = scheduler.block_manager
    bs = bm.block_size
    steps, context = limit, 0
    # first_block[j]: requests whose next new block is needed in step j (then every bs steps).
    first_block: dict[int, int] = {}
    for seq in running:
        params = seq.sampling
        if params.stop_token_ids or not params.ignore_eos:
            return 0, 0  # a sampled token could stop it: not predictable here
        num_tokens = len(seq.token_ids)
        # Up to the step in which the first request finishes (apply finishes it as update() would):
        # steps until the length limits stop it (the earlier of max_tokens and max_model_len).
        end = params.max_tokens + len(seq.prompt_token_ids)
        if end > max_len:
            end = max_len
        if end - num_tokens < steps:
            steps = end - num_tokens
        computed = seq.num_computed_tokens
        context += computed + 1
        # A step computes token number computed + 1 (the last sampled one).
        j = len(seq.block_table) * bs - computed + 1
        first_block[j] = first_block.get(j, 0) + 1
    if steps <= 0:
        return 0, 0
    # Before the pool would run dry: the new blocks for k more steps must all be free now.
    free = bm.num_free_blocks
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


def apply(scheduler: Scheduler, step_end_times: list[float], token: int = 0) -> list[FinishedRequest]:
    """Perform len(step_end_times) steady decode steps: what schedule() + update() would do.
    Returns the requests that finished in the last step (only the last can finish one: steady_steps
    ends the run there)."""
    steps = len(step_end_times)
    bm = scheduler.block_manager
    bs = bm.block_size
    running = list(scheduler.running)
    # Block events in the order the step-by-step scheduler makes them: in step j, schedule()
    # allocates (running order), then update() registers newly full blocks (running order).
    events: list[tuple[int, int, int]] = []  # (step, phase 0 = allocate / 1 = register, running index)
    caching = bm.enable_prefix_caching
    start: list[int] = []
    filler = [token] * steps
    for i, seq in enumerate(running):
        computed = seq.num_computed_tokens
        start.append(computed)
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
    for j, phase, i in sorted(events):
        seq = running[i]
        if phase == 0:  # steady_steps checked the free pool holds every block of the run
            bm.allocate_block(seq)
        else:
            seq.num_computed_tokens = start[i] + j
            bm.cache_full_blocks(seq)
    # The last step's finishes, in running order as update() makes them. Freeing a request's
    # blocks there interleaves with the other requests' registrations and token bookkeeping,
    # which touch neither the free pool nor the freed blocks, so finishing here, after all
    # registrations, ends in the same state.
    finished: list[FinishedRequest] = []
    end = step_end_times[-1]
    max_len = scheduler.config.max_model_len
    for i, seq in enumerate(running):
        if seq.status is not RequestStatus.RUNNING:
            raise AssertionError("steady decode run over a request that is not running")
        seq.num_computed_tokens = start[i] + steps
        seq.token_times.extend(step_end_times)
        num_tokens = len(seq.token_ids)  # the cheap screen of update(); the scheduler's rule decides
        if num_tokens - len(seq.prompt_token_ids) >= seq.sampling.max_tokens or num_tokens >= max_len:
            done = scheduler.stop_if_done(seq, token, end)
            if done is not None:
                finished.append(done)
    return finished
