"""The state of one request as the scheduler and block manager see it. No torch."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.policy.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


# slots: the scheduler reads these fields per request per step. eq=False: a request is an identity,
# and list.remove (running.remove) would otherwise compare every field of the requests before it.
@dataclass(slots=True, eq=False)
class Sequence:
    """Tokens, progress and KV blocks of one request.

    Invariant: num_computed_tokens <= len(token_ids); the block table covers every computed token.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_time: float
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # Chained hashes of this sequence's full blocks, computed once and reused across preemptions.
    block_hashes: list[int] = field(default_factory=list)
    # Number of leading blocks of the block table already registered in the prefix cache.
    num_registered_blocks: int = 0
    # Tokens to compute before this admission's prefill ends (the prompt, or prompt + outputs
    # after a preemption by recompute).
    num_prefill_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    # Tokens whose KV came from the prefix cache, summed over admissions (a request re-admitted
    # after preemption may hit its own earlier blocks).
    num_cached_prompt_tokens: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    # Speculative decoding: draft tokens proposed for this request, and how many the target accepted.
    num_draft_tokens: int = 0
    num_accepted_drafts: int = 0

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        self.num_prefill_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None

    def append_token(self, token_id: int, now: float) -> None:
        self.token_ids.append(token_id)
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now
