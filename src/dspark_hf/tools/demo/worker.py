"""The generation thread: the drafted run, then the target alone, reported to the page as events.

Every event is a (kind, payload) pair on a queue that LiveRun.apply reads. The drafted run's
rounds come from the generator itself (generate(..., dspark_rounds=...)), one record as each
round ends, so the page shows what the scheduler decided instead of working it out again.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from ...core.generation import cost_table
from ...core.scheduling import AUTO_SCHEDULER, COST_SCHEDULER
from ..options import sampling_kwargs, timed_generate
from .state import Settings

WORKER_THREAD_NAME = "dspark-demo-generate"


class StopWhenSet(StoppingCriteria):
    """Ends generate() at its next step once `event` is set (the Stop button, or a closed page)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class TokenForwarder(BaseStreamer):
    """Hands the ids generate() appends, never the prompt, to `deliver`; `first_only` keeps just the first put.

    With a drafter the first put is the prefill token, the one token no drafting round reports.
    """

    def __init__(self, deliver: Callable[[list[int]], None], first_only: bool = False):
        self.deliver = deliver
        self.first_only = first_only
        self.puts = 0

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 1 or (self.first_only and self.puts > 2):
            return  # the prompt, or past the one put wanted
        self.deliver(value.flatten().tolist())

    def end(self) -> None:
        pass


class RoundEvents:
    """The drafted call's `dspark_rounds`: each RoundRecord goes on the page's queue as its round ends."""

    def __init__(self, events: queue.Queue, drafter):
        self.events, self.drafter = events, drafter
        self.count = 0

    def append(self, record) -> None:
        if self.count == 0:  # the call has resolved its scheduler by its first round
            self.events.put(("scheduler", self.drafter.last_scheduler))
        self.count += 1
        self.events.put(("round", record))


class TopTwoScores(LogitsProcessor):
    """Keeps the two best scores of each step of the target-alone run: its own margin wherever the answers part."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        self.steps.append(scores[0].topk(2).values)  # stays on the device: one copy after the run
        return scores

    def pairs(self) -> list[tuple[float, float]]:
        return [tuple(pair) for pair in torch.stack(self.steps).float().tolist()] if self.steps else []


def generate_both(
    target, drafter, prompt_ids: list[int], settings: Settings, events: queue.Queue, stop: threading.Event,
    compiled: dict | None = None,
):
    """Worker thread: the drafted run, then (optionally) the target alone; every step goes into `events`.
    `compiled`: the generate() fields of a compiled target (--compile), the same for both runs."""
    common = dict(
        max_new_tokens=settings.max_new_tokens,
        stopping_criteria=StoppingCriteriaList([StopWhenSet(stop)]),
        **sampling_kwargs(settings.temperature),
        **(compiled or {}),
    )
    try:
        if settings.scheduler in (AUTO_SCHEDULER, COST_SCHEDULER) and drafter.cost_table is None:
            events.put(("state", "timing this device for the scheduler (once, then cached)"))
            cost_table(drafter)  # profiled here, so that the timed run below does not pay for it
        events.put(("state", "generating"))
        _, seconds = timed_generate(
            target,
            prompt_ids,
            assistant_model=drafter,
            dspark_rounds=RoundEvents(events, drafter),
            streamer=TokenForwarder(lambda new: events.put(("prefill", new)), first_only=True),
            **settings.scheduler_kwargs(),
            **common,
        )
        events.put(("speculative_seconds", seconds))
        if settings.compare_plain and not stop.is_set():
            top_two = TopTwoScores()
            _, seconds = timed_generate(
                target,
                prompt_ids,
                streamer=TokenForwarder(lambda new: events.put(("plain", new))),
                logits_processor=LogitsProcessorList([top_two]),
                **common,
            )
            events.put(("plain_top_two", top_two.pairs()))
            events.put(("plain_seconds", seconds))
    except Exception as error:  # shown on the page instead of dying silently in a thread
        events.put(("error", error))
    finally:
        events.put(("end", stop.is_set()))


def drain(events: queue.Queue) -> list[tuple]:
    """The next event, waiting for it, and every one already queued behind it: one page update for all."""
    batch = [events.get()]
    while True:
        try:
            batch.append(events.get_nowait())
        except queue.Empty:
            return batch
