"""The small types a step's cost is described in: a chunk of a step, a prediction, a step's cost
broken down by operator, a measured step. No torch."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from simulator.catalog.engines import EngineProfile
from simulator.catalog.hardware import Accelerator
from simulator.catalog.models import ModelSpec

# From the most to the least direct source of a time; a sum reports its least direct part.
PROVENANCES = ("measured", "interpolated", "fitted", "extrapolated")


@dataclass(frozen=True)
class Prediction:
    time_s: float
    provenance: str
    expected_error: float  # relative (0.1 = 10%)


@dataclass(frozen=True)
class Chunk:
    """One request's share of a step: num_tokens new tokens on top of a context of context_len
    tokens (context_len includes the new ones)."""

    num_tokens: int
    context_len: int
    samples: bool = True
    # A speculative verification chunk (the last token and its drafts): attended with the other
    # verification chunks in one batch, like decodes, not as a prefill of its own.
    verify: bool = False


@dataclass(frozen=True)
class StepObservation:
    """One measured step: its chunks on a model, and the time of its forward (without the
    scheduler's own overhead, which step_overhead covers)."""

    chunks: Sequence[Chunk]
    model: ModelSpec
    dtype: str
    block_size: int | None
    forward_s: float
    # Tokens of the step just before it, when it followed one without idling (SHAPE_CHANGE_TERMS);
    # None: unknown, after idle, or repeated back to back as the profile's forwards are.
    previous_tokens: int | None = None


@dataclass
class StepCost:
    total_s: float
    by_operator: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)  # the least direct source used
    expected_error: dict[str, float] = field(default_factory=dict)  # the largest expected error

    def add(self, name: str, prediction: Prediction, count: float = 1.0) -> None:
        self.by_operator[name] = self.by_operator.get(name, 0.0) + prediction.time_s * count
        worst = max(self.provenance.get(name, "measured"), prediction.provenance, key=PROVENANCES.index)
        self.provenance[name] = worst
        self.expected_error[name] = max(self.expected_error.get(name, 0.0), prediction.expected_error)
        self.total_s += prediction.time_s * count


class CostReader(Protocol):
    """What operator builders and step strategies read of a cost model (simulator/cost/model.py's
    CostModel is the one implementation): they depend on this, not on the class, so no import of
    theirs closes a circle through model.py."""

    accelerator: Accelerator
    errors: dict
    collective: dict[str, float]
    framework: dict[str, float]
    engine: EngineProfile | None
    scales: dict[str, float]
    pads_decodes: bool

    @property
    def unvalidated_error(self) -> float: ...

    def source(self, kind: str, shape: tuple) -> Any: ...

    def series(self, key: tuple) -> Any: ...

    def series_keys(self) -> Iterable[tuple]: ...

    def modeled(self, curve_name: str, dtype: str, work: Callable[[int], tuple[float, float]],
                provenance: str | None = None, expected_error: float | None = None,
                family: str | None = None) -> Any: ...

    def predict(self, kind: str, *args, **params) -> Prediction: ...

    def graph_tokens(self, tokens: int) -> int: ...
