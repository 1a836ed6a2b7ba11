"""The candidate grid: every combination of the deployment choices a plan compares. No torch.

One builder for `servecast plan` and the app's plan page, so both plan the same candidates in the
same order: accelerator, then weight precision, TP, PP, CP, speculation, expert placement,
prefill/decode disaggregation and the host KV tier, the last varying fastest. Expert parallelism
only differs from TP over more than one rank, so an expert-parallel candidate at TP 1 is left out;
context parallelism is simulated without pipeline parallelism, so CP > 1 at PP > 1 is left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simulator.plan.capacity import Candidate


def candidate_grid(hardware: Sequence[str], quant: Sequence[str] = ("bf16",), tp: Sequence[int] = (1,),
                   pp: Sequence[int] = (1,), speculation: Sequence[Mapping] = ({},),
                   expert_parallel: Sequence[bool] = (False,), kv_offload_gb: Sequence[float] = (0.0,),
                   disaggregate: Sequence[str | None] = (None,), cp: Sequence[int] = (1,)) -> list[Candidate]:
    """The candidates of every combination; `speculation` holds Candidate fields per option
    ({} for none, e.g. {"speculative": "ngram", "num_speculative_tokens": 4, "acceptance": 0.6});
    kv_offload_gb: host-tier sizes per replica (0: none); disaggregate: P:D ratios (None: co-located);
    cp: context-parallel sizes. Speculation is not combined with disaggregation (not simulated
    together)."""
    return [Candidate(h, q, t, p, **o, expert_parallel=e, disaggregate=d, kv_offload_gb=g, cp=c) for h in hardware
            for q in quant for t in tp for p in pp for c in cp if c == 1 or p == 1 for o in speculation
            for e in expert_parallel if not e or t > 1 for d in disaggregate if not (d and o) for g in kv_offload_gb]
