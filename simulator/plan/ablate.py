"""What each serving technique buys, one on top of the other: static batching with padding, then
continuous batching, paged KV, prefix caching, chunked prefill, speculative decoding, weight
quantization, KV quantization and more tensor parallelism. No torch.

Each rung is the one before it with one change, planned like a plan candidate (the fewest
replicas that meet the SLOs, their GPUs and cost, the p99s the answer rests on:
capacity.plan_candidate) and run once with every request at once on one replica for its peak
throughput. Continuous batching without paging is continuous batching whose KV cache is reserved
whole, max_model_len tokens per request, as servers did before PagedAttention: at most
kv_tokens // max_model_len requests run at once. Before chunked prefill, a step's token budget is
max_model_len (a whole prompt is one step's). The TP every rung runs at is the smallest that
holds the bf16 weights and one request of max_model_len; the last rung doubles it.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace

from simulator.catalog.hardware import get_accelerator
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.plan.capacity import Candidate, CandidateResult, PlanSpec, plan_candidate
from simulator.workload.requests import Workload

TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Rung:
    label: str
    change: str  # what this rung adds to the one before, in words
    knobs: dict  # SimConfig fields beyond the candidate's
    candidate: Candidate


@dataclass(frozen=True)
class RungResult:
    rung: Rung
    plan: CandidateResult
    peak_output_tokens_per_s_per_gpu: float | None  # one replica, every request at once

    def row(self) -> dict:
        p = self.plan
        return {"technique": self.rung.label, "change": self.rung.change, "config": self.rung.candidate.label,
                "peak_output_tok_s_per_gpu": self.peak_output_tokens_per_s_per_gpu, "feasible": p.feasible,
                "reason": p.reason, "replicas": p.replicas, "gpus": p.gpus, "ttft_p99_s": p.ttft_p99_s,
                "tpot_p99_s": p.tpot_p99_s, "usd_per_million_output_tokens": p.usd_per_million_output_tokens}


def base_tp(model: str, hardware: str, knobs: dict) -> int:
    """The smallest TP at which the model's bf16 weights and one max_model_len request fit."""
    get_accelerator(hardware)  # an unknown id is bad input, not a model that does not fit
    for tp in TP_CHOICES:
        try:
            SimConfig(model=model, hardware=hardware, tp=tp, **knobs).check()
            return tp
        except ValueError:
            continue
    raise ValueError(f"{model} does not fit on {max(TP_CHOICES)} x {hardware} in bf16: give another --hardware")


def static_budget(plain: SimConfig, max_len: int) -> int:
    """A static batch prefills its padded prompts in one step: the largest budget (max_len x 2^k)
    whose activations still leave the KV cache room for a batch that fills it."""
    best = max_len
    for k in range(1, 12):
        budget = max_len << k
        try:
            _, _, memory = plain.model_copy(update={"max_num_batched_tokens": budget}).check()
        except ValueError:
            break
        if memory.kv_tokens < budget:
            break
        best = budget
    return best


def weight_quant(hardware: str) -> str:
    """FP8 weights where the accelerator has FP8 tensor cores, else INT8 (weight-only)."""
    return "fp8" if get_accelerator(hardware).peak_tflops.get("fp8") else "int8"


