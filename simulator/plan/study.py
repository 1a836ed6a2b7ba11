"""A plan's finished points on disk (SQLite), so an interrupted sweep resumes without recomputing
them. No torch.

A point is one (plan, candidate, rate scale); its key hashes everything that decides its result:
the model, the workload's requests, the SLOs, the shared knobs (plan_digest), the candidate and the
scale. A point is written when it finishes, so a crash loses only the points in flight.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

from simulator.plan.capacity import Candidate, CandidateResult, PlanSpec


# How a rate is probed (PlanSpec.probe); a point planned another way is not reused.
PROBE_VERSION = 2


def plan_digest(spec: PlanSpec) -> str:
    """A hash of everything a plan shares: model, workload requests, SLOs, knobs, limits, seed."""
    workload = hashlib.sha256()
    for r in spec.workload.requests:
        workload.update(f"{r.arrival_s:.9f},{r.prompt_tokens},{r.output_tokens},{r.segments},{r.segment_tokens};".encode())
    fields = {"model": spec.model, "workload": workload.hexdigest(), "slo": spec.slo, "knobs": spec.knobs,
              "max_replicas": spec.max_replicas, "seed": spec.seed, "min_requests": spec.min_requests,
              "min_duration_s": spec.min_duration_s, "probe": PROBE_VERSION}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def point_key(digest: str, candidate: Candidate, rate_scale: float, part: str | None = None) -> str:
    """One point's key: its plan's digest (plan_digest), the candidate and the rate scale; part
    "search" (or "search<=N", capped at N replicas): its fewest replicas alone, without headroom or
    slow end (simulator/plan/search.py)."""
    fields = {"plan": digest, "candidate": candidate.__dict__, "rate_scale": rate_scale}
    if part is not None:
        fields["part"] = part
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


class Study:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._connect() as db:
                db.execute("CREATE TABLE IF NOT EXISTS points (key TEXT PRIMARY KEY, row TEXT NOT NULL)")
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"study file {self.path} is not a servecast study ({exc}): choose another --study") from None

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path)

    def get(self, key: str) -> CandidateResult | None:
        with self._connect() as db:
            found = db.execute("SELECT row FROM points WHERE key = ?", (key,)).fetchone()
        return CandidateResult.from_row(json.loads(found[0])) if found else None

    def put(self, key: str, result: CandidateResult) -> None:
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO points VALUES (?, ?)", (key, json.dumps(result.row())))

    def __len__(self) -> int:
        with self._connect() as db:
            return db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
