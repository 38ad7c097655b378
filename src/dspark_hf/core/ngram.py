"""The n-gram source of hybrid drafting: prompt lookup over the context, with its own acceptance statistics.

Where the text repeats (a quoted passage, code edited in place, a model that loops), the
continuation of the latest earlier occurrence of the context's last few tokens is a
better guess than any drafter, and costs nothing to make. The proposal is a function of
the context alone, so its q is one-hot and rejection sampling stays exact.

The index lives on the host and grows by the tokens each round commits, which the
generator reads once per round anyway: a lookup is a dictionary access, not a scan.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

# Match lengths tried, longest first: a longer match is more specific and, measured per length, accepted more often.
MAX_MATCH_TOKENS = 4
MIN_MATCH_TOKENS = 1
# How far a proposal may run. On hardware where verifying many tokens costs about one step (bf16 on a CPU with
# native bf16 matmuls, any GPU), a long match -- a loop, a quoted passage -- is worth proposing whole.
MAX_PROPOSAL_TOKENS = 32


@dataclasses.dataclass(frozen=True)
class Match:
    """A proposal: `tokens`, which start at context index `start`, continue the context as they did
    after an earlier occurrence of its last `match_length` tokens."""

    tokens: list[int]
    start: int
    match_length: int


class NgramIndex:
    """For every n-gram (n = MIN..MAX_MATCH_TOKENS) of the context, the end of its latest occurrence."""

    def __init__(self, max_match: int = MAX_MATCH_TOKENS, min_match: int = MIN_MATCH_TOKENS):
        self.max_match, self.min_match = max_match, min_match
        self.tokens: list[int] = []
        self.latest_end: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending at 1..indexed are in the index

    def extend(self, new_tokens: list[int]) -> None:
        self.tokens.extend(new_tokens)

    def _index_up_to(self, end: int) -> None:
        """Index n-grams ending at positions up to `end` (exclusive of later ones), latest occurrence wins."""
        tokens = self.tokens
        for stop in range(self.indexed + 1, end + 1):
            for n in range(self.min_match, min(self.max_match, stop) + 1):
                self.latest_end[tuple(tokens[stop - n : stop])] = stop
        self.indexed = max(self.indexed, end)

    def lookup(self, max_tokens: int) -> Optional[Match]:
        """The continuation (at most `max_tokens`) of the longest context suffix seen earlier, or None."""
        length = len(self.tokens)
        if max_tokens < 1 or length < 2:
            return None
        self._index_up_to(length - 1)  # every earlier occurrence; the suffix itself ends at `length`
        for n in range(min(self.max_match, length - 1), self.min_match - 1, -1):
            end = self.latest_end.get(tuple(self.tokens[length - n :]))
            if end is not None:
                return Match(self.tokens[end : end + max_tokens], end, n)
        return None


class AcceptanceStats:
    """Per-key running acceptance of proposed tokens, modelled as geometric: each survives with chance alpha.

    A round that verified l tokens and kept m adds m survivals and, if m < l, one failure.
    The prior (one survival, one failure) makes an unseen key worth one trial.
    """

    def __init__(self, prior_survivals: float = 1.0, prior_failures: float = 1.0):
        self.prior = (prior_survivals, prior_failures)
        self.counts: dict[int, list[float]] = {}

    def alpha(self, key: int) -> float:
        survivals, failures = self.counts.get(key, self.prior)
        return survivals / (survivals + failures)

    def record(self, key: int, num_verified: int, num_accepted: int) -> None:
        if num_verified <= 0:
            return
        counts = self.counts.setdefault(key, list(self.prior))
        kept = min(num_accepted, num_verified)
        counts[0] += kept
        counts[1] += 1.0 if kept < num_verified else 0.0