def serving_length(workload: Workload, model_max: int, step: int = 1024) -> int:
    """The max_model_len a server sized for this traffic runs: its longest request rounded up to
    `step` tokens, within the model's context."""
    longest = max((r.prompt_tokens + r.output_tokens for r in workload.requests), default=step)
    return min(model_max, -(-longest // step) * step)


def ladder(model: str, hardware: str, knobs: dict | None = None, speculative: str = "ngram",
           num_speculative_tokens: int = 3, acceptance: float = 0.6, acceptance_preset: str | None = None
           ) -> list[Rung]:
    """The rungs, each the one before plus one technique (knobs: SimConfig fields every rung shares,
    max_model_len among them: what continuous batching without paging reserves per request). A
    published acceptance preset, where given, replaces the assumed rate and sets the drafts."""
    knobs = dict(knobs or {})
    tp = base_tp(model, hardware, knobs)
    plain = SimConfig(model=model, hardware=hardware, tp=tp, **knobs)
    _, _, memory = plain.check()
    max_len = plain.max_model_len or plain.model_spec().max_position_embeddings
    reserved = max(1, memory.kv_tokens // max_len)  # requests whose whole max_model_len fits at once
    # Without chunked prefill a whole prompt is one step's (vLLM's budget was then max_model_len).
    unchunked = dict(enable_chunked_prefill=False,
                     max_num_batched_tokens=max(max_len, plain.max_num_batched_tokens or 0))
    off = dict(enable_prefix_caching=False, **unchunked)
    base = Candidate(hardware, tp=tp)
    if acceptance_preset is None:
        spec = replace(base, speculative=speculative, num_speculative_tokens=num_speculative_tokens,
                       acceptance=acceptance)
        speculated, words = dict(knobs), f"{num_speculative_tokens} drafts, acceptance {acceptance:g} (assumed)"
    else:
        from simulator.catalog.acceptance import preset

        published = preset(acceptance_preset)
        spec = replace(base, speculative=speculative, num_speculative_tokens=published.drafts)
        speculated = {**knobs, "acceptance_preset": acceptance_preset}
        words = f"{published.drafts} drafts, {published.method} acceptance of {published.source} (mean {published.tau:g})"
    quant = weight_quant(hardware)
    wider = next((t for t in TP_CHOICES if t > tp), tp)
    return [
        Rung("static batching", "batches padded to their longest prompt and output", {**knobs, **off,
             "scheduler": "static", "max_num_batched_tokens": static_budget(plain, max_len)}, base),
        Rung("continuous batching", f"admit at every step; KV reserved whole ({reserved} requests at once)",
             {**knobs, **off, "max_num_seqs": min(reserved, plain.max_num_seqs or reserved)}, base),
        Rung("paged KV", "KV in 16-token blocks, allocated as it grows", {**knobs, **off}, base),
        Rung("prefix caching", "reuse the KV of shared prompt prefixes", {**knobs, **unchunked}, base),
        Rung("chunked prefill", "prompts split to the token budget, beside the decodes", dict(knobs), base),
        Rung("speculative decoding", f"{speculative}, {words}", speculated, spec),
        Rung("weight quantization", f"{quant} weights", speculated, replace(spec, quant=quant)),
        Rung("KV quantization", "fp8 KV cache", {**speculated, "kv_dtype": "fp8"}, replace(spec, quant=quant)),
        Rung("tensor parallelism", f"tp={wider}", {**speculated, "kv_dtype": "fp8"},
             replace(spec, quant=quant, tp=wider)),
    ]


def ladder_for(spec: PlanSpec, hardware: str, **speculation) -> list[Rung]:
    """ladder() for spec's model, trace and shared knobs, at the max_model_len a server sized for the
    trace runs (serving_length; rungs[0].knobs["max_model_len"] says which)."""
    context = SimConfig(model=spec.model, hardware=hardware).model_spec().max_position_embeddings
    knobs = {**spec.knobs, "max_model_len": serving_length(spec.workload, context)}
    return ladder(spec.model, hardware, knobs, **speculation)


def at_once(workload: Workload) -> Workload:
    """The same requests, every one arriving at 0 (what a replica serves flat out)."""
    return Workload(f"{workload.name} at once", [replace(r, arrival_s=0.0) for r in workload.requests],
                    workload.skipped)


def peak_throughput(spec: PlanSpec, rung: Rung) -> float | None:
    """Output tokens per second per GPU of one replica given every request at once."""
    try:
        config = replace_spec(spec, rung).config(rung.candidate, 1)
        summary = simulate(config, at_once(spec.workload)).summary
    except ValueError:
        return None
    return summary.throughput.output_tokens_per_s / config.num_gpus


def replace_spec(spec: PlanSpec, rung: Rung) -> PlanSpec:
    return replace(spec, knobs=rung.knobs)


def plan_rung(spec: PlanSpec, rung: Rung) -> RungResult:
    """One rung planned for spec's traffic and SLOs (its knobs replacing spec's), and its peak throughput."""
    plan = plan_candidate(replace_spec(spec, rung), rung.candidate, headroom=False, slow_end=False)
    return RungResult(rung, plan, peak_throughput(spec, rung))


def ablate(spec: PlanSpec, rungs: list[Rung], progress=None, workers: int = 1) -> list[RungResult]:
    """Every rung's plan_rung, in rung order; in `workers` processes (each rung is a search of its
    own; the first, static batching's large fleets, is the longest, so it is handed out first)."""
    if workers <= 1:
        out = []
        for i, rung in enumerate(rungs):
            out.append(plan_rung(spec, rung))
            if progress is not None:
                progress(i + 1, len(rungs))
        return out
    results: dict[int, RungResult] = {}
    with ProcessPoolExecutor(min(workers, len(rungs))) as pool:
        futures = {pool.submit(plan_rung, spec, rung): i for i, rung in enumerate(rungs)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            if progress is not None:
                progress(len(results), len(rungs))
    return [results[i] for i in range(len(rungs))]
