"""Fleets whose replicas never interact, simulated in several processes.

Under round-robin routing (the default) replica k of R serves exactly the requests at positions
k, k + R, k + 2R, ... of the trace, whatever the other replicas do: nothing one replica does
changes another. So the replicas can be split into groups -- group g of G holds replicas g, g + G,
g + 2G, ... -- each group simulated in its own process on its own share of the trace (round-robin
within the group hands it to the same replicas), and the groups' records merged into one result.
Every request's timings are those of the one-process run; sums over steps (the time split) may
differ from it in the last bits, being added in another order.

Other routers read every replica's load at each arrival, and a run that may stop early needs all
requests' progress in one place: those run in one process.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable

from simulator.metrics import Recorder
from simulator.run import FleetRecord, FleetSetup, simulate_replicas
from simulator.sim_config import SimConfig
from simulator.step_timer import TimeSplit
from simulator.workload import Workload

POLL_S = 0.05  # how often the parent reads the workers' progress


def count(config: SimConfig, workers: int) -> int:
    """How many groups (processes) a run of this config can use, given `workers`."""
    if config.router != "round_robin" or workers <= 1:
        return 1
    return min(workers, config.replicas)


def group_share(workload: Workload, replicas: int, groups: int, group: int) -> tuple[list[int], list]:
    """Group `group`'s replicas (global indices) and the requests round-robin routing sends them, in order."""
    members = list(range(group, replicas, groups))
    mine = set(members)
    return members, [r for i, r in enumerate(workload.requests) if i % replicas in mine]


def simulate_groups(fleet: FleetSetup, workload: Workload, groups: int,
                    progress: Callable[[int, int], None] | None = None) -> list[FleetRecord]:
    """Each group's record, simulated in forked processes (they inherit the fleet and the trace);
    progress(done, total) as the groups' requests finish."""
    context = multiprocessing.get_context("fork")  # the planner's process pool forks as well
    done = context.Array("q", groups)  # requests finished per group, written by the workers
    total = len(workload)
    workers = []
    records: list[FleetRecord | None] = [None] * groups
    for g in range(groups):
        members, requests = group_share(workload, fleet.config.replicas, groups, g)
        if not requests:  # fewer requests than replicas: this group's replicas stay idle
            records[g] = FleetRecord(Recorder(), TimeSplit(), 0.0, [])
            workers.append((None, None))
            continue
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_simulate_group, args=(fleet, requests, members, done, g, send),
                                  name=f"servecast-replica-group-{g}", daemon=True)
        process.start()
        send.close()  # the worker holds the other end: EOF here once it has gone
        workers.append((process, receive))
    try:
        while any(r is None for r in records):
            for g, (process, receive) in enumerate(workers):
                if records[g] is None and receive.poll(POLL_S / groups):
                    records[g] = _received(receive, process, g)
            if progress is not None:
                progress(min(sum(done[:]), total), total)
    finally:
        for process, receive in workers:
            if process is None:
                continue
            receive.close()
            if process.is_alive():
                process.kill()
            process.join()
    return records


def _received(receive, process, group: int) -> FleetRecord:
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


def _simulate_group(fleet: FleetSetup, requests: list, members: list[int], done, group: int, send) -> None:
    """A worker: simulate one group and send its record (or its error) back."""
    try:
        def on_done(finished: int) -> None:
            done[group] = finished
        record = simulate_replicas(fleet, requests, members, on_done=on_done)
        send.send(("ok", record))
    except BaseException as exc:  # reported to the parent, which raises it
        send.send(("error", (type(exc).__name__, str(exc), traceback.format_exc())))
    finally:
        send.close()
