"""Running a plan: every (candidate, traffic growth) point through an executor, finished points
kept in a study file as they finish. No torch.

The executor is local processes by default (one simulation per core at a time); with workers=0
everything runs in this process (tests, debugging); executor="ray" sends the points to a Ray
cluster (`address`, or a local Ray instance of `workers` CPUs) when a sweep outgrows one machine.
A point whose simulation raises is reported with the error and the others go on (and is recomputed
on the next run). A worker process that dies outright (killed, out of memory) breaks a local pool
and every point the pool still held; those are run again, and a point that kills its own process
alone is the one reported failed. Ray fails only that task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace

from simulator.plan import search
from simulator.plan.capacity import (Candidate, CandidateResult, PlanSpec, pareto_front, plan_candidate, plan_extras,
                                     recommend, recommend_validated)
from simulator.plan.study import Study, plan_digest, point_key

WORKER_FAILED = "worker failed"


@dataclass
class PlanResult:
    results: list[CandidateResult]  # every point, feasible or not, in candidate then growth order
    reused: int  # points read back from the study instead of simulated

    def at(self, rate_scale: float) -> list[CandidateResult]:
        return [r for r in self.results if r.rate_scale == rate_scale]

    def recommendation(self, rate_scale: float = 1.0) -> CandidateResult | None:
        return recommend(self.at(rate_scale))

    def validated_recommendation(self, rate_scale: float = 1.0) -> CandidateResult | None:
        """The cheapest fleet whose costs were validated on real runs on its accelerator."""
        return recommend_validated(self.at(rate_scale))

    def pareto(self, rate_scale: float = 1.0) -> list[CandidateResult]:
        return pareto_front(self.at(rate_scale))


def run_task(spec: PlanSpec, task: tuple) -> CandidateResult:
    """One unit of a plan's work, wherever it runs: ("point", candidate, rate_scale) searched in
    full with headroom and slow end; ("search", candidate, rate_scale, most) the fewest replicas up
    to most; ("extras", result) a found fleet's headroom and slow end."""
    if task[0] == "point":
        return plan_candidate(spec, task[1], task[2])
    if task[0] == "search":
        return plan_candidate(spec, task[1], task[2], headroom=False, slow_end=False, most=task[3])
    return plan_extras(spec, replace(task[1]))


def run_plan(spec: PlanSpec, candidates: Sequence[Candidate], growth: Sequence[float] = (1.0,), workers: int = 0,
             study: Study | None = None, progress: Callable[[int, int], None] | None = None,
             executor: str = "local", address: str | None = None, exhaustive: bool = False) -> PlanResult:
    """Plan every candidate at every traffic growth factor; progress(done, total) as points finish.
    exhaustive: every candidate searched to the end with its headroom and slow end; otherwise the
    bounded search of simulator/plan/search.py (the same recommendation and replica counts)."""
    if executor not in ("local", "ray"):
        raise ValueError(f"executor {executor!r} is not supported; use local or ray")
    points = [(c, g) for c in candidates for g in growth]
    done: dict[int, CandidateResult] = {}
    keys: list[str] = []
    if study is not None:
        digest = plan_digest(spec)  # the workload hashed once for every point
        keys = [point_key(digest, c, g) for c, g in points]
        for i, key in enumerate(keys):
            found = study.get(key)
            if found is not None:
                done[i] = found
    reused = len(done)
    total = len(points)
    with Runner(spec, workers, executor, address) as runner:
        if exhaustive:
            todo = _slowest_first(spec, points, [i for i in range(len(points)) if i not in done])
            if progress is not None:
                progress(len(done), total)

            def finish(k: int, result: CandidateResult) -> None:
                i = todo[k]
                done[i] = result
                if study is not None and not crashed(result):
                    study.put(keys[i], result)  # a crashed point is recomputed on the next run
                if progress is not None:
                    progress(len(done), total)
            runner.run([("point", *points[i]) for i in todo], finish)
        else:
            reused_searches = []

            def run_searches(tasks: list[tuple]) -> list[CandidateResult]:
                """The tasks, each read from the study where an earlier plan ran it (with the same
                cap: its result is exact for it), else run and kept there."""
                parts = [search_part(task) for task in tasks]
                kept = {k: r for k, (task, part) in enumerate(zip(tasks, parts)) if study is not None
                        and (r := study.get(point_key(digest, task[1], task[2], part))) is not None}
                reused_searches.extend(kept)
                todo = [k for k in range(len(tasks)) if k not in kept]

                def keep(j: int, result: CandidateResult) -> None:
                    if study is not None and not crashed(result):
                        study.put(point_key(digest, result.candidate, result.rate_scale, parts[todo[j]]), result)
                ran = dict(zip(todo, runner.run([tasks[k] for k in todo], keep)))
                return [kept[k] if k in kept else ran[k] for k in range(len(tasks))]

            found = search.search(spec, points, run_searches, done,
                                  (lambda n: progress(min(n, total - 1), total)) if progress is not None else None)
            reused += len(reused_searches)
            extras = [i for i in search.shown([found[i] for i in range(total)]) if i not in done]
            for i, result in zip(extras, runner.run([("extras", found[i]) for i in extras])):
                found[i] = result
                if study is not None and not crashed(result):
                    study.put(keys[i], result)  # in full, as an exhaustive plan would find it
            done = found
            if progress is not None:
                progress(total, total)
    return PlanResult([done[i] for i in range(len(points))], reused)


