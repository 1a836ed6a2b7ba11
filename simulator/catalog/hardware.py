"""The accelerator catalog (hardware.yaml) and users' own hardware files."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.policy.dtypes import canonical_dtype

CATALOG_FILE = Path(__file__).with_name("hardware.yaml")
GB = 1e9  # the catalog's memory sizes are decimal GB
GIB = 2**30  # what CUDA reports


class Accelerator(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    vendor: str
    memory_gb: float | None = Field(default=None, gt=0)
    # The total CUDA reports (torch.cuda.mem_get_info), GiB: what a serving engine's
    # gpu_memory_utilization is a share of. None: memory_gb.
    visible_memory_gib: float | None = Field(default=None, gt=0)
    memory_bandwidth_gbps: float | None = Field(default=None, gt=0)
    peak_tflops: dict[str, float | None] = Field(default_factory=dict)
    interconnect_gbps: float | None = Field(default=None, gt=0)
    link: Literal["nvlink", "pcie"] | None = None  # how the node's GPUs reach each other (hardware.yaml)
    host_link_gbps: float | None = Field(default=None, gt=0)  # each GPU's link to host memory, one direction
    power_w: float | None = Field(default=None, gt=0)
    price_per_hour_usd: float | None = Field(default=None, ge=0)
    price_source: str | None = None
    sources: list[str] = Field(default_factory=list)
    notes: str | None = None
    # A local device whose peaks come from a profile rather than a datasheet.
    profiled: bool = False

    @field_validator("peak_tflops")
    @classmethod
    def _known_dtypes(cls, value: dict[str, float | None]) -> dict[str, float | None]:
        out = {}
        for dtype, peak in value.items():
            if peak is not None and (not math.isfinite(peak) or peak <= 0):
                raise ValueError(f"peak for {dtype} must be a positive number, got {peak}")
            out[canonical_dtype(dtype)] = peak
        return out

    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s for the dtype; ValueError when the accelerator lacks it."""
        peak = self.peak_tflops.get(canonical_dtype(dtype))
        if peak is None:
            raise ValueError(f"{self.id} has no {canonical_dtype(dtype)} peak in the catalog "
                             f"(unsupported or unpublished): pick another dtype or add it in a hardware file")
        return peak * 1e12

    @property
    def memory_bandwidth(self) -> float:
        if self.memory_bandwidth_gbps is None:
            raise ValueError(f"{self.id} has no memory bandwidth in the catalog: add it in a hardware file")
        return self.memory_bandwidth_gbps * 1e9


def load_hardware(extra_file: str | Path | None = None) -> dict[str, Accelerator]:
    """The catalog, with entries from a user's YAML file added (or replacing same-id entries)."""
    catalog = _read(CATALOG_FILE)
    if extra_file is not None:
        catalog.update(_read(Path(extra_file)))
    return catalog


def get_accelerator(hardware_id: str, extra_file: str | Path | None = None) -> Accelerator:
    catalog = load_hardware(extra_file)
    try:
        return catalog[hardware_id]
    except KeyError:
        raise ValueError(f"unknown hardware {hardware_id!r}; known: {', '.join(sorted(catalog))} "
                         "(or add it in a hardware file)") from None


def _read(path: Path) -> dict[str, Accelerator]:
    if not path.is_file():
        raise ValueError(f"no hardware file at {path}")
    stat = path.stat()
    # Every simulation reads the catalog (a plan runs hundreds): parse a file once per version of
    # it. Entries are frozen; the mapping is copied, so a caller adding entries changes no other's.
    return dict(_parsed(str(path.resolve()), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=16)
def _parsed(path_name: str, mtime_ns: int, size: int) -> dict[str, Accelerator]:
    path = Path(path_name)
    try:
        # libyaml's safe loader where PyYAML has it (ten times faster; every simulation reads the catalog)
        raw = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError as exc:  # one line: the problem and where (the parser's own text spans several)
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{path} is not valid YAML: {problem}{where}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of hardware id -> fields")
    out = {}
    for hardware_id, fields in raw.items():
        if not isinstance(fields, dict):
            raise ValueError(f"{path}: entry {hardware_id!r} must be a mapping of fields")
        try:
            out[str(hardware_id)] = Accelerator(id=str(hardware_id), **fields)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{path}: hardware {hardware_id!r}, field {where}: {first['msg']}") from None
    return out
