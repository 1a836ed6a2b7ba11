"""Steady decode runs: many scheduler steps applied at once, with exactly the engine's outcome.

Once the engine's next step will only decode (Scheduler.next_step: every running request has
just its last sampled token to compute, and no waiting request gets in), its scheduler keeps
making that same decision -- each running request, in admission order, one token -- until
something changes: a request arrives, a request finishes, or the block pool cannot give a growing
request its next block. Waiting requests that could not be admitted stay blocked meanwhile: the
running set and the token budget do not change, and the free pool only shrinks. A cached prefix
can only be evicted, never gained, in between, and only from its end (a block is freed no earlier
than the blocks after it, so it is queued for eviction after them): each block the waiting head
loses from its cached prefix is a block the pool handed out, so the blocks it lacks never
outgrow the free pool's shrinking. A step that admits the waiting head beside the same decodes
(Scheduler.admit_beside_decodes, the scheduler's own admission) changes the decodes in nothing.

In such steps the running requests move in lockstep, a token each per step, so a DecodeCohort
holds them without touching each one every step: their token counts, computed tokens and token
times are written to the Sequence objects when something reads them (sync: a finish, a block
registration that hashes tokens, and every request before a step the scheduler takes itself).
A step costs what changes in it. A request takes a new block every block_size steps and fills
one every block_size steps, each at a phase of its own, so the members are kept in buckets by
phase, in admission order; a step hands out and registers blocks for its phase's buckets, in the
order schedule() and update() would (allocations in running order, then registrations in running
order). Its finishes come off a heap of the step each member ends in (the simulator's requests
stop on their length alone: ignore_eos, no stop tokens, as Replica.submit makes them), in running
order. A run of k steps over n requests costs O(k + its block events + its finishes), not O(n k).
tests/simulator/fleet/test_steady_decode.py checks that runs with and without it agree exactly.
"""

from __future__ import annotations

import heapq
from itertools import repeat

from engine.policy.scheduler import FinishedRequest, Scheduler, SchedulerOutput
from engine.policy.sequence import RequestStatus, Sequence
from simulator.fleet.block_pool import ExactKeyBlockPool


class _Member:
    """A request of the cohort: its Sequence's tokens and times are written through step `synced`;
    its computed tokens after step s are base + s."""

    __slots__ = ("seq", "synced", "base", "alloc_phase", "register_phase", "counted", "gone")

    def __init__(self, seq: Sequence, synced: int, base: int, alloc_phase: int, register_phase: int,
                 counted: bool) -> None:
        self.seq, self.synced, self.base = seq, synced, base
        self.alloc_phase, self.register_phase = alloc_phase, register_phase
        # Its blocks from now on are registered by count alone (ExactKeyBlockPool.registers_by_count):
        # counted when it is written out, not block by block.
        self.counted = counted
        self.gone = False  # left the cohort (its entry in the heap of ends is dropped when reached)


