"""The plan question asked when the user gives nothing else: one set, read by `servecast plan`,
`make run` and the app's Plan page, so each recommends the same fleet for the same defaults."""

from __future__ import annotations

from simulator.workload.requests import BUNDLED_LENGTHS

MODEL = "llama-3.1-8b"
NUM_REQUESTS, RATE = 400, 8.0  # the bundled ShareGPT lengths, Poisson arrivals
SLO = "ttft_p99=2s,tpot_p99=100ms"
QUANT = ("bf16", "fp8")
TP = (1, 2, 4, 8)
PP = (1,)
CP = (1,)
GROWTH = (1.0,)


def trace(num: int = NUM_REQUESTS, rate: float = RATE) -> str:
    return f"synthetic:num={num},lengths={BUNDLED_LENGTHS},rate={rate:g}"


def slo_values() -> dict[str, float]:
    """SLO as the CLI reads it: metric -> limit in seconds."""
    from simulator.fleet.sim_config import parse_slos

    return parse_slos(SLO)


def priced_gpus() -> list[str]:
    """Catalog accelerators with a price (what a fleet can be bought of): the default candidates."""
    from simulator.catalog.hardware import load_hardware

    return [k for k, a in load_hardware().items() if a.price_per_hour_usd is not None and not a.profiled]
