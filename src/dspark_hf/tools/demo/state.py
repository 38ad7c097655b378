"""One run as the page knows it: the settings it ran with, and what the worker reported, event by event.

Everything here is plain data read from the generator's round records and the two runs'
tokens; render.py turns it into HTML and words, and nothing here knows about Gradio.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Optional

from ...core.scheduling import FULL_BLOCK, SCHEDULER_PRESETS
from ...core.trace import SOURCE_NGRAM, RoundRecord
from ..exactness import Divergence, bf16_steps, first_difference

SCHEDULER_CHOICES = tuple(SCHEDULER_PRESETS)


@dataclasses.dataclass
class Settings:
    max_new_tokens: int
    scheduler: str  # one of SCHEDULER_CHOICES
    threshold: float
    block_cap: int
    temperature: float
    compare_plain: bool
    ngram: bool = True  # hybrid drafting: a round may propose an n-gram continuation of the context

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    @property
    def threshold_used(self) -> float:
        return 0.0 if self.scheduler == FULL_BLOCK else self.threshold

    def scheduler_kwargs(self) -> dict:
        """The generate() fields of this choice: passed explicitly, so the page shows exactly what ran.

        The n-gram checkbox holds for every choice, "full block" included."""
        return {
            "assistant_confidence_threshold": self.threshold,
            "num_assistant_tokens": self.block_cap,
            **SCHEDULER_PRESETS[self.scheduler],
            "dspark_ngram": self.ngram,
        }


@dataclasses.dataclass
class AnswerToken:
    """A committed token of the answer."""

    text: str  # what it adds to the answer's text; "" for a special token
    origin: str  # "accepted" (a DSpark draft the target kept), "ngram" (an n-gram draft it kept) or "target"
    round_number: int  # 0: the prefill
    special: Optional[str] = None  # the token's name when it is a special token, shown as a badge


@dataclasses.dataclass
class DraftToken:
    """One token of a round's proposal."""

    text: str
    fate: str  # "accepted", "rejected" or "pruned" (never sent)
    confidence: Optional[float]  # the value the scheduler read (calibrated when the drafter is)


@dataclasses.dataclass
class RoundView:
    """A round's record with its proposal decoded; `record` is the generator's own account, unchanged."""

    number: int
    record: RoundRecord
    drafts: list[DraftToken]

    @property
    def kept(self) -> int:
        return kept_drafts(self.record)

    @property
    def kept_origin(self) -> str:
        return "ngram" if self.record.source == SOURCE_NGRAM else "accepted"


def kept_drafts(record: RoundRecord) -> int:
    """The round's committed tokens that were drafts: num_accepted, never more than it committed (EOS, max length)."""
    return min(record.num_accepted, len(record.committed_ids))


def shown_confidences(record: RoundRecord) -> list[float]:
    """The confidences the scheduler read: the record's calibrated ones, or the raw ones when it has none."""
    return list(record.calibrated or record.confidences)


