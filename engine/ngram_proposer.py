"""Prompt-lookup (n-gram) draft proposals: no draft model. No torch.

The proposal for a request is what followed the most recent earlier occurrence of its longest
matching suffix: try n = ngram_max down to ngram_min, find the last place before the end where the
context's final n tokens occurred, and propose up to k tokens that came after it. Text that repeats
itself (code, quoted prompts, lists) gets long accepted runs; text that does not gets no proposal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NgramProposer:
    ngram_min: int = 1
    ngram_max: int = 4

    def propose(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to k draft tokens to follow token_ids (empty when no suffix recurs)."""
        n_tokens = len(token_ids)
        if k <= 0:
            return []
        for n in range(min(self.ngram_max, n_tokens - 1), self.ngram_min - 1, -1):
            suffix = list(token_ids[n_tokens - n:])
            # The latest earlier occurrence: scan back from the one just before the suffix itself.
            for begin in range(n_tokens - n - 1, -1, -1):
                if token_ids[begin] == suffix[0] and list(token_ids[begin:begin + n]) == suffix:
                    follow = list(token_ids[begin + n:begin + n + k])
                    if follow:
                        return follow
        return []
