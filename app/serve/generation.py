"""One request's engine outputs turned into what the client sees: text deltas, stop strings, the
finish reason and usage.

Stop strings: text is held back while it could be the start of a stop string, so a stop string
split across tokens is still caught and never reaches the client; when one appears the text ends
before it, the finish reason is "stop", and the caller aborts the engine request (its blocks go
back to the pool at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.serve.tokenizers import TextStream, Tokenizer

if TYPE_CHECKING:
    from engine.outputs import RequestOutput


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: list[int]
    finish_reason: str | None  # None while running


class Generation:
    def __init__(self, tokenizer: Tokenizer, stop: list[str], prompt_tokens: int) -> None:
        self.stream = TextStream(tokenizer)
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.prompt_tokens = prompt_tokens
        self.sent = 0  # characters of stream.text sent
        self.num_tokens = 0
        self.cached_prompt_tokens = 0  # prompt tokens found in the prefix cache (the latest output's)
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return self.stream.text[:self.sent]

    def add(self, out: "RequestOutput") -> Delta:
        """The delta for the client from an engine output (after a finish: empty)."""
        if self.finish_reason is not None:
            return Delta("", [], self.finish_reason)
        new = out.output_token_ids[self.num_tokens:]
        self.num_tokens = len(out.output_token_ids)
        self.cached_prompt_tokens = out.num_cached_prompt_tokens
        self.stream.add(new)
        if out.finished:
            self.stream.flush()
        text = self.stream.text
        for s in self.stop:
            at = text.find(s, max(0, self.sent - len(s) + 1))
            if at != -1:
                self.finish_reason = "stop"
                text = text[:at]
        if self.finish_reason is None and out.finished:
            self.finish_reason = "stop" if out.finish_reason == "stop" else "length"
        end = len(text) if self.finish_reason is not None else max(self.sent, len(text) - self.hold)
        delta = text[self.sent:end]
        self.sent = end
        return Delta(delta, new, self.finish_reason)

    def usage(self) -> dict:
        """OpenAI's usage, with the prompt tokens served from the prefix cache where vLLM reports them
        (--enable-prompt-tokens-details)."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.num_tokens,
                "total_tokens": self.prompt_tokens + self.num_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_prompt_tokens}}