class DecodeCohort:
    """The scheduler's running requests while each decodes one token per step (see the module's
    docstring). Steps are counted from the cohort's forming; `step` have been applied."""

    def __init__(self, scheduler: Scheduler, token: int = 0) -> None:
        self.scheduler, self.token = scheduler, token
        bm = scheduler.block_manager
        self.block_size, self.caching = bm.block_size, bm.enable_prefix_caching
        # A pool given exact keys registers a block from the computed count alone; one that hashes
        # tokens reads them too.
        self._keyed_pool = isinstance(bm, ExactKeyBlockPool)
        self.step = 0
        self.times: list[float] = []  # times[k]: when step k + 1 ended
        self.members: dict[str, _Member] = {}
        # Members taking a block (filling one) in step s, in running order: _allocating[s % block_size].
        self._allocating: list[list[_Member]] = [[] for _ in range(self.block_size)]
        self._registering: list[list[_Member]] = [[] for _ in range(self.block_size)]
        self._ends: list[tuple[int, int, _Member]] = []  # (the step it finishes in, join order, member)
        self._joined = 0
        # The members' tokens at `step` are _tokens + len(members) * step - _synced_sum (each member's
        # written count plus the steps since it was written): the next step's decode context.
        self._tokens = self._synced_sum = 0
        for seq in scheduler.running:
            self.join(seq)

    # -- membership -----------------------------------------------------------------------------
    def join(self, seq: Sequence) -> None:
        """A running request that decodes next (its prompt computed, its last token not), after
        the members (it was admitted after them)."""
        num_tokens = len(seq.token_ids)
        computed = seq.num_computed_tokens
        bs, step = self.block_size, self.step
        # First new block in step j when computed + j outgrows the blocks held; first full block
        # when computed + j is a multiple of block_size. Both within one block's steps.
        alloc = len(seq.block_table) * bs - computed + 1
        register = bs - computed % bs
        if computed != num_tokens - 1 or computed < seq.num_prefill_tokens or not 1 <= alloc <= bs:
            raise AssertionError(f"request {seq.request_id!r} joined a decode cohort without decoding next")
        counted = self.caching and self._keyed_pool and self.scheduler.block_manager.registers_by_count(seq)
        member = _Member(seq, step, computed - step, (step + alloc) % bs, (step + register) % bs, counted)
        self.members[seq.request_id] = member
        self._allocating[member.alloc_phase].append(member)
        if self.caching and not counted:
            self._registering[member.register_phase].append(member)
        # The length limits stop it: the earlier of max_tokens and max_model_len.
        end = min(seq.sampling.max_tokens + len(seq.prompt_token_ids), self.scheduler.config.max_model_len)
        heapq.heappush(self._ends, (step + end - num_tokens, self._joined, member))
        self._joined += 1
        self._tokens += num_tokens
        self._synced_sum += step

    def _leave(self, member: _Member) -> None:
        member.gone = True
        del self.members[member.seq.request_id]
        self._allocating[member.alloc_phase].remove(member)
        if self.caching and not member.counted:
            self._registering[member.register_phase].remove(member)
        self._tokens -= len(member.seq.token_ids)
        self._synced_sum -= member.synced

    @property
    def size(self) -> int:
        return len(self.members)

    def covers_running(self) -> bool:
        """Whether every running request is a member (each decodes next)."""
        return len(self.members) == len(self.scheduler.running)

    @property
    def context(self) -> int:
        """The next step's total decode context: every member's tokens."""
        return self._tokens + len(self.members) * self.step - self._synced_sum

    # -- writing the Sequences ------------------------------------------------------------------
    def _sync(self, member: _Member, step: int) -> None:
        """Write the member's Sequence through `step` (its tokens, computed tokens and times)."""
        lag = step - member.synced
        if lag:
            seq = member.seq
            seq.token_ids.extend(repeat(self.token, lag))
            seq.num_computed_tokens = member.base + step
            seq.token_times.extend(self.times[member.synced:step])
            if member.counted:
                self.scheduler.block_manager.cache_full_blocks(seq)  # the blocks it filled meanwhile
            member.synced = step
            self._tokens += lag
            self._synced_sum += lag

    def sync_all(self) -> None:
        """Write every member's Sequence through the steps applied (before anything reads them)."""
        step = self.step
        for member in self.members.values():
            if member.synced != step:
                self._sync(member, step)

    # -- the run's length ------------------------------------------------------------------------
    def steady_steps(self, limit: int) -> int:
        """How many steps (at most limit) can be applied in bulk from now: up to and including the
        step in which the first member finishes, and before the pool would run dry. The caller has
        seen the next step only decode (Scheduler.next_step)."""
        n = len(self.members)
        if not n or limit <= 0 or n > self.scheduler.config.max_num_batched_tokens:
            return 0
        ends = self._ends
        while ends[0][2].gone:  # preempted: its end no longer stands
            heapq.heappop(ends)
        steps = min(limit, ends[0][0] - self.step)
        bs, free = self.block_size, self.scheduler.block_manager.num_free_blocks
        # Each member takes a block every block_size steps: k steps take k // bs cycles of n blocks
        # and the first k % bs phases' after them.
        if n * (1 + (steps - 1) // bs) <= free:
            return steps
        cycles, spare = divmod(free, n)
        if cycles * bs >= steps:
            return steps
        allocating, start = self._allocating, self.step + 1
        phases = 0
        while phases < bs - 1:
            taken = len(allocating[(start + phases) % bs])
            if taken > spare:
                break
            spare -= taken
            phases += 1
        return min(steps, cycles * bs + phases)

    def decode_blocks_next(self) -> int:
        """Members that take a new block in the next step."""
        return len(self._allocating[(self.step + 1) % self.block_size])

    # -- steps -----------------------------------------------------------------------------------
    def advance(self, step_end_times: list[float]) -> list[FinishedRequest]:
        """Apply steps ending at these times (no more than steady_steps allowed): what schedule() and
        update() would do. Returns the requests that finished (in the last step only)."""
        self.times.extend(step_end_times)
        for _ in step_end_times:
            self._allocate()
            self._register()
        self.scheduler.decoded_in_bulk(len(step_end_times))
        return self._finish()

    def allocate_next(self) -> None:
        """The next step's blocks for the members (its schedule() gives them out before admitting
        anyone beside them); complete_next() applies the rest of that step."""
        self._allocate()

    def complete_next(self, end_s: float) -> list[FinishedRequest]:
        """The rest of the step allocate_next() began, ending at end_s: its registrations and
        finishes (the requests it admitted are updated after these, as update() orders them)."""
        self.times.append(end_s)
        self._register()
        self.scheduler.decoded_in_bulk(1)
        return self._finish()

    def absorb(self, out: SchedulerOutput, end_s: float) -> bool:
        """A step the scheduler took itself (schedule() and update(), after sync_all), ending at
        end_s: every member decoded its one token or was preempted (a step whose decodes needed
        blocks the pool lacked); the requests it admitted join if they decode next. False when the
        step was not one of those: then the cohort no longer holds its requests."""
        members = self.members
        decoding = []
        for chunk in out.chunks:
            member = members.get(chunk.request_id)
            if member is not None:
                if chunk.num_tokens != 1:
                    return False
                decoding.append(member)
        preempted = [members[r] for r in out.preempted if r in members]
        if len(decoding) + len(preempted) != len(members):
            return False
        self.step += 1
        self.times.append(end_s)
        for member in decoding:
            member.synced += 1  # update() wrote its token and time
        self._tokens += len(decoding)
        self._synced_sum += len(decoding)
        for member in preempted:
            self._leave(member)
        for member in decoding:
            if member.seq.status is not RequestStatus.RUNNING:
                self._leave(member)  # finished
        self.join_admitted(out.chunks)
        return True

    def join_admitted(self, chunks) -> None:
        """The requests a step admitted (its chunks of non-members) that decode next: those whose
        chunk sampled (their prompt is computed) and that did not finish on that token."""
        members, requests = self.members, self.scheduler.requests
        for chunk in chunks:
            if chunk.samples and chunk.request_id not in members:
                seq = requests.get(chunk.request_id)
                if seq is not None and seq.status is RequestStatus.RUNNING:
                    self.join(seq)

    def _allocate(self) -> None:
        allocate = self.scheduler.block_manager.allocate_block
        for member in self._allocating[(self.step + 1) % self.block_size]:
            allocate(member.seq)

    def _register(self) -> None:
        """Registrations of step `step + 1`, which then counts as applied."""
        step = self.step = self.step + 1
        if self.caching:
            cache_full_blocks = self.scheduler.block_manager.cache_full_blocks
            if self._keyed_pool:
                for member in self._registering[step % self.block_size]:
                    seq = member.seq
                    seq.num_computed_tokens = member.base + step
                    cache_full_blocks(seq)
            else:
                for member in self._registering[step % self.block_size]:
                    self._sync(member, step)
                    cache_full_blocks(member.seq)

    def _finish(self) -> list[FinishedRequest]:
        """The members whose last step was the step just applied, finished in running order as
        update() finishes them. Freeing a request's blocks there interleaves with the other
        requests' registrations and token bookkeeping, which touch neither the free pool nor the
        freed blocks, so finishing after all registrations ends in the same state."""
        finished: list[FinishedRequest] = []
        ends, step = self._ends, self.step
        while ends and ends[0][0] <= step:
            _, _, member = heapq.heappop(ends)
            if member.gone:
                continue
            self._sync(member, step)
            self._leave(member)
            done = self.scheduler.stop_if_done(member.seq, self.token, self.times[step - 1])
            if done is None:
                raise AssertionError(f"request {member.seq.request_id!r} outlived its length in a decode cohort")
            finished.append(done)
        return finished
