"""What happened in each drafting round, and the numbers the paper reports from it."""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Iterable, Optional

# Where a round's proposal came from (RoundRecord.source).
SOURCE_DSPARK = "dspark"  # a prefix of the drafter's block
SOURCE_NGRAM = "ngram"  # the continuation of an earlier occurrence of the context's last tokens
SOURCE_NONE = "none"  # nothing: the round is one plain step

# Why a round sent as many draft tokens as it did (RoundRecord.cut).
CUT_WHOLE = "whole"  # every proposed token
CUT_BUDGET = "budget"  # num_assistant_tokens, or the room left before max_length
CUT_THRESHOLD = "threshold"  # before the first confidence below assistant_confidence_threshold
CUT_COST = "cost"  # where the cost walk found that one more token no longer pays
CUT_GATE = "gate"  # the drafting gate skipped the round: drafting did not pay lately
CUT_NO_DRAFT = "no-draft"  # nothing to propose (no room left, or no source expected to beat one plain step)


@dataclasses.dataclass
class RoundRecord:
    """One drafting round of one generate() call: what was proposed, what the scheduler sent, what survived."""

    position: int  # index of the round's anchor token in the sequence
    source: str  # one of the SOURCE_* names above
    draft_ids: list[int]  # the whole proposal before scheduling (the DSpark block, or the n-gram continuation)
    confidences: list[float]  # raw c_k per proposed token (DSpark rounds with a confidence head); else empty
    calibrated: list[float]  # c_k as the scheduler read them (STS applied); else empty
    budget: int  # the most draft tokens this round's source could send (DSpark: its cap; n-gram: its longest)
    num_verified: int  # draft tokens sent to the target
    cut: str  # why num_verified stops where it does: one of the CUT_* names above
    # draft tokens the target kept, as transformers counts them: when EOS or max_length cuts a round,
    # the last committed token counts as the round's target token even if it was drafted
    num_accepted: int
    committed_ids: list[int]  # tokens appended this round (accepted drafts + correction/bonus)
    draft_seconds: float
    verify_seconds: float
    match_length: int = 0  # n-gram rounds: how many trailing context tokens the match covered


_FILLING = threading.Lock()


class PendingRecord(RoundRecord):
    """A RoundRecord filled from its round's device tensors when a field is first read, not inside the round.

    Handing it on (to the call's trace, to a `dspark_rounds` sink) costs the round no host read;
    whoever reads it first -- after generate(), or the demo's page thread -- pays the copy, once.
    """

    def __init__(self, make: Callable[[], RoundRecord]):
        self._make = make

    def __getattribute__(self, name):
        state = object.__getattribute__(self, "__dict__")
        if "_make" in state:
            with _FILLING:
                if "_make" in state:
                    state.update(vars(state["_make"]()))
                    del state["_make"]
        return object.__getattribute__(self, name)

    def __eq__(self, other):
        if not isinstance(other, RoundRecord):
            return NotImplemented
        return dataclasses.astuple(self) == dataclasses.astuple(other)

    __hash__ = None


@dataclasses.dataclass
class CallTrace:
    """What one generate() call with a DSpark drafter did: the scheduler it used ("auto" resolved) and its rounds."""

    scheduler: str
    rounds: list[RoundRecord] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TraceSummary:
    rounds: int
    tau: float  # mean accepted length per round, bonus included
    acceptance_per_position: list[Optional[float]]  # P(accept k | accepted 1..k-1 and k verified), k up to
    # the deepest position any round sent (None: sent, but never reached)
    verify_rate: float  # accepted draft tokens / verified draft tokens
    committed_tokens: int
    draft_seconds: float
    verify_seconds: float


def summarize(trace: Iterable[RoundRecord]) -> TraceSummary:
    records = list(trace)
    if not records:
        return TraceSummary(0, 0.0, [], 0.0, 0, 0.0, 0.0)
    depth = max(r.num_verified for r in records)
    acceptance: list[Optional[float]] = []
    for k in range(1, depth + 1):
        reached = [r for r in records if r.num_verified >= k and r.num_accepted >= k - 1]
        kept = sum(r.num_accepted >= k for r in reached)
        acceptance.append(kept / len(reached) if reached else None)
    verified = sum(r.num_verified for r in records)
    accepted = sum(r.num_accepted for r in records)
    return TraceSummary(
        rounds=len(records),
        tau=sum(r.num_accepted + 1 for r in records) / len(records),
        acceptance_per_position=acceptance,
        verify_rate=accepted / verified if verified else 0.0,
        committed_tokens=sum(len(r.committed_ids) for r in records),
        draft_seconds=sum(r.draft_seconds for r in records),
        verify_seconds=sum(r.verify_seconds for r in records),
    )
