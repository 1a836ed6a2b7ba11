"""Scheduler policies by name: the step-composition rule of each serving engine a profile names
(simulator/catalog/engines.py "scheduler_policy"). A new policy is one module and one line. No torch."""

from __future__ import annotations

from engine.policy.prefill_first import PrefillFirstScheduler
from engine.policy.scheduler import Scheduler

SCHEDULER_POLICIES: dict[str, type[Scheduler]] = {
    "vllm": Scheduler,  # one token budget: running requests' decodes and chunks first, then admissions
    "prefill-first": PrefillFirstScheduler,  # SGLang: prompts alone whenever one can run, else decodes
}


def scheduler_class(policy: str) -> type[Scheduler]:
    try:
        return SCHEDULER_POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown scheduler policy {policy!r}: use one of {', '.join(SCHEDULER_POLICIES)}") from None
