"""Workloads the app is given -- the bundled trace, a --trace spec, or an uploaded file --
validated into a Workload or one clear message. No Streamlit here, so it is tested directly."""

from __future__ import annotations

import tempfile
from pathlib import Path

from simulator.workload.load import load_workload
from simulator.workload.requests import Workload, WorkloadError

MAX_UPLOAD_BYTES = 20 * 2**20
UPLOAD_SUFFIXES = (".csv", ".jsonl")


def workload_from_spec(spec: str, seed: int = 0) -> Workload:
    """A --trace spec (file path or synthetic:...) as the CLI reads it; WorkloadError names the problem."""
    return load_workload(spec, seed=seed)


def workload_from_upload(name: str, data: bytes, rate: float | None, seed: int = 0) -> Workload:
    """An uploaded trace: a timed CSV/JSONL as is, or a lengths-only CSV at `rate` requests/s."""
    suffix = Path(name).suffix.lower()
    if suffix not in UPLOAD_SUFFIXES:
        raise WorkloadError(f"{name}: upload a .csv (Azure, Vidur/Splitwise or prompt_tokens,output_tokens) "
                            "or a Mooncake .jsonl file")
    if len(data) > MAX_UPLOAD_BYTES:
        raise WorkloadError(f"{name} is {len(data) / 2**20:.1f} MB; the limit is {MAX_UPLOAD_BYTES // 2**20} MB: "
                            "upload a window of the trace")
    if not data.strip():
        raise WorkloadError(f"{name} is empty")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / Path(name).name
        path.write_bytes(data)
        try:
            try:
                return load_workload(str(path), seed=seed)
            except WorkloadError as exc:
                if "rate" not in str(exc) or rate is None:
                    raise
                return load_workload(f"{path},rate={rate:g}", seed=seed)  # a lengths-only file needs a rate
        except WorkloadError as exc:  # name the file as the user knows it, not the temporary copy
            raise WorkloadError(str(exc).replace(str(path), name)) from None
