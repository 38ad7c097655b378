"""Which prefix of a draft block is worth sending to the target, and whether to draft at all.

A schedule may depend on c_1..c_k (computed from x_{<k}) when it decides about
x_k, never on x_k itself or later tokens; otherwise the output distribution shifts
(the paper's Appendix A). Cutting at the first low confidence obeys that rule, and
so does the cost-aware walk below, because it stops at the first position that
does not pay. Deciding whether to draft from past rounds only obeys it trivially.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional

import torch
from transformers import GenerationConfig

from .config import DSparkConfig

# Verify the whole block unless told otherwise: it maximises tau, it is the paper's
# "scheduler off" setting, and on a GPU verifying 8 tokens costs about as much as 1.
DEFAULT_CONFIDENCE_THRESHOLD = 0.0

# The names `generation_config.dspark_scheduler` accepts.
THRESHOLD_SCHEDULER = "threshold"
COST_SCHEDULER = "cost"
SCHEDULERS = (THRESHOLD_SCHEDULER, COST_SCHEDULER)


def default_generation_config(config: DSparkConfig) -> GenerationConfig:
    """The drafter's own defaults for the scheduler fields, used when generate() does not set them."""
    return GenerationConfig(
        assistant_confidence_threshold=DEFAULT_CONFIDENCE_THRESHOLD,
        num_assistant_tokens=config.num_draft_tokens,
        dspark_scheduler=THRESHOLD_SCHEDULER,
    )


@dataclasses.dataclass(frozen=True)
class CostTable:
    """Seconds per drafting pass and per target forward of n = 1, 2, ... new tokens (see dspark_hf.core.costs)."""

    draft_seconds: float
    verify_seconds: tuple[float, ...]  # verify_seconds[n - 1] = T_verify(n)

    def __post_init__(self):
        object.__setattr__(self, "verify_seconds", tuple(float(s) for s in self.verify_seconds))
        if not self.verify_seconds or min(self.verify_seconds) <= 0 or self.draft_seconds < 0:
            raise ValueError(f"A cost table needs positive verify times and a non-negative draft time; got {self}.")

    def verify(self, num_tokens: int) -> float:
        """T_verify(num_tokens): the target reads the anchor plus num_tokens - 1 draft tokens."""
        return self.verify_seconds[num_tokens - 1]

    def drafted_round(self, num_verified: int) -> float:
        """cost(l) = T_draft + T_verify(1 + l): a round that drafts and sends l tokens to the target."""
        return self.draft_seconds + self.verify(1 + num_verified)

    def to_dict(self) -> dict:
        return {"draft_seconds": self.draft_seconds, "verify_seconds": list(self.verify_seconds)}


def threshold_length(confidences: Optional[torch.Tensor], threshold: float, num_drafted: int, cap: int) -> int:
    """Number of leading draft tokens to verify: stop before the first c_k < threshold, at most `cap`."""
    limit = max(0, min(num_drafted, cap))
    if confidences is None or threshold <= 0:
        return limit
    below = (confidences[:limit] < threshold).nonzero()
    return int(below[0]) if len(below) else limit


def cost_aware_length(confidences: Optional[torch.Tensor], costs: CostTable, cap: int) -> int:
    """Algorithm 1 with one request: verify while expected tokens per second still rise.

    With survival a_j = prod_{i<=j} c_i, a round that verifies l tokens commits
    E(l) = 1 + sum_{j<=l} a_j tokens in cost(l) = T_draft + T_verify(1 + l). Position j
    is added only if E(j)/cost(j) beats E(j-1)/cost(j-1), and the walk ends at the
    first j that does not, so the decision about x_j reads c_1..c_j only. Without
    confidences there is nothing to weigh and the whole `cap` is verified.
    """
    if confidences is None:
        return cap
    survival, expected = 1.0, 1.0
    best_rate = expected / costs.drafted_round(0)
    for j in range(1, cap + 1):
        survival *= float(confidences[j - 1])
        rate = (expected + survival) / costs.drafted_round(j)
        if rate <= best_rate:
            return j - 1
        expected, best_rate = expected + survival, rate
    return cap


class DraftingGate:
    """Whether the next round should draft at all, judged from past rounds only.

    Drafting pays when recent drafted rounds committed at least as many tokens per
    second as plain decoding does (one token per T_verify(1)); the first round
    always drafts. Rounds are priced with the cost table rather than the wall clock
    so the choice is reproducible. While drafting does not pay, rounds skip the
    draft pass; every `probe_every` skipped rounds one round drafts anyway, so the
    gate notices when drafting pays again.
    """

    def __init__(self, costs: CostTable, window: int = 4, probe_every: int = 8):
        self.costs = costs
        self.probe_every = probe_every
        self.recent = collections.deque(maxlen=window)  # (tokens committed, table seconds) of drafted rounds
        self.skipped_in_a_row = 0

    def drafting_rate(self) -> float:
        """Committed tokens per table-second over the recent drafted rounds."""
        return sum(tokens for tokens, _ in self.recent) / sum(seconds for _, seconds in self.recent)

    def should_draft(self) -> bool:
        if not self.recent or self.skipped_in_a_row >= self.probe_every:
            return True
        return self.drafting_rate() >= 1.0 / self.costs.verify(1)

    def record(self, drafted: bool, num_verified: int, num_committed: int) -> None:
        if drafted:
            self.recent.append((num_committed, self.costs.drafted_round(num_verified)))
            self.skipped_in_a_row = 0
        else:
            self.skipped_in_a_row += 1