def crashed(result: CandidateResult) -> bool:
    """A point its worker failed on: reported, never kept in a study (the next run computes it)."""
    return (result.reason or "").startswith(WORKER_FAILED)


def search_part(task: tuple) -> str:
    """A search task's part of its point's study key: its cap decides its result."""
    return "search" if task[3] is None else f"search<={task[3]}"


class Runner:
    """Runs a plan's tasks (run_task) in this process (workers <= 0), on local processes or on
    Ray, and returns their results in task order; finish(k, result) as task k ends. A Ray this
    runner started is shut down when it closes."""

    def __init__(self, spec: PlanSpec, workers: int, executor: str, address: str | None) -> None:
        self.spec, self.workers, self.executor, self.address = spec, workers, executor, address
        self._ray = None

    def __enter__(self) -> "Runner":
        if self.executor == "ray":
            self._ray = _start_ray(self.workers, self.address)
        return self

    def __exit__(self, *exc) -> None:
        if self._ray is not None and self._ray[1]:
            self._ray[0].shutdown()

    def run(self, tasks: list[tuple], finish: Callable[[int, CandidateResult], None] | None = None
            ) -> list[CandidateResult]:
        results: dict[int, CandidateResult] = {}

        def finished(k: int, result: CandidateResult) -> None:
            results[k] = result
            if finish is not None:
                finish(k, result)

        def failed(k: int, exc: BaseException) -> CandidateResult:
            task = tasks[k]
            if task[0] == "extras":  # the fleet stands; only its headroom and slow end are missing
                return task[1]
            return CandidateResult(task[1], task[2], feasible=False,
                                   reason=f"{WORKER_FAILED}: {type(exc).__name__}: {exc}")

        if self._ray is not None:
            _run_on_ray(self._ray[0], self.spec, tasks, finished, failed)
        elif self.workers <= 0 or len(tasks) <= 1:
            for k, task in enumerate(tasks):
                finished(k, run_task(self.spec, task))
        else:
            _run_on_processes(self.spec, tasks, list(range(len(tasks))), finished, failed, self.workers)
        return [results[k] for k in range(len(tasks))]


def _run_on_processes(spec: PlanSpec, tasks: list, todo: list[int], finish, failed, workers: int) -> None:
    """The tasks on a local process pool. A worker that dies breaks the pool, and every task it
    still held fails with it, whichever one killed it. So the broken tasks go round again on a
    fresh pool; when a round finishes none of them, they are run one at a time, each in its own
    process, until one dies alone -- the task reported failed -- and the rest go back to a pool."""
    remaining = list(todo)
    while remaining:
        broken = _pool_round(spec, tasks, remaining, finish, failed, workers)
        if len(broken) == len(remaining):
            while broken:
                i = broken.pop(0)
                if _pool_round(spec, tasks, [i], finish, failed, 1):
                    finish(i, failed(i, BrokenProcessPool("its worker process died running this point alone")))
                    break
        remaining = broken


def _pool_round(spec: PlanSpec, tasks: list, todo: list[int], finish, failed, workers: int) -> list[int]:
    """One pool over the tasks, each finished as it completes; returns those the pool lost when
    a worker died (unfinished, in their original order)."""
    broken = []
    with ProcessPoolExecutor(max_workers=min(workers, len(todo))) as pool:
        futures = {pool.submit(run_task, spec, tasks[i]): i for i in todo}
        for future in as_completed(futures):
            i = futures[future]
            try:
                result = future.result()
            except BrokenProcessPool:
                broken.append(i)
                continue
            except Exception as exc:  # noqa: BLE001 -- a crashed point is reported, the sweep goes on
                result = failed(i, exc)
            finish(i, result)
    order = {i: k for k, i in enumerate(todo)}
    return sorted(broken, key=order.__getitem__)


def _slowest_first(spec: PlanSpec, points: list, todo: list[int]) -> list[int]:
    """The order to start points in: least memory bandwidth per replica for the traffic first.
    Those candidates need the most replicas, so the longest searches; started last, one of them
    would keep a single worker busy after the others ran out of points."""
    def capacity(i: int) -> float:
        candidate, growth = points[i]
        try:
            bandwidth = spec.config(candidate, 1).accelerator().memory_bandwidth_gbps or 0.0
        except ValueError:  # a bad candidate fails fast wherever it runs
            return 0.0
        return bandwidth * candidate.tp * candidate.pp * candidate.cp / growth
    return sorted(todo, key=capacity)


def _start_ray(workers: int, address: str | None):
    """(the ray module, whether this call started it): Ray at address, or a local instance."""
    try:
        import ray
    except ImportError:
        raise ValueError("the ray executor needs ray: pip install 'ray>=2.9'") from None
    started = not ray.is_initialized()
    if started:
        try:
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ValueError(f"could not reach Ray at {address or 'a new local instance'}: {exc}") from None
    return ray, started


def _run_on_ray(ray, spec: PlanSpec, tasks: list, finish, failed) -> None:
    """The tasks on Ray, finished as they complete."""
    remote = ray.remote(run_task)
    spec_ref = ray.put(spec)
    pending = {remote.remote(spec_ref, task): k for k, task in enumerate(tasks)}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        k = pending.pop(ready[0])
        try:
            result = ray.get(ready[0])
        except Exception as exc:  # noqa: BLE001 -- a crashed point is reported, the sweep goes on
            result = failed(k, exc)
        finish(k, result)
