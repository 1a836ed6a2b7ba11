"""The plan in words, one wording for the terminal, the HTML report and the app: the question asked,
the SLOs with their units, a trace described, and infeasible candidates grouped by reason."""

from __future__ import annotations

import math
import re

import numpy as np

from app import labels

# SLO metric -> (words, unit, multiplier from seconds)
SLO_WORDS = {"ttft": ("TTFT", "s", 1.0), "tpot": ("TPOT", "ms", 1e3), "itl": ("ITL", "ms", 1e3),
             "e2e": ("E2E", "s", 1.0), "queue": ("queueing", "s", 1.0)}


def either(items) -> str:
    """"a, b or c"."""
    items = [str(i) for i in items]
    return " or ".join(filter(None, [", ".join(items[:-1]), items[-1]])) if items else "nothing"


def slo_metric(key: str) -> str:
    """'ttft_p99' -> 'TTFT p99'."""
    name, _, stat = key.partition("_")
    return f"{SLO_WORDS.get(name, (name.upper(),))[0]} {stat}".strip()


def slo_value(key: str, seconds: float) -> str:
    """A limit or a measured value of an SLO metric in its unit: '2 s', '100 ms'."""
    _, unit, scale = SLO_WORDS.get(key.partition("_")[0], ("", "s", 1.0))
    return f"{seconds * scale:,.4g} {unit}"


def slo_words(slos: dict[str, float]) -> str:
    """{'ttft_p99': 2.0, 'tpot_p99': 0.1} -> 'TTFT p99 ≤ 2 s and TPOT p99 ≤ 100 ms'."""
    return " and ".join(f"{slo_metric(k)} ≤ {slo_value(k, v)}" for k, v in slos.items())


def trace_words(workload, name: str | None = None, nominal_rate: float | None = None) -> str:
    """'400 requests at 8 req/s (ShareGPT lengths)' style: count, rate, where from. nominal_rate:
    the rate the trace was drawn at (a synthetic trace's rate=): said first, the sample's beside it."""
    rate = workload.rate_per_s
    at = f" at {rate:.3g} req/s" if math.isfinite(rate) else " all at once"
    if workload.clients is not None:
        at = f" from {workload.clients.concurrency} closed-loop clients" + (at if math.isfinite(rate) else "")
    notes = [name] if name else []
    if nominal_rate is not None and math.isfinite(nominal_rate) and math.isfinite(rate) \
            and f"{nominal_rate:.3g}" != f"{rate:.3g}":
        at = f" at {nominal_rate:.3g} req/s"
        notes.append(f"{rate:.3g} req/s in this sample")
    return f"{len(workload):,} requests{at}" + (f" ({'; '.join(notes)})" if notes else "")


def nominal_rate(trace: str) -> float | None:
    """The rate a synthetic trace spec asks for (its rate=), None for any other trace."""
    from simulator.workload.synthetic import parse_options, split_spec

    if not trace.startswith("synthetic:"):
        return None
    try:
        options = parse_options([p for p in split_spec(trace[len("synthetic:"):]) if "=" in p], trace)
        return float(options["rate"]) if "rate" in options else None
    except (ValueError, KeyError):
        return None


def length_percentiles(workload) -> str:
    """Prompt and output lengths of a trace: p50 / p90 / p99 tokens."""
    out = []
    for what, values in (("prompt", [r.prompt_tokens for r in workload]), ("output", [r.output_tokens for r in workload])):
        if values:
            p = np.percentile(values, [50, 90, 99])
            out.append(f"{what} p50 {p[0]:,.0f} / p90 {p[1]:,.0f} / p99 {p[2]:,.0f} tokens")
    return "; ".join(out)


def question(model: str, trace: str, hardware, quant, tp, slos: dict[str, float], growth=(1.0,), cp=(1,)) -> str:
    """The plan question in words and units (context-parallel sizes named where any is above 1)."""
    grown = [f"x{g:g}" for g in sorted(growth) if g != 1.0]
    at = ((" at " if 1.0 not in growth else "; also at ") + " and ".join(grown) + " the traffic") if grown else ""
    ranks = f", CP {either(sorted(cp))}" if any(c > 1 for c in cp) else ""
    return (f"Cheapest fleet of {either(hardware)} ({either(quant)} weights, TP {either(sorted(tp))}{ranks}) serving "
            f"{model} for {trace} with {slo_words(slos)}{at}")