class AnswerText:
    """Splits the answer's text among its tokens so that the pieces add up to decode(answer).

    Decoding token by token would lose BPE merges and split multi-byte characters; decoding the
    whole answer and handing out what is new keeps both right.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        # A character whose bytes are still coming waits for its last token.
        decoded = self.tokenizer.decode(self.ids, skip_special_tokens=True).rstrip("\ufffd")
        # Should decoding rewrite earlier text (a clean-up of spaces), the piece restarts where they differ.
        shared = len(os.path.commonprefix([decoded, self.text]))
        self.text = decoded
        return decoded[shared:]


def token_text(tokenizer, context: list[int], token_id: int, window: int = 6) -> str:
    """The text `token_id` adds after `context`: decoding a short tail keeps BPE spaces and merges right."""
    tail = context[-window:]
    before = tokenizer.decode(tail, skip_special_tokens=False)
    after = tokenizer.decode(tail + [token_id], skip_special_tokens=False)
    return after[len(before) :] if after.startswith(before) else tokenizer.decode([token_id], skip_special_tokens=False)


class LiveRun:
    """The page's view of one generation, built up from the events the worker sends."""

    def __init__(self, tokenizer, prompt_ids: list[int], settings: Settings, calibrated: bool = False):
        self.tokenizer = tokenizer
        self.settings = settings
        self.calibrated = calibrated  # the drafter has STS temperatures: the scheduler reads calibrated values
        self.special_ids = set(tokenizer.all_special_ids)
        self.prompt_length = len(prompt_ids)
        self.sequence = list(prompt_ids)  # prompt + committed tokens: the context of the next round
        self.text = AnswerText(tokenizer)
        self.tokens: list[AnswerToken] = []
        self.rounds: list[RoundView] = []
        self.plain_ids: list[int] = []
        self.plain_top_two: list[tuple[float, float]] = []  # the target alone's two best scores at each step
        self.scheduler: Optional[str] = None  # what the drafter ran ("auto" resolved)
        self.started = time.perf_counter()
        self.speculative_seconds: Optional[float] = None
        self.plain_seconds: Optional[float] = None
        self.state = "starting"
        self.stopped = False
        self.finished = False

    def apply(self, kind: str, payload) -> None:
        if kind == "state":
            self.state = payload
            self.started = time.perf_counter()  # the timed run starts right after the last state change
        elif kind == "prefill":
            for token_id in payload:
                self.commit(token_id, "target", 0)
        elif kind == "scheduler":
            self.scheduler = payload
        elif kind == "round":
            self.add_round(payload)
        elif kind == "plain":
            self.plain_ids += payload
        elif kind == "plain_top_two":
            self.plain_top_two += payload
        elif kind == "speculative_seconds":
            self.speculative_seconds = payload
            if self.settings.compare_plain:
                self.state = "running the target alone, for the comparison"
        elif kind == "plain_seconds":
            self.plain_seconds = payload
        elif kind == "end":
            self.stopped, self.finished = payload, True
            self.state = "stopped" if payload else "done"

    def commit(self, token_id: int, origin: str, round_number: int) -> None:
        if token_id in self.special_ids:
            token = AnswerToken("", origin, round_number, special=self.tokenizer.convert_ids_to_tokens(token_id))
        else:
            token = AnswerToken(self.text.add(token_id), origin, round_number)
        self.tokens.append(token)
        self.sequence.append(token_id)

    def add_round(self, record: RoundRecord) -> None:
        confidences = shown_confidences(record)
        context = list(self.sequence)
        kept = kept_drafts(record)
        drafts = [
            DraftToken(
                token_text(self.tokenizer, context + record.draft_ids[:k], draft_id),
                "accepted" if k < kept else "rejected" if k < record.num_verified else "pruned",
                confidences[k] if k < len(confidences) else None,
            )
            for k, draft_id in enumerate(record.draft_ids)
        ]
        view = RoundView(len(self.rounds) + 1, record, drafts)
        self.rounds.append(view)
        for k, token_id in enumerate(record.committed_ids):
            self.commit(token_id, view.kept_origin if k < kept else "target", view.number)

    @property
    def records(self) -> list[RoundRecord]:
        return [view.record for view in self.rounds]

    @property
    def answer_ids(self) -> list[int]:
        return self.sequence[self.prompt_length :]

    def tokens_per_second(self) -> float:
        seconds = self.speculative_seconds
        if seconds is None:  # still running
            seconds = time.perf_counter() - self.started
        return len(self.answer_ids) / seconds if seconds > 0 else 0.0

    def first_difference(self) -> Optional[int]:
        return first_difference(self.plain_ids, self.answer_ids)

    def divergence(self) -> Optional[Divergence]:
        """Where the answer leaves the target alone's, with the target alone's own top-two margin at that step.

        Greedy, the target alone's token is its top-1, so its margin is top-1 minus top-2. None when the
        answers agree, or when the target alone had no step there (it stopped first)."""
        index = self.first_difference()
        if index is None or index >= len(self.plain_top_two):
            return None
        best, second = self.plain_top_two[index]
        token = self.answer_ids[index] if index < len(self.answer_ids) else None
        return Divergence(index, self.plain_ids[index], token, best - second, bf16_steps(best - second, best))
