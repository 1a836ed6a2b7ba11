"""Text <-> token ids for the server: a local HF tokenizer folder, or bytes.

Nothing is fetched from a hub: a folder is read with local_files_only. Without a folder the
tokenizer is byte-level (id b is byte b, as the trained spec pair's models read text); ids past
255 (a random-weight model's vocabulary is larger) decode as "<|id|>" so no token is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    name: str
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat_prompt(self, messages: list[dict]) -> list[int]: ...


def plain_chat_text(messages: list[dict]) -> str:
    """The documented template for a tokenizer without one: each message as "<|role|>\\n" then its
    content and a newline, then "<|assistant|>\\n" for the reply."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


class ByteTokenizer:
    name = "bytes"
    eos_token_ids: tuple[int, ...] = ()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        out, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            out.append(f"<|{i}|>")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        return self.encode(plain_chat_text(messages))


class HFTokenizer:
    def __init__(self, folder: Path) -> None:
        from calibrate.runs.prompts import load_tokenizer as load_hf

        self._tok = load_hf(folder)
        self.name = str(folder)
        eos = self._tok.eos_token_id
        self.eos_token_ids = () if eos is None else (int(eos),)

    def __len__(self) -> int:
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        if self._tok.chat_template:
            ids = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in newer transformers
        return self.encode(plain_chat_text(messages))


def load_tokenizer(folder: Path | None) -> Tokenizer:
    return ByteTokenizer() if folder is None else HFTokenizer(folder)


class TextStream:
    """Incremental detokenization (vLLM's and TGI's offsets): text is emitted once the tokens since
    the last emission decode to more than they did and do not end inside a UTF-8 sequence, so
    multi-byte characters and merges across tokens come out whole."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = self.read_offset = 0
        self.text = ""

    def add(self, new_ids: Sequence[int]) -> str:
        self.ids.extend(new_ids)
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix_offset:self.read_offset])
        after = decode(self.ids[self.prefix_offset:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        delta = after[len(before):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """What is held back at the end (a trailing partial character decodes as U+FFFD)."""
        rest = self.tokenizer.decode(self.ids[self.read_offset:]) if self.read_offset < len(self.ids) else ""
        self.read_offset = len(self.ids)
        self.text += rest
        return rest
