"""One serving replica as SimPy processes: the engine's own scheduler and block manager, with the
cost model's step time in place of the model runner. No torch.

Each scheduler step is one step of simulated time: schedule() (the engine's code), the step's
time from the StepTimer, then update() with one sampled token per sampling chunk. A replica with
pp pipeline stages runs pp virtual engines (vLLM's scheme), each with its own scheduler and a
1/pp share of the KV blocks and sequences; a micro-batch's step time is its trip through all
stages, and the pp engines keep the stages busy in turn.

Between two arrivals at the cluster nothing outside a replica can change it, so a replica runs
the steps that end before the next arrival in a plain loop and yields to SimPy only to cross an
arrival (the router must see every replica as it is at that instant) or to go idle. The
decisions and times are those of one event per step; only the event-loop overhead is saved.

Steady decode runs go further: runs of identical all-decode steps, and the steps that admit
beside them, are taken in bulk (simulator/fleet/replica_runs.py, over steady_decode.py's cohort).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import simpy

from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import Scheduler, SchedulerOutput
from simulator.fleet import steady_decode
from simulator.fleet.replica_runs import SAMPLED_TOKEN, SteadyRuns
from simulator.fleet.block_pool import KeyedSequence
from simulator.fleet.tiered_pool import TieredBlockPool
from simulator.workload.block_keys import BlockKeys
from engine.policy.sequence import Sequence
from simulator.fleet.metrics import Recorder
from simulator.fleet.speculation import Speculation
from simulator.cost.step_timer import StepTimer
from simulator.workload.requests import Request


@dataclass
class ArrivalClock:
    """Time of the next arrival at the cluster (inf once the workload is exhausted)."""

    next_arrival_s: float = 0.0


class ArrivalsAnyTime:
    """The clock of replicas whose requests come at any moment (a disaggregated fleet's handoffs):
    the next arrival may be now, so they take one SimPy event a step."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env

    @property
    def next_arrival_s(self) -> float:
        return self.env.now


@dataclass
class _VirtualEngine:
    scheduler: object  # engine.policy.scheduler.Scheduler or StaticBatchScheduler
    wakeup: simpy.Event | None = None
    # When the arrival that fired wakeup came, exactly: env.now adds up the deltas of whatever
    # events came between (other replicas' too), so it can differ from it in the last bit.
    woke_s: float | None = None
    outstanding_tokens: int = 0
    sequences: dict = field(default_factory=dict)
    process: simpy.Process | None = None
    loop: Generator | None = None  # the step loop the process runs
    in_steady_run: bool = False  # waiting out a planned steady decode run
    run_arrival_s: float | None = None  # when the first request routed here during that run came
    # Tokens of the step just taken (StepTimer.shape_change); None after idle. Kept only where the
    # timer charges shape changes.
    previous_tokens: int | None = None
    # Sequences whose first token waits on this engine's next step (Replica.output_delay_steps).
    first_pending: list = field(default_factory=list)
    # Its running requests while they decode in lockstep (steady_decode.DecodeCohort), else None.
    cohort: steady_decode.DecodeCohort | None = None
    # Its pool where that has a host tier (it loads blocks only while the scheduler schedules).
    tier: TieredBlockPool | None = None

    def __post_init__(self) -> None:
        pool = getattr(self.scheduler, "block_manager", None)
        self.tier = pool if isinstance(pool, TieredBlockPool) else None


class Replica(SteadyRuns):
    def __init__(self, env: simpy.Environment, index: int, make_scheduler: Callable[[], object], timer: StepTimer,
                 recorder: Recorder, clock: ArrivalClock, pp: int = 1, sample_every_s: float = math.inf,
                 bulk_decodes: bool = True, speculation: Speculation | None = None,
                 block_keys: BlockKeys | None = None, output_delay_steps: float = 0.0, keyed: bool = False) -> None:
        self.env, self.index, self.timer, self.recorder, self.clock = env, index, timer, recorder, clock
        # A sampled token reaches the client this many step times after its step ends (the serving
        # engine's output pipeline: EngineProfile.output_delay_steps); the client's first-token and
        # finish times carry it, the scheduler does not wait for it. A first token waits on the
        # step after its own (it streams with the next token), so it is shifted once that step
        # is timed (_VirtualEngine.first_pending).
        self.output_delay_steps = output_delay_steps
        # Exact prefix-cache keys for the block pool, when it is an ExactKeyBlockPool (block_pool.py).
        self.block_keys = block_keys
        self.keyed = keyed or block_keys is not None  # its pool takes KeyedSequences
        # What becomes of a finished request (a disaggregated fleet's prefill replica hands it on).
        self.on_finish: Callable[[Sequence, int], None] = recorder.finish
        self.speculation = speculation  # simulator/fleet/speculation.py, when speculative decoding is on
        self.engines = [_VirtualEngine(make_scheduler()) for _ in range(pp)]
        # request id -> the token it samples, for every unfinished request (update() reads it).
        self._sampled: dict = {}
        self._sampling: dict[int, SamplingParams] = {}  # max_tokens -> the requests' sampling
        self.sample_every_s = sample_every_s
        # Apply steady decode runs in bulk (simulator/fleet/steady_decode.py); same outcome, fewer calls.
        # Not under speculation: its steps verify drafts, they are not plain decodes.
        self.bulk_decodes = bulk_decodes and speculation is None
        self._next_sample_s = 0.0
        self.finished_requests = 0
        self.output_tokens = 0
        self.busy_s = 0.0
        for engine in self.engines:
            engine.loop = self._run(engine)
            engine.process = env.process(engine.loop)

    def release(self) -> None:
        """Let go of the engines' schedulers and KV block pools once the run is summarized. The
        SimPy environment and the replica's processes hold each other, so without this the pools --
        a few hundred thousand small objects -- would stay until a cyclic collection walked them all,
        a tenth of a short simulation's time."""
        for engine in self.engines:
            engine.loop.close()  # its frame holds the scheduler
            engine.scheduler, engine.sequences, engine.wakeup = None, {}, None
        self._sampled = {}

    # -- state the router reads ---------------------------------------------------------------
    @property
    def outstanding_tokens(self) -> int:
        return sum(e.outstanding_tokens for e in self.engines)

    @property
    def num_unfinished(self) -> int:
        return sum(e.scheduler.num_unfinished for e in self.engines)

    # -- arrivals -----------------------------------------------------------------------------
    def submit(self, request: Request, arrived_blocks: int = 0, at_s: float | None = None) -> None:
        """A request arrives (arrived_blocks: its first full prompt blocks come computed from another
        replica, tiered_pool.py), at at_s exactly (None: env.now)."""
        engine = min(self.engines, key=lambda e: e.outstanding_tokens) if len(self.engines) > 1 else self.engines[0]
        params = self._sampling.get(request.output_tokens)
        if params is None:  # one (frozen) SamplingParams per output length: a request makes none
            params = self._sampling[request.output_tokens] = SamplingParams(
                max_tokens=request.output_tokens, temperature=0.0, ignore_eos=True)
        if self.block_keys is None:
            seq = (KeyedSequence if self.keyed else Sequence)(request.request_id, request.prompt_token_ids(), params,
                                                              request.arrival_s)
        else:
            # Its blocks' exact keys stand for its tokens (the pool reads no token), so these are
            # stand-ins of the prompt's length, made at C speed.
            seq = KeyedSequence(request.request_id, [SAMPLED_TOKEN] * request.prompt_tokens, params, request.arrival_s,
                                [SAMPLED_TOKEN] * request.prompt_tokens)
            seq.block_hashes = self.block_keys.of(request)
            seq.first_private_block = self.block_keys.first_private(request)
        if arrived_blocks:
            seq.arrived_blocks = arrived_blocks
        try:
            engine.scheduler.add(seq)
        except ValueError as exc:  # can never be served here: rejected with the scheduler's reason
            self.recorder.reject(request.request_id, request.arrival_s, request.prompt_tokens,
                                 request.output_tokens, str(exc))
            return
        engine.sequences[seq.request_id] = seq
        self._sampled[seq.request_id] = SAMPLED_TOKEN
        engine.outstanding_tokens += request.prompt_tokens + request.output_tokens
        at_s = self.env.now if at_s is None else at_s
        if engine.wakeup is not None and not engine.wakeup.triggered:
            engine.woke_s = at_s
            engine.wakeup.succeed()
        elif engine.in_steady_run and engine.run_arrival_s is None:
            engine.run_arrival_s = at_s  # the run reads it when its step across this instant ends

    # -- the step loop --------------------------------------------------------------------------
    def _run(self, engine: _VirtualEngine):
        env, scheduler, timer = self.env, engine.scheduler, self.timer
        cold_s = 0.0  # extra time of the first step after an idle spell
        while True:
            if not scheduler.has_unfinished():
                idle_from = env.now
                engine.wakeup = env.event()
                yield engine.wakeup
                engine.wakeup = None
                if timer.follows_time:
                    timer.now = engine.woke_s
                cold_s = timer.wakeup(engine.woke_s - idle_from)
                engine.previous_tokens = None
            now, engine.woke_s = (env.now if engine.woke_s is None else engine.woke_s), None
            while scheduler.has_unfinished():
                now, out = yield from self._step(engine, now, cold_s)
                if out is None:
                    break  # nothing admissible until something arrives
                cold_s = 0.0
                if (self.bulk_decodes and timer.times_steady_runs and isinstance(scheduler, Scheduler)
                        and scheduler.only_decodes_next()):
                    now = yield from self._steady_runs(engine, now)
            if now > env.now:
                yield env.timeout(now - env.now)
            if scheduler.has_unfinished():
                # Requests that cannot be scheduled until something changes: wait for an arrival
                # (requests still here when the workload ends are reported as stuck).
                engine.wakeup = env.event()
                yield engine.wakeup
                engine.wakeup = None
                engine.previous_tokens = None

    def _step(self, engine: _VirtualEngine, now: float, cold_s: float = 0.0):
        """One scheduler step from `now` (cold_s: extra time, after an idle spell): schedule(), its
        time, update(). A generator, as _run's loop is: returns (when it ends, its output), or
        (now, None) when nothing could be scheduled."""
        env, scheduler, timer, tier = self.env, engine.scheduler, self.timer, engine.tier
        if tier is None:  # a host tier loads blocks only while the scheduler schedules; the step pays
            out = scheduler.schedule(now)
        else:
            tier.loading = True
            out = scheduler.schedule(now)
            tier.loading = False
        if out.is_empty:
            return now, None
        if timer.follows_time:  # its step times depend on when the step starts
            timer.now = now
        step_s = timer.step(out.chunks) + cold_s
        if tier is not None:
            step_s += tier.take_load_s()
        if timer.times_shape_changes:
            tokens = out.num_batched_tokens
            step_s += timer.shape_change(engine.previous_tokens, tokens)
            engine.previous_tokens = tokens
        sampled = timer.last_sampled  # read now: the timer is shared with other replicas
        accepted = None
        if self.speculation is not None:  # drafts proposed before the step, accepted by it
            step_s += self.speculation.draft_time(out, scheduler.requests)
            accepted = self.speculation.accepted(out, scheduler.requests)
            sampled += sum(len(a) for a in accepted.values())
        self.busy_s += step_s
        now += step_s
        if now > self.clock.next_arrival_s:
            # This step spans an arrival: let SimPy deliver it at its time.
            yield env.timeout(now - env.now)
        self._apply(engine, out, now, sampled, accepted, step_s)
        return now, out

    def _apply(self, engine: _VirtualEngine, out: SchedulerOutput, now: float, sampled: int,
               accepted: dict | None = None, step_s: float = 0.0) -> None:
        self._first_tokens_out(engine, step_s)  # this step follows theirs
        finished = engine.scheduler.update(out, self._sampled, now, accepted)
        self._book(engine, out, now, sampled, finished, step_s, out.num_batched_tokens)

    def _book(self, engine: _VirtualEngine, out: SchedulerOutput, now: float, sampled: int, finished: list,
              step_s: float, batch_tokens: int) -> None:
        """What a step ending at `now` did (out: its scheduled chunks, past any decodes applied in
        bulk; finished: the requests it finished), told to the recorder."""
        if self.recorder.watch is not None or self.output_delay_steps:
            # First tokens come from prompt chunks (steady decode runs never make one); held before
            # the finished retire, so a one-token request has its first token too.
            sequences = engine.sequences
            for chunk in out.chunks:
                if chunk.is_prefill and chunk.samples:
                    seq = sequences[chunk.request_id]
                    if seq.first_token_time == now:
                        engine.first_pending.append(seq)
        self.output_tokens += sampled
        for f in finished:
            self._retire(engine, f.request_id, step_s)
        if now >= self._next_sample_s:
            self._next_sample_s = now + self.sample_every_s
            self._sample(now, batch_tokens)

    def _first_tokens_out(self, engine: _VirtualEngine, next_step_s: float, only=None) -> None:
        """The engine's held first tokens (of `only`, a sequence, else all) reach the client:
        shifted by the output delay in steps of next_step_s, and told to the recorder's watch."""
        pending = engine.first_pending
        for seq in (pending if only is None else [s for s in pending if s is only]):
            seq.first_token_time += self.output_delay_steps * next_step_s
            if self.recorder.watch is not None:
                self.recorder.first_token(seq)
        engine.first_pending = [] if only is None else [s for s in pending if s is not only]

    def _retire(self, engine: _VirtualEngine, request_id: str, step_s: float = 0.0) -> None:
        """Book a request the scheduler has finished (in a step of step_s seconds)."""
        seq = engine.sequences.pop(request_id)
        if engine.first_pending:
            self._first_tokens_out(engine, step_s, only=seq)  # its first token streams with its last
        if self.output_delay_steps:
            seq.finish_time += self.output_delay_steps * step_s
        if self.speculation is not None:
            self.speculation.forget(request_id)
        del self._sampled[request_id]
        engine.outstanding_tokens -= seq.num_prompt_tokens + seq.sampling.max_tokens
        self.finished_requests += 1
        self.on_finish(seq, self.index)

    def _sample(self, now: float, batch_tokens: int) -> None:
        running = tokens = 0
        for engine in self.engines:
            cohort, requests = engine.cohort, engine.scheduler.running
            running += len(requests)
            if cohort is not None and cohort.covers_running():
                tokens += cohort.context  # its members' tokens, some not yet written to their Sequences
            else:
                if cohort is not None:
                    cohort.sync_all()
                tokens += sum(len(seq.token_ids) for seq in requests)
        self.recorder.sample(now, self.index, sum(len(e.scheduler.waiting) for e in self.engines), running, tokens,
                             self.kv_utilization, batch_tokens, self.finished_requests, self.output_tokens)

    @property
    def kv_utilization(self) -> float:
        return sum(e.scheduler.block_manager.usage for e in self.engines) / len(self.engines)
