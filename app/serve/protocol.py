"""The OpenAI request bodies the server takes, as pydantic models: unknown fields and ill-typed
values are refused (400 naming the field), vLLM's extras (ignore_eos, min_tokens, top_k) taken.

Fields that clients commonly send at their neutral value (echo false, penalties 0, logprobs
null, best_of 1, user) are accepted at that value and refused otherwise, so a load generator's
defaults do not fail while a request for something the engine does not do never passes silently.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: StrictInt | None = Field(None, gt=0)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(-1, ge=-1)
    seed: StrictInt | None = None
    stop: str | list[str] | None = Field(None, validate_default=True)
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = Field(0, ge=0)
    n: Literal[1] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Accepted only at their neutral values (module docstring).
    frequency_penalty: Literal[0, 0.0] = 0.0
    presence_penalty: Literal[0, 0.0] = 0.0
    repetition_penalty: Literal[1, 1.0] = 1.0
    logprobs: Literal[False] | None = None
    best_of: Literal[1] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value):
        if value is None:
            return []
        value = [value] if isinstance(value, str) else value
        if any(not s for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @model_validator(mode="after")
    def _min_below_max(self):
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens})")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    # Text, or token ids; a one-element batch of either is taken too (n=1, one prompt a request).
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    echo: Literal[False] = False
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError(f"takes one prompt a request, got a batch of {len(value)}: send them separately")
            value = value[0]
        if len(value) == 0:
            raise ValueError("the prompt is empty")
        return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str
    name: str | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    # The newer name of max_tokens in the chat API (either may be given, not both).
    max_completion_tokens: StrictInt | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_max(self):
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None:
                raise ValueError("give max_tokens or max_completion_tokens, not both")
            self.max_tokens = self.max_completion_tokens
        return self
