"""Speculative decoding's verification: rejection sampling of draft tokens against the target.

For a request with drafts x_1..x_d and the target's logits at the d + 1 positions they extend,
draft x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)), where p_i is the distribution the
request samples from (engine/sampler.probabilities) and q_i the proposer's (a point mass at x_i for
deterministic proposers such as n-gram lookup). At the first rejection the token is drawn from
norm(max(0, p_i - q_i)); if all d are accepted a bonus token is drawn from p_d. The emitted tokens
are then distributed exactly as sampling the target one token at a time (Leviathan et al., 2023;
Chen et al., 2023). Greedy requests accept drafts while they equal the target's argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.sampler import probabilities
from engine.policy.sampling_params import SamplingParams


def verify(logits: torch.Tensor, drafts: Sequence[int], params: SamplingParams, generator: torch.Generator | None,
           draft_probs: torch.Tensor | None = None) -> tuple[list[int], int]:
    """logits: [len(drafts) + 1, vocab] float32, row i predicting the token after draft i - 1.
    Returns (accepted drafts, the token sampled after them)."""
    if params.greedy:
        targets = logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
            accepted += 1
        return list(drafts[:accepted]), targets[accepted]
    for i, x in enumerate(drafts):
        p = probabilities(logits[i], params)
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        u = torch.rand((), generator=generator, device=logits.device).item()
        if u * q_x < float(p[x]):  # u < min(1, p(x) / q(x)), without dividing by q(x)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[x] = 0.0
        else:
            residual = (p - draft_probs[i]).clamp_min(0.0)
        total = residual.sum()
        if total <= 0:  # only rounding can leave nothing: p and q agree
            residual, total = p, p.sum()
        token = int(torch.multinomial(residual / total, 1, generator=generator).item())
        return list(drafts[:i]), token
    p = probabilities(logits[len(drafts)], params)
    return list(drafts), int(torch.multinomial(p, 1, generator=generator).item())


@dataclass
class SpecStats:
    """Acceptance per draft position over an engine's verification steps.

    acceptance_by_position[i]: of the verifications that proposed an (i + 1)-th draft, the share
    that accepted it (so the first i + 1 drafts). acceptance_by_slot[i]: the same over every
    verification that had an (i + 1)-th draft slot, proposed or not -- what a simulator that fills
    every slot should draw from (an n-gram lookup that finds nothing proposes no draft).
    """

    proposed: list[int] = field(default_factory=list)  # drafts proposed at position i (0-based)
    accepted: list[int] = field(default_factory=list)  # ... and accepted there
    slots: list[int] = field(default_factory=list)  # verifications with a slot at position i
    verifications: int = 0  # request-steps verified with at least one draft
    accepted_tokens: int = 0

    def record(self, num_drafts: int, num_accepted: int, num_slots: int | None = None) -> None:
        num_slots = num_drafts if num_slots is None else max(num_slots, num_drafts)
        for counts in (self.proposed, self.accepted, self.slots):
            counts.extend([0] * (num_slots - len(counts)))
        for i in range(num_slots):
            self.slots[i] += 1
        if num_drafts == 0:
            return
        for i in range(num_drafts):
            self.proposed[i] += 1
            self.accepted[i] += i < num_accepted
        self.verifications += 1
        self.accepted_tokens += num_accepted

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted, self.proposed)]

    @property
    def acceptance_by_slot(self) -> list[float]:
        return [a / n if n else 0.0 for a, n in zip(self.accepted, self.slots)]

    @property
    def mean_accepted_per_verification(self) -> float:
        return self.accepted_tokens / self.verifications if self.verifications else 0.0

    def to_dict(self) -> dict:
        return {"acceptance_by_position": self.acceptance_by_position, "proposed_by_position": list(self.proposed),
                "acceptance_by_slot": self.acceptance_by_slot, "slots_by_position": list(self.slots),
                "verifications": self.verifications,
                "mean_accepted_per_verification": self.mean_accepted_per_verification}


def request_acceptance(outputs) -> list[list[int]]:
    """[drafts proposed, drafts accepted] of every request that was proposed drafts: how much
    acceptance varies between requests (a predictable text accepts nearly all, another few),
    which the pooled per-position rates hide."""
    return [[o.num_draft_tokens, o.num_accepted_drafts] for o in outputs if o.num_draft_tokens]

