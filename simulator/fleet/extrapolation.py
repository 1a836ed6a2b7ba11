"""What a prediction is extrapolated across: where a configuration lies outside the real runs its
serving-engine profile was fitted on, and how much wider that makes its 80 % intervals. No torch.

An engine profile's intervals come from its cross-validated residuals, which describe runs like
the fitted ones (in-distribution they cover 82-88 %). Runs of other campaigns miss by more, so each
way a configuration differs from the fitted runs widens the interval's spread about its median
residual by that dimension's factor (EngineProfile.extrapolation["widen"]), and the factors of the
dimensions crossed multiply. Every answer says which it crossed. docs/fidelity.md says where each
factor comes from (the engine version's is an assumption: no runs of another version were found).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.catalog.engines import EngineProfile


@dataclass(frozen=True)
class Extrapolation:
    across: tuple[str, ...] = ()  # each dimension crossed, in words
    widen: dict[str, float] = field(default_factory=dict)  # residual metric -> factor on the interval's spread

    def factor(self, metric: str) -> float:
        return self.widen.get(metric, 1.0)


def extrapolation(engine: EngineProfile | None, model: str, hardware: str, tp: int, is_moe: bool) -> Extrapolation:
    """The dimensions a configuration crosses beyond engine's fitted runs, and its widening."""
    if engine is None or not engine.extrapolation:
        return Extrapolation()
    fitted, widen = engine.extrapolation.get("fitted", {}), engine.extrapolation.get("widen", {})
    crossed: list[tuple[str, str]] = []
    if engine.transferred_from:
        crossed.append(("engine", f"{engine.id} (no runs of its own: {engine.transferred_from}'s fitted terms)"))
    if hardware not in fitted.get("devices", ()):
        borrowed, scaled = engine.transfers.get(hardware), engine.scaled_devices.get(hardware)
        crossed.append(("device", f"{hardware} (no runs: {borrowed}'s fitted speeds)" if borrowed else
                        f"{hardware} (no runs: {scaled['from']}'s fitted speeds scaled by published achieved "
                        f"bandwidth and compute)" if scaled else f"{hardware} (no runs: its curves at catalog peaks)"))
        if scaled and not borrowed:  # its own public runs say how far scaled speeds go wrong
            crossed.append(("scaled_device", f"{hardware}'s speeds are scaled, not fitted: bench/closed_loop_check.py "
                                             "has its public runs against them"))
    if model not in fitted.get("models", ()):
        crossed.append(("model", f"{model} (not among the fitted models)"))
    if tp not in fitted.get("tp", ()):
        crossed.append(("tp", f"tp={tp} (fitted at tp {', '.join(map(str, fitted.get('tp', ())))})"))
    if is_moe and not fitted.get("moe", False):
        crossed.append(("moe", "a mixture of experts (fitted on dense models)"))
    factors: dict[str, float] = {}
    for dimension, _ in crossed:
        spec = widen.get(dimension, 1.0)
        for metric in engine.residuals:
            per_metric = spec.get(metric, 1.0) if isinstance(spec, dict) else spec
            factors[metric] = factors.get(metric, 1.0) * max(1.0, float(per_metric))
    return Extrapolation(tuple(words for _, words in crossed), factors)
