"""Fleets whose replicas never interact: each replica simulated alone, in one or several processes.

Under round-robin routing (the default) replica k of R serves exactly the requests at positions
k, k + R, k + 2R, ... of the trace, whatever the other replicas do: nothing one replica does
changes another. So each replica is simulated on its own share of the trace, one after another --
a single replica's state stays in the CPU's caches, where R interleaved replicas would not -- and
the replicas are split into groups (group g of G: replicas g, g + G, ...), each group in its own
forked process. Their records merge into one result: every request's timings are those of the
whole fleet simulated together; sums over steps (the time split) may differ from it in the last
bits, being added in another order. Records merge in replica order, so one process or several give
the same summary to the bit.

A run that may stop early once its SLOs are certainly missed (the planner's) simulates its
replicas one by one in one process, where one SloWatch hears of every request. Other routers read
every replica's load at each arrival: those simulate the fleet together (simulator/fleet/run.py).
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable

from simulator.fleet.fleet import FleetRecord, FleetSetup, simulate_replicas
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.slo_watch import SloWatch
from simulator.workload.requests import Workload

POLL_S = 0.05  # how often the parent reads the workers' progress


def applies(config: SimConfig) -> bool:
    """Whether this fleet's replicas never interact (round-robin routing over several replicas)."""
    return config.router == "round_robin" and config.replicas > 1


def share(workload: Workload, replicas: int, replica: int) -> list:
    """The requests round-robin routing sends to `replica`, in arrival order."""
    return workload.requests[replica::replicas]


def simulate_each(fleet: FleetSetup, workload: Workload, members: list[int],
                  on_done: Callable[[int], None] | None = None, watch: SloWatch | None = None) -> list[FleetRecord]:
    """These replicas, each alone on its share, in this process; on_done(requests done so far).
    watch: told of every request, it may stop the run once missing the SLOs is certain (its
    verdicts count requests over a limit out of all of them, in whatever order they come)."""
    records, finished = [], 0
    for replica in members:
        if watch is not None and watch.decided is not None:
            break
        requests = share(workload, fleet.config.replicas, replica)
        if not requests:  # fewer requests than replicas: it stays idle
            continue
        told = (lambda done, base=finished: on_done(base + done)) if on_done is not None else None
        records.append(simulate_replicas(fleet, requests, [replica], on_done=told, watch=watch))
        finished += len(requests)
        if on_done is not None:
            on_done(finished)
    return records


def simulate_groups(fleet: FleetSetup, workload: Workload, workers: int,
                    progress: Callable[[int, int], None] | None = None) -> list[FleetRecord]:
    """Every replica's record, its replicas spread over up to `workers` forked processes (they
    inherit the fleet and the trace); progress(done, total) as requests finish."""
    total, replicas = len(workload), fleet.config.replicas
    groups = max(1, min(workers, replicas))
    if groups == 1:
        return simulate_each(fleet, workload, list(range(replicas)),
                             (lambda done: progress(done, total)) if progress is not None else None)
    context = multiprocessing.get_context("fork")  # the planner's process pool forks as well
    done = context.Array("q", groups)  # requests finished per group, written by the workers
    workers_of = []
    for g in range(groups):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_simulate_group,
                                  args=(fleet, workload, list(range(g, replicas, groups)), done, g, send),
                                  name=f"servecast-replica-group-{g}", daemon=True)
        process.start()
        send.close()  # the worker holds the other end: EOF here once it has gone
        workers_of.append((process, receive))
    records: list[list[FleetRecord] | None] = [None] * groups
    try:
        while any(r is None for r in records):
            for g, (process, receive) in enumerate(workers_of):
                if records[g] is None and receive.poll(POLL_S / groups):
                    records[g] = _received(receive, process, g)
            if progress is not None:
                progress(min(sum(done[:]), total), total)
    finally:
        for process, receive in workers_of:
            receive.close()
            if process.is_alive():
                process.kill()
            process.join()
    return [r for group in records for r in group]


def _received(receive, process, group: int) -> list[FleetRecord]:
    try:
        outcome, payload = receive.recv()
    except EOFError:  # it died before sending anything
        process.join(timeout=5)
        raise RuntimeError(f"the process simulating replica group {group} died (exit code {process.exitcode}); "
                           "rerun with workers=1 to see why") from None
    if outcome == "error":
        kind, message, trace = payload
        if kind == "ValueError":  # bad input found late: the same error as in one process
            raise ValueError(message)
        raise RuntimeError(f"simulating replica group {group} failed: {kind}: {message}\n{trace}")
    return payload


def _simulate_group(fleet: FleetSetup, workload: Workload, members: list[int], done, group: int, send) -> None:
    """A worker: simulate one group's replicas and send their records (or the error) back."""
    try:
        def on_done(finished: int) -> None:
            done[group] = finished
        send.send(("ok", simulate_each(fleet, workload, members, on_done)))
    except BaseException as exc:  # reported to the parent, which raises it
        send.send(("error", (type(exc).__name__, str(exc), traceback.format_exc())))
    finally:
        send.close()