def cheapest_first(rows: list[dict]) -> list[dict]:
    """The fleets that meet the SLOs (plan rows), cheapest first, ties as the recommendation breaks
    them (the smaller host KV tier, the smaller CP, then E2E p99); unpriced ones last."""
    return sorted((r for r in rows if r["feasible"]),
                  key=lambda r: (r["usd_per_hour"] is None, r["usd_per_hour"] or 0.0, r.get("kv_offload_gb") or 0.0,
                                 r.get("cp") or 1, r["e2e_p99_s"] or 0.0))


# The deployment choices the plan words compare with the same deployment without them: the label's
# marker of the choice, and its name in words.
VARIANTS = ((" cpu-kv=", "a CPU KV tier"), (" pd=", "prefill/decode disaggregation"),
            (" cp=", "context parallelism"))


def variant_words(rows: list[dict], marker: str, name: str) -> str | None:
    """When a deployment choice pays (plan rows of one traffic level): each candidate with it (its
    label holds the marker) against the same deployment without it, in $/hour. None where no
    candidate had it."""
    def twin(r: dict) -> tuple:
        return re.sub(re.escape(marker) + r"\S+", "", r["candidate"]), r["rate_scale"]
    plain = {twin(r): r for r in rows if marker not in r["candidate"]}
    cheaper, only, same = [], [], []
    for r in rows:
        base = plain.get(twin(r)) if marker in r["candidate"] else None
        if base is None or not r["feasible"] or r["usd_per_hour"] is None:
            continue
        if not base["feasible"]:
            only.append(r["candidate"])
        elif r["usd_per_hour"] < (base["usd_per_hour"] or 0.0):
            cheaper.append(f"{r['candidate']} ({labels.text('usd_per_hour', base['usd_per_hour'] - r['usd_per_hour'])}"
                           f"/hour less: {r['gpus']} GPUs against {base['gpus']})")
        else:
            same.append(r["candidate"])
    if not (cheaper or only or same):
        return None
    parts = ([f"{name} is cheaper on {', '.join(cheaper)}"] if cheaper else []) + \
        ([f"only with {name} do {', '.join(only)} meet the SLOs"] if only else []) + \
        ([f"{name} is no cheaper on {', '.join(same)}"] if same else [])
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def choice_words(rows: list[dict]) -> list[str]:
    """variant_words for every choice the plan had candidates of."""
    return [words for marker, name in VARIANTS if (words := variant_words(rows, marker, name))]


def bounded_name(row: dict) -> str:
    """A bounded-out candidate (plan row) by name, with the replicas it needs at least where more than one."""
    needs = row["replicas_at_least"]
    return f"{row['candidate']} (≥ {needs} replicas)" if needs > 1 else row["candidate"]


def reason_groups(rows: list[dict]) -> list[tuple[str, list[str]]]:
    """Infeasible candidates (plan rows) grouped by reason, the largest group first. A reason that
    names its own accelerator ("a10g has no fp8 tensor cores") is grouped with the same reason on
    other accelerators, and said with all of theirs ("a100-80gb or a10g has no fp8 tensor cores");
    its figures in parentheses (what each candidate missed by) are left out of the grouping."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        own = re.compile(rf"(?<![\w-]){re.escape(str(r.get('hardware', '')))}(?![\w-])")
        reason = own.sub(ACCELERATOR, str(r.get("reason") or "no reason given"))
        reason = re.sub(r" \([^()]*\)$", "", reason).strip()
        groups.setdefault(reason, []).append(r)
    said = [(reason.replace(ACCELERATOR, either(list(dict.fromkeys(str(r.get("hardware")) for r in which)))),
             [r["candidate"] for r in which]) for reason, which in groups.items()]
    return sorted(said, key=lambda kv: -len(kv[1]))


ACCELERATOR = "\x00accelerator\x00"  # where a reason named its own accelerator (reason_groups)


def slo_rows(best: dict, slos: dict[str, float]) -> list[dict]:
    """Each SLO of a planned fleet (a plan row): the metric, its predicted value, its 80 % interval
    and its limit, in the metric's unit, and whether it is met. The one table of an answer."""
    rows = []
    for key, limit in slos.items():
        value = (best.get("slo_measured") or {}).get(key)
        interval = (best.get("intervals") or {}).get(key)
        rows.append({"SLO metric": slo_metric(key),
                     "predicted": slo_value(key, value) if value is not None else "–",
                     "80 % interval": f"{slo_value(key, interval[0])} – {slo_value(key, interval[1])}" if interval
                     else "–",
                     "limit": slo_value(key, limit), "met": "yes" if value is not None and value <= limit else "no"})
    return rows
