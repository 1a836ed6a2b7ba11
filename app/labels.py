"""How the plan's and the simulator's figures are named for people: one label with its unit per
field, and the formatting that never prints None. The terminal, the HTML report and the app use these."""

from __future__ import annotations

import math

# field -> (label with unit, multiplier from the stored unit, format)
FIELDS: dict[str, tuple[str, float, str]] = {
    "candidate": ("Deployment", 1.0, "{}"),
    "hardware": ("Accelerator", 1.0, "{}"),
    "quant": ("Weights", 1.0, "{}"),
    "tp": ("TP", 1.0, "{:d}"),
    "pp": ("PP", 1.0, "{:d}"),
    "cp": ("CP", 1.0, "{:d}"),
    "rate_scale": ("Traffic (x trace)", 1.0, "x{:g}"),
    "feasible": ("Meets SLOs", 1.0, "{}"),
    "replicas": ("Replicas", 1.0, "{:d}"),
    "replicas_slow_end": ("Replicas at slow end", 1.0, "{:d}"),
    "gpus": ("GPUs", 1.0, "{:d}"),
    "usd_per_hour": ("$ / hour", 1.0, "${:,.2f}"),
    "usd_per_million_output_tokens": ("$ / M output tokens", 1.0, "${:,.3f}"),
    "ttft_p99_s": ("TTFT p99 (ms)", 1e3, "{:,.0f}"),
    "tpot_p99_s": ("TPOT p99 (ms)", 1e3, "{:,.1f}"),
    "e2e_p99_s": ("E2E p99 (s)", 1.0, "{:,.2f}"),
    "headroom": ("Headroom (x traffic)", 1.0, "x{:.2f}"),
    "reason": ("Why not", 1.0, "{}"),
    "simulations": ("Simulations", 1.0, "{:d}"),
    "technique": ("Technique", 1.0, "{}"),
    "change": ("Adds", 1.0, "{}"),
    "config": ("Config", 1.0, "{}"),
    "peak_output_tok_s_per_gpu": ("Peak output tok/s per GPU", 1.0, "{:,.0f}"),
}
MISSING = "–"


def label(field: str) -> str:
    return FIELDS.get(field, (field.replace("_", " "), 1.0, "{}"))[0]


def value(field: str, raw):
    """The value in the label's unit (a number stays a number, for sorting); None stays None."""
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return None
    scale = FIELDS.get(field, ("", 1.0, ""))[1]
    return raw * scale if scale != 1.0 and isinstance(raw, (int, float)) and not isinstance(raw, bool) else raw


def text(field: str, raw) -> str:
    """The value as shown: in the label's unit, formatted; a dash where there is none."""
    v = value(field, raw)
    if v is None:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    fmt = FIELDS.get(field, ("", 1.0, "{}"))[2]
    try:
        return fmt.format(int(v) if "d}" in fmt else v)
    except (ValueError, TypeError):
        return str(v)


def parallelism(summary) -> str:
    """A simulated replica's parallelism: 'tp=2, pp=1', with ', cp=4' under context parallelism."""
    return f"tp={summary.tp}, pp={summary.pp}" + (f", cp={summary.cp}" if summary.cp > 1 else "")


def context_parallel_words(summary) -> str | None:
    """Context parallelism in words (None without it): the ranks, the KV tokens they hold, and the
    step time their communication (ring attention's exposed wait, decode gathers) took."""
    if summary.cp <= 1:
        return None
    split = summary.time_split_s
    share = split.communication / split.step_time_total if split.step_time_total else 0.0
    return (f"Context parallelism: {summary.cp} ranks of TP {summary.tp} per replica hold "
            f"{summary.memory.kv_tokens:,} KV tokens; communication (ring attention's exposed wait, the decode "
            f"queries' gathers) took {split.communication:,.2f} s, {share:.1%} of step time.")


def cache_words(summary) -> str:
    """The prefix cache in words: its hits, and what a CPU KV tier served and cost."""
    words = f"Prefix cache: {summary.prefix_cache_hit_rate:.1%} of prompt tokens were hits"
    tier = summary.kv_offload
    if tier is not None:
        words += (f", {tier.hit_rate:.1%} of prompt tokens from the {tier.capacity_gb:g} GB CPU KV tier per "
                  f"replica ({tier.loaded_gb:,.1f} GB loaded over PCIe in {tier.load_s:,.2f} s of step time, "
                  f"{tier.offloaded_blocks:,} blocks offloaded)")
    return words + "."


def pool_words(summary) -> str:
    """A disaggregated fleet's pools and KV transfers in words."""
    d = summary.disaggregation
    pools = "; ".join(f"{name} pool {p.replicas} x {p.hardware} ({p.quant}, TP {p.tp}"
                      + (f", CP {p.cp}" if p.cp > 1 else "") + f") busy {p.busy_fraction:.0%}"
                      for name, p in (("prefill", d.prefill), ("decode", d.decode)))
    t = d.transfer
    moved = (f"{t.count:,} KV transfers at {t.link_gbps:g} GB/s: {t.mean_s * 1e3:,.1f} ms on average "
             f"({t.p99_s * 1e3:,.1f} ms p99), {t.wait_mean_s * 1e3:,.2f} ms waiting for the link"
             if t.count else "no KV transfers (every request ended at its prefill)")
    return f"Disaggregated: {pools}; {moved}."

