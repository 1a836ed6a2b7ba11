"""The prompts `servecast replay` sends: a workload's requests as token ids, or as text of the same
lengths through a local tokenizer.

Token ids are the default: the OpenAI completions API takes `prompt` as a list of ints, and vLLM
(and servecast's server) feed them to the model as they are, so each request's length is exact and
requests that share prompt segments share their leading ids exactly (simulator/workload/prompt_ids.py).

Text, for servers that take none: the same ids mapped onto the tokenizer's word tokens (a space and
a word, which text of them encodes back to, one token each: the pre-tokenizer splits at spaces),
decoded, and cut or padded at the end until the text encodes to the trace's length less the
special tokens the server's tokenizer adds (BOS; vLLM's `bench serve` random dataset counts them
so too). Equal ids map to equal words, so shared segments stay shared as text, token for token. A
tokenizer with too few such words (MIN_WORDS; e.g. one whose words decode without their space) gets
the ids decoded as they are, whose text may break characters or merge tokens at the ends of
segments (a prefix cache loses at most the block there) and may not settle on the exact length in
MAX_ROUNDS rounds; the server's reported prompt_tokens says what was served.
"""

from __future__ import annotations

from pathlib import Path

from simulator.workload.prompt_ids import prompt_ids
from simulator.workload.requests import Workload

MAX_ROUNDS = 10
# Fewer word tokens than this (a tokenizer whose words decode without their space): arbitrary ids.
MIN_WORDS = 64


def load_tokenizer(folder: Path):
    """An HF tokenizer from a local folder (nothing is fetched; `servecast serve` and `replay` both
    read --tokenizer with this); ValueError naming the folder otherwise."""
    if not Path(folder).is_dir():
        raise ValueError(f"--tokenizer {folder}: no such folder (give a local HF tokenizer folder)")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:  # transformers' messages run to paragraphs: the kind only
        raise ValueError(f"--tokenizer {folder}: not a tokenizer folder transformers can read offline "
                         f"({exc.__class__.__name__}): give a folder with tokenizer.json or "
                         f"tokenizer_config.json") from None


def token_prompts(workload: Workload, vocab_size: int, seed: int) -> list[list[int]]:
    return [prompt_ids(r, vocab_size, seed) for r in workload]


def text_prompts(workload: Workload, tokenizer, vocab_size: int, seed: int) -> list[str]:
    words = word_tokens(tokenizer, vocab_size)
    special = tokenizer.num_special_tokens_to_add()
    prompts = []
    for ids in token_prompts(workload, vocab_size, seed):
        if len(words) >= MIN_WORDS:  # equal ids map to equal words: shared segments stay shared
            ids = [words[i % len(words)] for i in ids]
        prompts.append(text_of_length(tokenizer, ids, max(1, len(ids) - special)))
    return prompts


def word_tokens(tokenizer, vocab_size: int) -> list[int]:
    """The ids below vocab_size that decode to a space and a word, and that text encodes back to
    them alone: a run of them decodes to text that encodes to the same run (the pre-tokenizer splits
    at each space), where arbitrary ids decode to broken characters and merge across their ends."""
    ids = range(min(vocab_size, len(tokenizer)))
    texts = tokenizer.batch_decode([[i] for i in ids])
    candidates = [(i, t) for i, t in zip(ids, texts) if t[:1] == " " and t[1:].isascii() and t[1:].isalnum()]
    encoded = tokenizer([t for _, t in candidates], add_special_tokens=False)["input_ids"] if candidates else []
    return [i for (i, _), e in zip(candidates, encoded) if e == [i]]


def text_of_length(tokenizer, ids: list[int], length: int) -> str:
    """Text from ids that the tokenizer encodes (without special tokens) to `length` tokens: decoded
    and re-encoded, ids dropped from the end or the ids' first ones added there by the difference,
    until it holds (at most MAX_ROUNDS rounds; then the last try)."""
    ids = ids[:length]
    for _ in range(MAX_ROUNDS):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        excess = len(tokenizer.encode(text, add_special_tokens=False)) - length
        if excess == 0:
            break
        ids = ids[:max(1, len(ids) - excess)] if excess > 0 else ids + ids[:-excess]
    return text
