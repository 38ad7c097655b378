"""What happened in each drafting round, and the numbers the paper reports from it."""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Callable, Iterable, Optional


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
    source: str  # "dspark", "ngram", or "none" (the round proposed nothing)
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


class RoundTrace(collections.abc.Sequence):
    """A generate() call's RoundRecords, built from the rounds' device tensors only when first read.

    Each round leaves a function that makes its record; reading the trace runs the pending
    ones, so a round's tensors are copied to the host after generation, not inside the loop.
    """

    def __init__(self):
        self._records: list[RoundRecord] = []
        self._pending: list[Callable[[], RoundRecord]] = []

    def add(self, make_record: Callable[[], RoundRecord]) -> None:
        self._pending.append(make_record)

    def _materialize(self) -> list[RoundRecord]:
        if self._pending:
            self._records.extend(make() for make in self._pending)
            self._pending.clear()
        return self._records

    def __getitem__(self, index):
        return self._materialize()[index]

    def __len__(self) -> int:
        return len(self._records) + len(self._pending)

    def __repr__(self) -> str:
        return f"RoundTrace({self._materialize()!r})"


@dataclasses.dataclass
class TraceSummary:
    rounds: int
    tau: float  # mean accepted length per round, bonus included
    acceptance_per_position: list[Optional[float]]  # P(accept k | accepted 1..k-1 and k verified)
    verify_rate: float  # accepted draft tokens / verified draft tokens
    committed_tokens: int
    draft_seconds: float
    verify_seconds: float


def summarize(trace: Iterable[RoundRecord]) -> TraceSummary:
    records = list(trace)
    if not records:
        return TraceSummary(0, 0.0, [], 0.0, 0, 0.0, 0.0)
    depth = max(len(r.draft_ids) for r in records)
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
