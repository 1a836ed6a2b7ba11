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
from dataclasses import dataclass

from simulator.plan.capacity import Candidate, CandidateResult, PlanSpec, pareto_front, plan_candidate, recommend
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

    def pareto(self, rate_scale: float = 1.0) -> list[CandidateResult]:
        return pareto_front(self.at(rate_scale))


def run_plan(spec: PlanSpec, candidates: Sequence[Candidate], growth: Sequence[float] = (1.0,), workers: int = 0,
             study: Study | None = None, progress: Callable[[int, int], None] | None = None,
             executor: str = "local", address: str | None = None) -> PlanResult:
    """Plan every candidate at every traffic growth factor; progress(done, total) as points finish."""
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
    todo = _slowest_first(spec, points, [i for i in range(len(points)) if i not in done])
    if progress is not None:
        progress(len(done), len(points))

    def finish(i: int, result: CandidateResult) -> None:
        done[i] = result
        crashed = (result.reason or "").startswith(WORKER_FAILED)
        if study is not None and not crashed:  # a crashed point is recomputed on the next run
            study.put(keys[i], result)
        if progress is not None:
            progress(len(done), len(points))

    def failed(i: int, exc: BaseException) -> CandidateResult:
        c, g = points[i]
        return CandidateResult(c, g, feasible=False, reason=f"{WORKER_FAILED}: {type(exc).__name__}: {exc}")

    if executor == "ray":
        _run_on_ray(spec, points, todo, finish, failed, workers, address)
    elif workers <= 0:
        for i in todo:
            finish(i, plan_candidate(spec, *points[i]))
    else:
        _run_on_processes(spec, points, todo, finish, failed, workers)
    return PlanResult([done[i] for i in range(len(points))], reused)


def _run_on_processes(spec: PlanSpec, points: list, todo: list[int], finish, failed, workers: int) -> None:
    """The points on a local process pool. A worker that dies breaks the pool, and every point it
    still held fails with it, whichever one killed it. So the broken points go round again on a
    fresh pool; when a round finishes none of them, they are run one at a time, each in its own
    process, until one dies alone -- the point reported failed -- and the rest go back to a pool."""
    remaining = list(todo)
    while remaining:
        broken = _pool_round(spec, points, remaining, finish, failed, workers)
        if len(broken) == len(remaining):
            while broken:
                i = broken.pop(0)
                if _pool_round(spec, points, [i], finish, failed, 1):
                    finish(i, failed(i, BrokenProcessPool("its worker process died running this point alone")))
                    break
        remaining = broken


def _pool_round(spec: PlanSpec, points: list, todo: list[int], finish, failed, workers: int) -> list[int]:
    """One pool over the points, each finished as it completes; returns those the pool lost when
    a worker died (unfinished, in their original order)."""
    broken = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(plan_candidate, spec, *points[i]): i for i in todo}
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


def _run_on_ray(spec: PlanSpec, points: list, todo: list[int], finish, failed, workers: int,
                address: str | None) -> None:
    """The points on Ray, finished as they complete; a Ray this call started is shut down after."""
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
    try:
        remote = ray.remote(plan_candidate)
        spec_ref = ray.put(spec)
        pending = {remote.remote(spec_ref, *points[i]): i for i in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except Exception as exc:  # noqa: BLE001 -- a crashed point is reported, the sweep goes on
                result = failed(i, exc)
            finish(i, result)
    finally:
        if started:
            ray.shutdown()
