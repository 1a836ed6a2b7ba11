"""A replica's steady decode runs: the steps it takes in bulk rather than one scheduler step at a
time (Replica's part; simulator/fleet/replica.py has the rest). No torch.

During a steady decode run (simulator/fleet/steady_decode.py) nothing the router reads changes (outstanding tokens move only when a request arrives or finishes, and a run ends at its
first finish), so a run is planned up to its first finish and waited out a timeout per arrival at
the cluster, each to the end of the step across it. An arrival routed to the replica is noted;
at the end of that step the replica takes the steps that began at or before the arrival -- the
ones the step-by-step loop schedules without the newcomer -- and the next step offers it
admission, as that loop would (applied in bulk with the run where it can be; unless the scheduler
says that step only decodes: then the runs go on).
"""

from __future__ import annotations

import bisect

from engine.policy.scheduler import NextStep
from simulator.fleet import steady_decode

SAMPLED_TOKEN = 0  # the simulator's stand-in for every generated token
STEADY_RUN_LIMIT = 4096  # most steps applied in one bulk decode run


class SteadyRuns:
    """Replica's bulk steps. It reads the replica's env, timer, clock, busy and output counters and
    its booking (_step, _book, _retire, _sample, _first_tokens_out); each virtual engine's cohort,
    in_steady_run and run_arrival_s are its own."""

    def _steady_runs(self, engine, now: float):
        """Steady decode runs from `now` (a generator: it waits them out in SimPy time); returns the
        time the last step taken ends, which env.now has reached.

        The running requests are held in a DecodeCohort (steady_decode.py) meanwhile: every one is
        written out when this returns, for the scheduler's next step. A run ends at the step where
        a request finishes, or where an arrival routed here comes in (see the module's docstring).
        What follows is the scheduler's next step (Scheduler.next_step): another run when it only
        decodes (always with nobody waiting, otherwise when the waiting head would be refused); a
        step that admits the waiting beside the same decodes is applied in bulk too, with the run
        before it when an arrival cut it short (_run_then_admit); any other step is left to the
        scheduler."""
        scheduler = engine.scheduler
        in_bulk = self._admits_in_bulk(engine)
        cohort = engine.cohort = steady_decode.DecodeCohort(scheduler, SAMPLED_TOKEN)
        try:
            while True:
                steps = cohort.steady_steps(STEADY_RUN_LIMIT)
                if steps > 0:
                    now, admit_next = yield from self._steady_run(engine, now, steps, in_bulk)
                    if not admit_next:
                        continue  # nothing new to admit: the next step only decodes (steady_steps: how far)
                elif not cohort.size:
                    return now
                while True:
                    if not cohort.covers_running():
                        return now  # a prompt still being computed: the scheduler's steps
                    following = scheduler.next_step_beside_decodes(cohort.decode_blocks_next())
                    if following is NextStep.ONLY_DECODES:
                        break
                    if following is NextStep.DECODES_AND_ADMISSIONS and in_bulk:
                        now = yield from self._run_then_admit(engine, now, [])
                        continue
                    # A step for the scheduler itself (decodes that need blocks the pool lacks
                    # preempt): the cohort written out for it, then told what it did.
                    cohort.sync_all()
                    now, out = yield from self._step(engine, now)
                    if out is None or not cohort.absorb(out, now):
                        return now
        finally:
            cohort.sync_all()
            engine.cohort = None

    def _steady_run(self, engine, now: float, steps: int, in_bulk: bool):
        """A steady run of at most `steps` steps from `now`, cut short by an arrival routed here
        (then the step after it, which admits the newcomer, is applied with it where in_bulk). A
        generator: returns (when its last step ends, whether the scheduler's next step may admit
        someone)."""
        env, scheduler, timer, cohort = self.env, engine.scheduler, self.timer, engine.cohort
        batch = cohort.size
        first_extra_s = timer.shape_change(engine.previous_tokens, batch)
        if timer._pads:  # padded groups are timed from every request's context
            cohort.sync_all()
        run = timer.plan_steady_run(scheduler.running, steps, now, cohort.context, first_extra_s)
        # Timed as far as the next arrival (which ends the run if it comes here), then further
        # if it went elsewhere: runs are often cut short, and timing a step is a cost (padded
        # runs are timed whole).
        ends = run.end_times
        engine.in_steady_run, engine.run_arrival_s = True, None
        # Waited out to the end of the step across the next arrival at the cluster, and on from
        # there while the arrivals go elsewhere: nothing is booked before an arrival here is seen.
        across = 0
        while True:
            run.plan_until(self.clock.next_arrival_s)
            across = min(bisect.bisect_right(ends, self.clock.next_arrival_s, across), len(ends) - 1)
            yield env.timeout(ends[across] - env.now)
            if engine.run_arrival_s is not None or across == steps - 1:
                break
        arrived_s, interrupted = engine.run_arrival_s, engine.run_arrival_s is not None
        engine.in_steady_run, engine.run_arrival_s = False, None
        taken = steps
        if interrupted:
            # Steps that began at or before the arrival (the first began at `now`) are scheduled
            # without it; the one after them admits it (it may begin at the arrival's instant).
            taken = min(1 + bisect.bisect_right(ends, arrived_s), steps)
            run.plan(taken)
        if ends[taken - 1] > env.now:
            # Finish the step the arrival came in before booking it, as the step-by-step loop
            # does: its finishes must not show before that step ends (the router reads them).
            yield env.timeout(ends[taken - 1] - env.now)
        run.commit(taken)
        engine.previous_tokens = batch
        times = ends[:taken]
        self._first_tokens_out(engine, times[0] - now)
        if interrupted and taken < steps and in_bulk and times[-1] < self._next_sample_s:
            # The step after the run admits the newcomer beside the same decodes: applied with the
            # run (nobody finishes before it; a time-series sample would read the run's end).
            now = yield from self._run_then_admit(engine, now, times)
            return now, True
        last_step_s = times[-1] - (times[-2] if taken > 1 else now)
        finished = cohort.advance(times)
        self.busy_s += times[-1] - now
        self.output_tokens += taken * batch
        now = times[-1]
        for done in finished:
            self._retire(engine, done.request_id, last_step_s)
        if now >= self._next_sample_s:
            self._next_sample_s = now + self.sample_every_s
            self._sample(now, batch)
        return now, interrupted or bool(scheduler.waiting and finished)

    def _admits_in_bulk(self, engine) -> bool:
        """Whether a step that admits requests beside a steady run's decodes may be applied in bulk
        (_run_then_admit): not where the pool loads blocks from a host tier as it admits, nor
        where decodes are timed in padded groups (each decode's context counts there)."""
        return engine.tier is None and not self.timer._pads

    def _run_then_admit(self, engine, start_s: float, times: list[float]):
        """A steady run's steps (ending at `times`, the first begun at start_s; none: the step
        begins at start_s) and the step after them, in which every running request decodes again
        and waiting requests are admitted beside them (the scheduler's own admission,
        Scheduler.admit_beside_decodes), applied to the engine's DecodeCohort rather than as a
        run and a scheduler step; the admitted that decode next join it. A generator, as _run's
        loop is: returns the time that step ends, which env.now has reached."""
        scheduler, timer, cohort = engine.scheduler, self.timer, engine.cohort
        batch = cohort.size
        if times:
            cohort.advance(times)  # nobody finishes in them: the run went on past them
        cohort.allocate_next()  # the decodes' blocks, before the admission takes any
        begins = times[-1] if times else start_s
        admitted = scheduler.admit_beside_decodes(begins)
        step_s = timer.step(admitted.chunks, batch, cohort.context)
        tokens = batch + admitted.num_batched_tokens
        if timer.times_shape_changes:
            step_s += timer.shape_change(engine.previous_tokens, tokens)
            engine.previous_tokens = tokens
        sampled = timer.last_sampled
        end = begins + step_s
        if end > self.clock.next_arrival_s:
            yield self.env.timeout(end - self.env.now)  # this step spans an arrival, as in _run
        self._first_tokens_out(engine, step_s)  # this step follows theirs (after a run: none held)
        finished = cohort.complete_next(end)
        if times:
            self.busy_s += times[-1] - start_s
            self.output_tokens += len(times) * batch
        self.busy_s += step_s
        finished += scheduler.update(admitted, self._sampled, end)
        cohort.join_admitted(admitted.chunks)
        self._book(engine, admitted, end, sampled, finished, step_s, tokens)
        return end

