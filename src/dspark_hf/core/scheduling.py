"""Which prefix of a draft block is worth sending to the target, and whether to draft at all.

A schedule may depend on c_1..c_k (computed from x_{<k}) when it decides about
x_k, never on x_k itself or on later tokens; otherwise the output distribution
shifts (the paper's Appendix A). Cutting at the first low confidence obeys that
rule, and so does the cost-aware walk below: its decision about x_j reads c_1..c_j
and the cost table only. Deciding whether to draft from past rounds obeys it trivially.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Optional, Sequence

from transformers import GenerationConfig

from .config import DSparkConfig

# With the threshold scheduler, verify the whole block unless told otherwise: it maximises
# tau, and it is the paper's "scheduler off" setting.
DEFAULT_CONFIDENCE_THRESHOLD = 0.0

# The names `generation_config.dspark_scheduler` accepts. "auto" (the default) profiles this
# device once and picks "cost" where verifying a whole block costs much more than one token
# (a CPU), "threshold" where it does not (a GPU).
AUTO_SCHEDULER, THRESHOLD_SCHEDULER, COST_SCHEDULER = "auto", "threshold", "cost"
SCHEDULERS = (AUTO_SCHEDULER, THRESHOLD_SCHEDULER, COST_SCHEDULER)
DEFAULT_SCHEDULER = AUTO_SCHEDULER
# "auto" picks the cost scheduler when T_verify(whole block) / T_verify(1) is above this.
AUTO_COST_RATIO = 1.25


# Hybrid drafting: each round may propose an n-gram continuation from the context instead of the DSpark block.
DEFAULT_NGRAM = True

# The scheduler choices the tools offer (bench, calibrate, the demo), as generate() kwargs. "full block"
# sends every draft the drafter makes and no n-gram rounds: how a drafter's tau is defined.
FULL_BLOCK = "full block"
SCHEDULER_PRESETS = {
    AUTO_SCHEDULER: {"dspark_scheduler": AUTO_SCHEDULER},
    THRESHOLD_SCHEDULER: {"dspark_scheduler": THRESHOLD_SCHEDULER},
    COST_SCHEDULER: {"dspark_scheduler": COST_SCHEDULER},
    FULL_BLOCK: {"dspark_scheduler": THRESHOLD_SCHEDULER, "assistant_confidence_threshold": 0.0, "dspark_ngram": False},
}


def default_generation_config(config: DSparkConfig) -> GenerationConfig:
    """The drafter's own defaults for the scheduler fields, used when generate() does not set them."""
    return GenerationConfig(
        assistant_confidence_threshold=DEFAULT_CONFIDENCE_THRESHOLD,
        num_assistant_tokens=config.num_draft_tokens,
        dspark_scheduler=DEFAULT_SCHEDULER,
        dspark_ngram=DEFAULT_NGRAM,
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

    def rate(self, expected: float, num_verified: int, drafted: bool = False) -> float:
        """Tokens per second of a round that commits `expected` tokens for T_verify(1 + num_verified), plus T_draft
        when it `drafted`: the one measure every choice of a length or a source compares."""
        return expected / ((self.draft_seconds if drafted else 0.0) + self.verify(1 + num_verified))

    def prefers_cost_scheduler(self, num_draft_tokens: int) -> bool:
        """What "auto" decides: is verifying a whole block much dearer than one token here?"""
        longest = min(num_draft_tokens + 1, len(self.verify_seconds))
        return self.verify(longest) / self.verify(1) > AUTO_COST_RATIO

    def to_dict(self) -> dict:
        return {"draft_seconds": self.draft_seconds, "verify_seconds": list(self.verify_seconds)}


def threshold_length(confidences: Optional[Sequence[float]], threshold: float, num_drafted: int, cap: int) -> int:
    """Number of leading draft tokens to verify: stop before the first c_k < threshold, at most `cap`."""
    limit = max(0, min(num_drafted, cap))
    if confidences is None or threshold <= 0:
        return limit
    return next((k for k in range(limit) if confidences[k] < threshold), limit)


def geometric_expected(alpha: float, length: int) -> float:
    """1 + alpha + ... + alpha^length: tokens a round commits if each of `length` proposed tokens survives w.p. alpha."""
    return sum(alpha**j for j in range(length + 1))


def best_geometric_length(alpha: float, costs: CostTable, cap: int, drafted: bool = False) -> tuple[int, float]:
    """(l, rate): the proposal length l <= cap that commits most tokens per second if each survives with chance alpha.

    A round sending l tokens commits 1 + alpha + ... + alpha^l tokens (l = 0 is one plain step).
    Both sources of hybrid drafting are weighed with it: the n-gram source with its running
    acceptance for the match length (no draft pass), DSpark with its first confidence, the one
    known before any draft token is drawn, plus its draft pass (`drafted`).
    """
    cap = max(0, min(cap, len(costs.verify_seconds) - 1))
    best_length, best_rate = 0, costs.rate(1.0, 0, drafted)
    expected, chance = 1.0, 1.0
    for length in range(1, cap + 1):
        chance *= alpha
        expected += chance  # geometric_expected(alpha, length)
        rate = costs.rate(expected, length, drafted)
        if rate > best_rate:
            best_length, best_rate = length, rate
    return best_length, best_rate


def block_may_win(costs: CostTable, budget: int, ngram_length: int, ngram_expected: float) -> bool:
    """Whether a DSpark block that survives whole could beat an n-gram proposal of `ngram_length` tokens
    sent without a draft pass; when not, the round skips drafting."""
    _, ceiling = best_geometric_length(1.0, costs, budget, drafted=True)
    return ceiling > costs.rate(ngram_expected, ngram_length)


def ngram_wins(costs: CostTable, budget: int, ngram_length: int, ngram_expected: float, c1: float) -> bool:
    """Whether the n-gram proposal commits more tokens per second than the block drafted beside it, both after
    its draft pass; the block is judged by `c1`, the one confidence known before any of its tokens is drawn."""
    _, block_rate = best_geometric_length(c1, costs, budget, drafted=True)
    return costs.rate(ngram_expected, ngram_length, drafted=True) > block_rate


def cost_aware_length(confidences: Optional[Sequence[float]], costs: CostTable, cap: int) -> int:
    """Algorithm 1 with one request, looking ahead without anticipating.

    With survival a_j = prod_{i<=j} c_i, a round that verifies l tokens commits
    E(l) = 1 + sum_{j<=l} a_j tokens in T_draft + T_verify(1 + l). At position j,
    knowing c_1..c_j, x_j is kept when some length l >= j would beat stopping at j - 1 on
    E/cost, with the confidences after j taken to equal c_j: the real c_{j+1}.. are computed
    from x_j, so reading them here would anticipate. The walk stops at the first j that
    does not pay. Looking ahead matters where costs come in steps: on a CPU, verifying 2
    tokens costs much more than 1, while 3..8 cost barely more than 2. Without confidences
    there is nothing to weigh, and the whole `cap` is verified.
    """
    if confidences is None:
        return cap
    survival, expected = 1.0, 1.0
    for j in range(1, cap + 1):
        stop_rate = costs.rate(expected, j - 1, drafted=True)
        c = float(confidences[j - 1])  # a list here; a tensor from callers outside the round
        best_rate, projected, chance = 0.0, expected, survival
        for length in range(j, cap + 1):  # c_j for position j, and as the estimate of every later one
            chance *= c
            projected += chance
            best_rate = max(best_rate, costs.rate(projected, length, drafted=True))
        if best_rate <= stop_rate:
            return j - 1
        survival *= c
        expected += survival
    return cap


class DraftingGate:
    """Whether the next round should draft at all, judged from past rounds only.

    Drafting pays while recent drafted rounds commit tokens at least as fast as plain
    decoding does. Both are measured on this run's own rounds, so the gate notices when
    the machine gets busier (another process, fewer free cores) and verification slows
    more than a single step does; until a plain step has been seen, the cost table's
    T_verify(1) stands for it. The first round always drafts. While drafting does not
    pay, rounds skip the draft pass, and every `probe_every` skipped rounds one drafts
    anyway, so the gate notices when drafting pays again.
    """

    # A window of 12 drafted rounds: on held-out SmolLM2 rounds, a window of 4 closed the gate after
    # short unlucky runs and lost ~7% of the cost scheduler's speed; 12 loses under 1% and still
    # reacts within a second to a machine that got busier.
    def __init__(self, costs: CostTable, window: int = 12, probe_every: int = 8):
        self.costs = costs
        self.probe_every = probe_every
        self.drafted = collections.deque(maxlen=window)  # (tokens committed, seconds) of drafted rounds
        self.plain = collections.deque(maxlen=window)  # seconds of rounds that skipped drafting (one token each)
        self.skipped_in_a_row = 0

    def plain_seconds(self) -> float:
        return statistics.median(self.plain) if self.plain else self.costs.verify(1)

    def should_draft(self) -> bool:
        if not self.drafted or self.skipped_in_a_row >= self.probe_every:
            return True
        tokens = sum(count for count, _ in self.drafted)
        seconds = sum(spent for _, spent in self.drafted)
        return tokens / seconds >= 1.0 / self.plain_seconds()

    def record(self, drafted: bool, num_committed: int, seconds: float) -> None:
        if drafted:
            self.drafted.append((num_committed, seconds))
            self.skipped_in_a_row = 0
        else:
            self.plain.append(seconds)
            self.skipped_in_a_row += 1
