"""What happened in each drafting round, and the numbers the paper reports from it."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional


@dataclasses.dataclass
class RoundRecord:
    position: int  # index of the round's anchor token in the sequence
    draft_ids: list[int]  # the whole block proposed, before scheduling
    confidences: list[float]  # raw c_k per proposed token; empty without a confidence head
    num_verified: int  # draft tokens sent to the target
    # draft tokens the target kept, as transformers counts them: when EOS or max_length cuts a round,
    # the last committed token counts as the round's target token even if it was drafted
    num_accepted: int
    committed_ids: list[int]  # tokens appended this round (accepted drafts + correction/bonus)
    draft_seconds: float
    verify_seconds: float


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
