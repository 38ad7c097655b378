"""Gradio demo: a DSpark answer that reads as text, with every drafting round one hover or click away.

`dspark demo` (or `python demo/app.py`) serves it on 127.0.0.1 only, with analytics off, so
nothing leaves the machine. Gradio is imported only when the demo is built: it is an optional
extra (`pip install dspark_hf[demo]`) and `dspark` loads this module for every command.

The answer holds the committed tokens only, coloured by origin (a draft the target kept, or
the target's own token). Drafts the target rejected or the scheduler pruned stay out of the
text: they live in hover notes, in a marker at the end of their round and in the rounds table.
The target alone runs right after on the same prompt, which checks the answer (greedy decoding
must match token for token) and measures the speed-up.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import os
import queue
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from ..core.generation import cost_table
from ..core.scheduling import AUTO_SCHEDULER, COST_SCHEDULER, THRESHOLD_SCHEDULER
from ..core.trace import RoundRecord, summarize
from .errors import InputError, port_number
from .prompts import render_prompt
from .targets import DEFAULT_TARGET, load_pair

if TYPE_CHECKING:
    import gradio as gr

DEFAULT_MAX_NEW_TOKENS = 128
MAX_PROMPT_TOKENS = 2048  # longer prompts are refused: on a CPU their prefill alone would take minutes
DEFAULT_PORT = 7860
DEFAULT_PROMPT = (
    "A baker makes 12 muffins per tray and bakes 5 trays. He sells 38 muffins. How many are left? "
    "Please reason step by step."
)
WORKER_THREAD_NAME = "dspark-demo-generate"
FULL_BLOCK = "full block"  # the threshold scheduler at threshold 0: every draft up to the cap is verified
SCHEDULER_CHOICES = (AUTO_SCHEDULER, THRESHOLD_SCHEDULER, COST_SCHEDULER, FULL_BLOCK)

# Shipped inside the legend so build_demo() looks the same however the Blocks are launched.
STYLES = """
<style>
.dspark-answer { white-space: pre-wrap; line-height: 1.75; font-size: 1.02rem; padding: 0.8rem 1rem;
  border: 1px solid var(--border-color-primary); border-radius: 8px; min-height: 3rem; }
.dspark-answer .tok, .dspark-legend .tok, .dspark-rounds .tok { border-radius: 3px; color: #1d1d1d; }
.tok-accepted { background: #d9f2d9; }
.tok-target { background: #dce7fb; }
.tok-rejected { background: #f9d9d9; text-decoration: line-through; }
.tok-pruned { background: #ececec; font-style: italic; }
.dspark-rounds .tok-pruned { color: #6b6b6b; }
.tok-special::after { content: attr(data-token); font: 0.68em ui-monospace, monospace; color: #555;
  background: #f1f1f1; border: 1px solid #cfcfcf; border-radius: 4px; padding: 0 0.3em; margin: 0 0.2em; }
.dspark-mark { display: inline-block; width: 0.45em; height: 0.45em; border-radius: 50%; margin: 0 0.12em;
  vertical-align: 0.5em; cursor: help; }
.mark-rejected { background: #e48f8f; }
.mark-pruned { background: #b9b9b9; }
.dspark-legend { font-size: 0.85rem; line-height: 2; }
.dspark-legend .tok, .dspark-legend .tok-special, .dspark-legend .dspark-mark { margin-left: 0.5em; }
.dspark-metrics { display: grid; grid-template-columns: max-content 1fr; gap: 0.25rem 1rem; font-size: 0.9rem; }
.dspark-metrics b { white-space: nowrap; }
.dspark-metrics .note, .dspark-positions caption { color: var(--body-text-color-subdued); }
.dspark-positions { font-size: 0.85rem; border-collapse: collapse; margin-top: 0.6rem; }
.dspark-positions caption { text-align: left; }
.dspark-positions td, .dspark-positions th { padding: 2px 8px; text-align: center; }
.dspark-rounds { max-height: 26rem; overflow: auto; }
.dspark-rounds table { font-size: 0.85rem; border-collapse: collapse; width: 100%; }
.dspark-rounds td, .dspark-rounds th { padding: 3px 6px; border-bottom: 1px solid var(--border-color-primary);
  vertical-align: top; text-align: left; }
.dspark-rounds .tok { white-space: pre; }
.dspark-rounds sub { color: var(--body-text-color-subdued); margin: 0 0.35em 0 0.1em; }
</style>
"""

CHART_COLOURS = {"accepted": "#6cc070", "target": "#6d9be6", "tau": "#666666", "axis": "#999999"}
CHART_PLOT_WIDTH, CHART_UNIT = 520, 16  # pixels: width of the plotting area, height of one token
CHART_MARGINS = {"left": 44, "right": 78, "top": 26, "bottom": 36}


# ---------------------------------------------------------------- generation hooks
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


@dataclasses.dataclass
class Settings:
    max_new_tokens: int
    scheduler: str  # one of SCHEDULER_CHOICES
    threshold: float
    block_cap: int
    temperature: float
    compare_plain: bool

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    @property
    def threshold_used(self) -> float:
        return 0.0 if self.scheduler == FULL_BLOCK else self.threshold

    def scheduler_kwargs(self) -> dict:
        """The generate() fields of this choice: passed explicitly, so the page shows exactly what ran."""
        name = THRESHOLD_SCHEDULER if self.scheduler == FULL_BLOCK else self.scheduler
        return dict(
            dspark_scheduler=name,
            assistant_confidence_threshold=self.threshold_used,
            num_assistant_tokens=self.block_cap,
        )

    def generate_kwargs(self, stop: threading.Event) -> dict:
        sampling = dict(do_sample=True, temperature=self.temperature) if self.sampling else dict(do_sample=False)
        return dict(
            max_new_tokens=self.max_new_tokens, stopping_criteria=StoppingCriteriaList([StopWhenSet(stop)]), **sampling
        )


def generate_both(
    target, drafter, prompt_ids: list[int], settings: Settings, events: queue.Queue, stop: threading.Event
):
    """Worker thread: the speculative run, then (optionally) the target alone; every step goes into `events`."""
    ids = torch.tensor([prompt_ids], device=target.device)
    common = dict(attention_mask=torch.ones_like(ids), **settings.generate_kwargs(stop))
    try:
        if settings.scheduler in (AUTO_SCHEDULER, COST_SCHEDULER) and drafter.cost_table is None:
            events.put(("state", "timing this device for the scheduler (once, then cached)"))
            cost_table(drafter)  # profiled here, so that the timed run below does not pay for it
        drafter.on_round = lambda record: events.put(("round", (record, drafter.last_scheduler)))
        events.put(("state", "generating"))
        started = time.perf_counter()
        target.generate(
            ids,
            assistant_model=drafter,
            streamer=TokenForwarder(lambda new: events.put(("prefill", new)), first_only=True),
            **settings.scheduler_kwargs(),
            **common,
        )
        events.put(("speculative_seconds", time.perf_counter() - started))
        if settings.compare_plain and not stop.is_set():
            started = time.perf_counter()
            target.generate(ids, streamer=TokenForwarder(lambda new: events.put(("plain", new))), **common)
            events.put(("plain_seconds", time.perf_counter() - started))
    except Exception as error:  # shown on the page instead of dying silently in a thread
        events.put(("error", error))
    finally:
        drafter.on_round = None
        events.put(("end", stop.is_set()))


def drain(events: queue.Queue) -> list[tuple]:
    """The next event, waiting for it, and every one already queued behind it: one page update for all."""
    batch = [events.get()]
    while True:
        try:
            batch.append(events.get_nowait())
        except queue.Empty:
            return batch


# ---------------------------------------------------------------- tokens as the page shows them
@dataclasses.dataclass
class AnswerToken:
    """A committed token of the answer."""

    text: str  # what it adds to the answer's text; "" for a special token
    origin: str  # "accepted" (a draft the target kept) or "target"
    round_number: int  # 0: the prefill
    note: str  # hover text
    special: Optional[str] = None  # the token's name when it is a special token, shown as a badge


@dataclasses.dataclass
class DraftToken:
    """One draft of a round's block, for the rounds table."""

    text: str
    fate: str  # "accepted", "rejected" or "pruned"
    confidence: Optional[float]  # the value the scheduler read


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


def one_line(text: str) -> str:
    """Drafts and hover notes never break a line: a newline shows as ↵."""
    return text.replace("\r", "").replace("\n", "\u21b5")


def first_difference(left: list[int], right: list[int]) -> Optional[int]:
    for index, (a, b) in enumerate(zip(left, right)):
        if a != b:
            return index
    return None if len(left) == len(right) else min(len(left), len(right))


# ---------------------------------------------------------------- HTML pieces
def answer_span(token: AnswerToken) -> str:
    title = html.escape(one_line(token.note))
    if token.special is not None:
        return f'<span class="tok-special" data-token="{html.escape(token.special)}" title="{title}"></span>'
    return f'<span class="tok tok-{token.origin}" title="{title}">{html.escape(token.text)}</span>'


def marker_span(kind: str, note: str) -> str:
    return f'<span class="dspark-mark mark-{kind}" title="{html.escape(one_line(note))}"></span>'


def shown(confidence: Optional[float]) -> str:
    return "–" if confidence is None else f"{confidence:.2f}"


def draft_span(draft: DraftToken, label: str) -> str:
    value = shown(draft.confidence)
    return (
        f'<span class="tok tok-{draft.fate}" title="{draft.fate} · {label} {value}">{html.escape(draft.text)}</span>'
        f"<sub>{value}</sub>"
    )


def answer_html(parts: list[str]) -> str:
    return '<div class="dspark-answer">' + "".join(parts) + "</div>"


def rounds_table(rows: list[str], label: str) -> str:
    if not rows:
        return ""
    columns = ("round", f"drafted block, each draft with its {label}", "target's token", "what happened")
    head = "<tr>" + "".join(f"<th>{html.escape(column)}</th>" for column in columns) + "</tr>"
    return f'<div class="dspark-rounds"><table>{head}{"".join(rows)}</table></div>'


def legend_html(label: str) -> str:
    answer = (
        '<span class="tok tok-accepted">accepted draft</span> <span class="tok tok-target">target token</span>'
        ' <span class="tok-special" data-token="special"></span> a special token, not part of the text'
    )
    rounds = (
        '<span class="dspark-mark mark-rejected"></span> a round left out a rejected draft'
        ' <span class="dspark-mark mark-pruned"></span> pruned drafts only'
        ' <span class="tok tok-rejected">rejected draft</span> sent, not kept'
        ' <span class="tok tok-pruned">pruned draft</span> never sent'
    )
    confidence = (
        f"Hover a token or a dot for its round; the rounds table lists every draft with its {html.escape(label)}, "
        "the value the threshold and the cost scheduler read."
    )
    return f'{STYLES}<div class="dspark-legend">Answer: {answer}<br>Rounds: {rounds}<br>{confidence}</div>'


def svg_text(x: float, y: float, text: str, anchor: str = "middle", extra: str = "") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="11" fill="#555" {extra}>'
        f"{html.escape(text)}</text>"
    )


def tick_spacing(count: int, most_ticks: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that labels at most `most_ticks` of `count` values."""
    for scale in itertools.count():
        for mantissa in (1, 2, 5):
            if count / (mantissa * 10**scale) <= most_ticks:
                return mantissa * 10**scale


def rounds_chart(records: list[RoundRecord]) -> str:
    """Stacked bars per round (drafts kept, then the target's token), with axes and a labelled τ line."""
    if not records:
        return ""
    tau = summarize(records).tau
    top = max(2, max(len(r.committed_ids) for r in records), int(tau) + 1)
    left, right, upper, lower = (CHART_MARGINS[side] for side in ("left", "right", "top", "bottom"))
    plot_height = top * CHART_UNIT
    base = upper + plot_height
    step = CHART_PLOT_WIDTH / len(records)
    bar = max(1.0, min(14.0, step * 0.75))
    parts = []
    for i, record in enumerate(records):
        kept = min(record.num_accepted, len(record.committed_ids))
        x = left + i * step + (step - bar) / 2
        kept_top = base - kept * CHART_UNIT
        target_height = (len(record.committed_ids) - kept) * CHART_UNIT
        parts.append(
            f"<g><title>round {i + 1}: {kept} drafts kept + the target's token "
            f"({len(record.draft_ids)} drafted, {record.num_verified} sent)</title>"
            f'<rect x="{x:.1f}" y="{kept_top:.1f}" width="{bar:.1f}" height="{kept * CHART_UNIT}" '
            f'fill="{CHART_COLOURS["accepted"]}"/>'
            f'<rect x="{x:.1f}" y="{kept_top - target_height:.1f}" width="{bar:.1f}" height="{target_height}" '
            f'fill="{CHART_COLOURS["target"]}"/></g>'
        )
    for value in range(0, top + 1, tick_spacing(top, 8)):
        y = base - value * CHART_UNIT
        parts.append(f'<line x1="{left - 4}" x2="{left}" y1="{y}" y2="{y}" stroke="{CHART_COLOURS["axis"]}"/>')
        parts.append(svg_text(left - 7, y + 4, str(value), anchor="end"))
    every = tick_spacing(len(records), 10)
    for number in sorted({1, *range(every, len(records) + 1, every)}):
        x = left + (number - 0.5) * step
        parts.append(svg_text(x, base + 14, str(number)))
    right_edge, middle = left + CHART_PLOT_WIDTH, upper + plot_height / 2
    tau_y = base - tau * CHART_UNIT
    parts += [
        f'<line x1="{left}" x2="{left}" y1="{upper}" y2="{base}" stroke="{CHART_COLOURS["axis"]}"/>',
        f'<line x1="{left}" x2="{right_edge}" y1="{base}" y2="{base}" stroke="{CHART_COLOURS["axis"]}"/>',
        (
            f'<line x1="{left}" x2="{right_edge}" y1="{tau_y:.1f}" y2="{tau_y:.1f}" '
            f'stroke="{CHART_COLOURS["tau"]}" stroke-dasharray="5 3"/>'
        ),
        svg_text(right_edge + 6, tau_y + 4, f"τ = {tau:.2f}", anchor="start", extra='font-weight="600"'),
        svg_text(left + CHART_PLOT_WIDTH / 2, base + 30, "round"),
        svg_text(12, middle, "tokens committed", extra=f'transform="rotate(-90 12 {middle})"'),
        f'<rect x="{left}" y="6" width="10" height="10" fill="{CHART_COLOURS["accepted"]}"/>',
        svg_text(left + 14, 15, "drafts kept", anchor="start"),
        f'<rect x="{left + 96}" y="6" width="10" height="10" fill="{CHART_COLOURS["target"]}"/>',
        svg_text(left + 110, 15, "the target's token", anchor="start"),
    ]
    width, height = left + CHART_PLOT_WIDTH + right, base + lower
    return (
        f'<div class="dspark-chart"><svg viewBox="0 0 {width} {height}" width="100%" style="max-width:{width}px" '
        f'xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg></div>'
    )


def positions_table(acceptance: list[Optional[float]]) -> str:
    """Conditional acceptance per draft position, shaded by its value."""
    if not acceptance:
        return ""
    head = "".join(f"<th>{k}</th>" for k in range(1, len(acceptance) + 1))
    cells = "".join(
        "<td>–</td>"
        if rate is None
        else f'<td style="background: rgba(108, 192, 112, {0.15 + 0.6 * rate:.2f})">{rate:.0%}</td>'
        for rate in acceptance
    )
    caption = (
        "Acceptance per draft position: how often draft k was kept, among the rounds that sent it "
        "after keeping drafts 1..k−1 (– : never reached)."
    )
    return (
        f'<table class="dspark-positions"><caption>{caption}</caption>'
        f"<tr><th>position</th>{head}</tr><tr><th>kept</th>{cells}</tr></table>"
    )


# ---------------------------------------------------------------- one run, as the page shows it
class LiveRun:
    """The page's view of one generation, built up from the events the worker sends."""

    def __init__(self, tokenizer, prompt_ids: list[int], settings: Settings, calibration=None):
        self.tokenizer = tokenizer
        self.settings = settings
        self.calibration = calibration  # when set, the scheduler reads (and the page shows) calibrated confidences
        self.confidence_label = confidence_label(calibration)
        self.special_ids = set(tokenizer.all_special_ids)
        self.prompt_length = len(prompt_ids)
        self.sequence = list(prompt_ids)  # prompt + committed tokens: the context of the next round
        self.text = AnswerText(tokenizer)
        self.tokens: list[AnswerToken] = []
        self.records: list[RoundRecord] = []
        self.answer_parts: list[str] = []  # the answer's HTML: a span per token, a marker after some rounds
        self.table_rows: list[str] = []
        self.round_details: list[dict] = []
        self.plain_ids: list[int] = []
        self.scheduler: Optional[str] = None  # what the drafter ran ("auto" resolved)
        self.started = time.perf_counter()
        self.speculative_seconds: Optional[float] = None
        self.plain_seconds: Optional[float] = None
        self.state = "starting"
        self.stopped = False
        self.finished = False

    # ------------------------------------------------ events
    def apply(self, kind: str, payload) -> None:
        if kind == "state":
            self.state = payload
            self.started = time.perf_counter()  # the timed run starts right after the last state change
        elif kind == "prefill":
            for token_id in payload:
                note = "the target's first token, from reading the prompt"
                self.commit(token_id, "target", 0, note)
                self.table_rows.append(
                    f"<tr><td>prefill</td><td>–</td><td>{self.last_token_html()}</td><td>{note}</td></tr>"
                )
        elif kind == "round":
            self.add_round(*payload)
        elif kind == "plain":
            self.plain_ids += payload
        elif kind == "speculative_seconds":
            self.speculative_seconds = payload
            if self.settings.compare_plain:
                self.state = "running the target alone, for the comparison"
        elif kind == "plain_seconds":
            self.plain_seconds = payload
        elif kind == "end":
            self.stopped, self.finished = payload, True
            self.state = "stopped" if payload else "done"

    def commit(self, token_id: int, origin: str, round_number: int, note: str) -> None:
        if token_id in self.special_ids:
            name = self.tokenizer.convert_ids_to_tokens(token_id)
            token = AnswerToken("", origin, round_number, f"{note} · special token {name}", special=name)
        else:
            token = AnswerToken(self.text.add(token_id), origin, round_number, note)
        self.tokens.append(token)
        self.sequence.append(token_id)
        self.answer_parts.append(answer_span(token))

    def last_token_html(self) -> str:
        token = self.tokens[-1]
        return f'<span class="tok tok-{token.origin}">{html.escape(one_line(token.special or token.text))}</span>'

    def shown_confidences(self, record: RoundRecord) -> list[float]:
        """The confidences the scheduler compared with the threshold: calibrated when the drafter is."""
        if not record.confidences or self.calibration is None:
            return list(record.confidences)
        return self.calibration.apply(torch.tensor(record.confidences)).tolist()

    def add_round(self, record: RoundRecord, scheduler: Optional[str]) -> None:
        self.records.append(record)
        self.scheduler = scheduler
        number = len(self.records)
        confidences = self.shown_confidences(record)
        context = list(self.sequence)
        kept, sent = min(record.num_accepted, len(record.committed_ids)), record.num_verified
        drafts = [
            DraftToken(
                one_line(token_text(self.tokenizer, context + record.draft_ids[:k], draft_id)),
                "accepted" if k < kept else "rejected" if k < sent else "pruned",
                confidences[k] if k < len(confidences) else None,
            )
            for k, draft_id in enumerate(record.draft_ids)
        ]
        summary = self.round_summary(record, confidences)
        for k, token_id in enumerate(record.committed_ids):
            if k < kept:
                note = f"round {number}: draft {k + 1}, kept · {self.confidence_label} {shown(drafts[k].confidence)}"
                self.commit(token_id, "accepted", number, note)
            else:
                note = f"round {number}: {target_role(drafts, kept, sent)} · {summary}"
                self.commit(token_id, "target", number, note)
        left_out = {fate: "".join(d.text for d in drafts if d.fate == fate) for fate in ("rejected", "pruned")}
        if any(left_out.values()):  # a marker at the end of the round holds what the text leaves out
            listed = "".join(f" · {fate}: “{text}”" for fate, text in left_out.items() if text)
            kind = "rejected" if left_out["rejected"] else "pruned"
            self.answer_parts.append(marker_span(kind, f"round {number}: {summary}{listed}"))
        block = "".join(draft_span(d, self.confidence_label) for d in drafts) or "–"
        cells = (str(number), block, self.last_token_html(), html.escape(summary))
        self.table_rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
        self.round_details.append(
            {
                "round": number,
                "drafted": [d.text for d in drafts],
                "fates": [d.fate for d in drafts],
                "confidences": [d.confidence for d in drafts],
                "committed": [self.tokenizer.decode([t]) for t in record.committed_ids],
                "summary": summary,
            }
        )

    def round_summary(self, record: RoundRecord, confidences: list[float]) -> str:
        """What happened in a round, in words: 'drafted 7, kept 3 of 5 sent, rejected at draft 4, ...'."""
        drafted, sent, kept = len(record.draft_ids), record.num_verified, record.num_accepted
        room = self.prompt_length + self.settings.max_new_tokens - record.position - 2  # drafts that fit
        if drafted == 0:
            if room <= 0:
                return "no draft: only the target's token fits before the max-new-tokens limit"
            return "no draft: the cost scheduler judged that drafting would not pay here"
        parts = [f"drafted {drafted}", f"kept {kept} of {sent} sent" if sent else "none sent"]
        if sent > kept:
            parts.append(f"rejected at draft {kept + 1}")
        if sent < drafted:
            parts.append(f"{drafted - sent} pruned by {self.pruned_reason(record, confidences, room)}")
        return ", ".join(parts)

    def pruned_reason(self, record: RoundRecord, confidences: list[float], room: int) -> str:
        sent, cap, threshold = record.num_verified, self.settings.block_cap, self.settings.threshold_used
        if sent == min(cap, room):
            return "the max-new-tokens limit" if room <= cap else f"the block cap ({cap})"
        if threshold > 0 and sent < len(confidences) and confidences[sent] < threshold:
            return f"the threshold: {self.confidence_label} {confidences[sent]:.2f} < {threshold:.2f}"
        if self.scheduler == COST_SCHEDULER:
            return "the cost scheduler: more drafts would not pay"
        return "the scheduler"

    # ------------------------------------------------ what the page shows
    @property
    def answer_ids(self) -> list[int]:
        return self.sequence[self.prompt_length :]

    def tokens_per_second(self) -> float:
        seconds = self.speculative_seconds
        if seconds is None:  # still running
            seconds = time.perf_counter() - self.started
        return len(self.answer_ids) / seconds if seconds > 0 else 0.0

    def scheduler_shown(self) -> str:
        if self.settings.scheduler == AUTO_SCHEDULER:
            return f"auto → {self.scheduler}" if self.scheduler else "auto"
        return "full block (threshold 0)" if self.settings.scheduler == FULL_BLOCK else self.settings.scheduler

    def status_markdown(self) -> str:
        head = (
            f"**{self.state}** · {len(self.answer_ids)} tokens in {len(self.records)} rounds · "
            f"prompt {self.prompt_length} tokens · scheduler **{self.scheduler_shown()}**"
        )
        return f"{head}\n\n{self.comparison()}"

    def token_name(self, ids: list[int], index: int) -> str:
        if index >= len(ids):
            return "(end)"
        return f"<code>{html.escape(one_line(self.tokenizer.decode([ids[index]])))}</code>"

    def comparison(self) -> str:
        """Is the answer the target's own? Greedy must match token for token; sampling may differ."""
        if not self.settings.compare_plain:
            return "The target-alone run is off: turn it on to check the answer and measure the speed-up."
        if self.stopped:
            return "Stopped, so there is no comparison with the target alone."
        if self.plain_seconds is None:
            return f"The target alone runs next on the same prompt ({len(self.plain_ids)} tokens so far)."
        index = first_difference(self.answer_ids, self.plain_ids)
        if index is None:
            if self.settings.sampling:
                return "Identical to the target alone, by chance: with sampling each run draws its own tokens."
            return f"✓ **Identical to the target alone**: the same {len(self.plain_ids)} tokens (greedy decoding)."
        where = (
            f"first difference at token {index + 1}: {self.token_name(self.answer_ids, index)} here, "
            f"{self.token_name(self.plain_ids, index)} from the target alone"
        )
        if self.settings.sampling:
            return (
                f"Sampling (temperature {self.settings.temperature:g}): each run draws its own random tokens, so "
                f"the texts can differ; both follow the target's distribution ({where})."
            )
        return (
            f"✗ **Differs from the target alone**, {where}. Greedy runs should match; a near-tie between two "
            "tokens can flip with the different float rounding of verifying a block at once."
        )

    def metrics_html(self) -> str:
        if not self.records:
            return ""
        summary = summarize(self.records)
        sent = sum(r.num_verified for r in self.records)
        kept = sum(r.num_accepted for r in self.records)
        rows = [
            (
                f"τ = {summary.tau:.2f}",
                "tokens committed per round: the drafts kept plus the target's own token. 1 means no draft was ever "
                f"kept; at most {self.settings.block_cap + 1} here (block cap + 1).",
            ),
            (
                f"acceptance rate {summary.verify_rate:.0%}",
                f"accepted ÷ verified: the target kept {kept} of the {sent} drafts sent to it; "
                "pruned drafts never reach it and do not count.",
            ),
            (
                f"{self.tokens_per_second():.1f} tokens/s",
                "answer tokens per second of wall clock, drafter and target together "
                f"(drafting {summary.draft_seconds:.2f} s, verifying {summary.verify_seconds:.2f} s).",
            ),
            self.speed_up(),
        ]
        cells = "".join(
            f'<b>{html.escape(value)}</b><span class="note">{html.escape(note)}</span>' for value, note in rows
        )
        return f'<div class="dspark-metrics">{cells}</div>{positions_table(summary.acceptance_per_position)}'

    def speed_up(self) -> tuple[str, str]:
        if not self.settings.compare_plain:
            return "speed-up –", "turn on “Also run the target alone” to measure it."
        if self.stopped:
            return "speed-up –", "not measured: the run was stopped."
        if self.plain_seconds is None or not self.plain_ids:
            return "speed-up …", "measured when the target-alone run ends."
        plain_rate = len(self.plain_ids) / self.plain_seconds
        return (
            f"speed-up ×{self.tokens_per_second() / plain_rate:.2f}",
            f"these tokens/s ÷ the target alone's {plain_rate:.1f} tokens/s, run right after on the same prompt; "
            "above ×1 drafting pays.",
        )

    def details(self) -> dict:
        tokens = [
            {"text": t.special or t.text, "origin": t.origin, "round": t.round_number, "special": t.special is not None}
            for t in self.tokens
        ]
        return {"confidence": self.confidence_label, "tokens": tokens, "rounds": self.round_details}

    def outputs(self) -> tuple:
        """In the order of OUTPUT_LABELS."""
        return (
            answer_html(self.answer_parts),
            self.tokenizer.decode(self.answer_ids, skip_special_tokens=True),
            self.status_markdown(),
            self.metrics_html(),
            rounds_chart(self.records),
            rounds_table(self.table_rows, self.confidence_label),
            self.tokenizer.decode(self.plain_ids, skip_special_tokens=True),
            self.details(),
        )


def confidence_label(calibration) -> str:
    return "confidence (raw)" if calibration is None else "confidence (calibrated)"


def target_role(drafts: list[DraftToken], kept: int, sent: int) -> str:
    if sent > kept:
        return f"the target's token, in place of rejected draft {kept + 1} “{drafts[kept].text}”"
    if sent:
        return f"the target's bonus token, after all {sent} drafts sent were kept"
    return "the target's token (no draft sent)"


# ---------------------------------------------------------------- the app
OUTPUT_LABELS = (
    "Answer, coloured by origin (HTML)",
    "Answer (plain text)",
    "Status and comparison with the target alone",
    "Metrics",
    "Tokens committed per round (chart)",
    "Rounds: drafted, kept, rejected, pruned",
    "Target alone (plain text)",
    "Tokens and rounds (JSON)",
)


class DemoSession:
    """The models, and the one generation the app runs at a time (the drafter's on_round hook is shared)."""

    def __init__(self, target, tokenizer, drafter):
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.stop_event = threading.Event()

    def stop(self) -> None:
        self.stop_event.set()

    def prompt_info(self, prompt: str) -> str:
        """The prompt's size as the model sees it (chat template included), and the limit."""
        if not prompt.strip():
            return "Type a prompt to start."
        count = len(render_prompt(self.tokenizer, prompt))
        if count > MAX_PROMPT_TOKENS:
            return f"**{count} prompt tokens: over this demo's limit of {MAX_PROMPT_TOKENS}.** Shorten the prompt."
        return f"{count} prompt tokens, chat template included (limit {MAX_PROMPT_TOKENS})."

    def generate(self, prompt, max_new_tokens, scheduler, threshold, block_cap, temperature, compare_plain):
        """Yields the page outputs as rounds (and target-alone tokens) arrive, until both runs end."""
        import gradio as gr

        if not prompt or not prompt.strip():
            raise gr.Error("Type a prompt first: the prompt box is empty.", print_exception=False)
        prompt_ids = render_prompt(self.tokenizer, prompt)
        if len(prompt_ids) > MAX_PROMPT_TOKENS:
            raise gr.Error(
                f"The prompt is {len(prompt_ids)} tokens; this demo takes at most {MAX_PROMPT_TOKENS}. Shorten it.",
                print_exception=False,
            )
        settings = Settings(
            int(max_new_tokens),
            str(scheduler),
            float(threshold),
            int(block_cap),
            float(temperature),
            bool(compare_plain),
        )
        stop = self.stop_event = threading.Event()
        events: queue.Queue = queue.Queue()
        worker = threading.Thread(
            target=generate_both,
            args=(self.target, self.drafter, prompt_ids, settings, events, stop),
            name=WORKER_THREAD_NAME,
            daemon=True,
        )
        run = LiveRun(self.tokenizer, prompt_ids, settings, self.drafter.calibration)
        worker.start()
        try:
            yield run.outputs()
            while not run.finished:
                for kind, payload in drain(events):
                    if kind == "error":
                        raise gr.Error(f"generation failed: {payload!r}")
                    run.apply(kind, payload)
                yield run.outputs()
        finally:
            stop.set()  # the page went away or failed: end the worker too
            worker.join()


def build_demo(target, tokenizer, drafter) -> "gr.Blocks":
    """The Blocks app for a target, its tokenizer and a DSparkDrafter loaded for that target."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    import gradio as gr

    session = DemoSession(target, tokenizer, drafter)
    defaults = drafter.generation_config  # the settings generate() uses when given none
    most_drafts = drafter.config.num_draft_tokens
    with gr.Blocks(title="DSpark speculative decoding", analytics_enabled=False) as demo:
        gr.Markdown(
            "## DSpark speculative decoding\n"
            "A small drafter proposes a block of tokens; the scheduler sends a prefix of it to the target, "
            "which keeps the drafts it agrees with and adds one token of its own. The answer is the target's: "
            "drafting only makes it faster."
        )
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                prompt = gr.Textbox(
                    label="Prompt (a user chat turn)", lines=5, value=DEFAULT_PROMPT, elem_id="dspark-prompt"
                )
                prompt_count = gr.Markdown(elem_id="dspark-prompt-count")
                with gr.Row():
                    generate_button = gr.Button("Generate", variant="primary", elem_id="dspark-generate")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="dspark-stop")
                max_new_tokens = gr.Slider(1, 512, value=DEFAULT_MAX_NEW_TOKENS, step=1, label="Max new tokens")
                scheduler = gr.Radio(
                    list(SCHEDULER_CHOICES),
                    value=defaults.dspark_scheduler,
                    label="Scheduler",
                    info="auto: cost on CPUs, threshold where a block verifies as fast as one token; "
                    "full block: send every draft (threshold 0)",
                )
                threshold = gr.Slider(
                    0.0,
                    1.0,
                    value=float(defaults.assistant_confidence_threshold or 0.0),
                    step=0.05,
                    label="Confidence threshold",
                    info="send drafts up to the first confidence below this (0: no cut)",
                )
                block_cap = gr.Slider(
                    1,
                    most_drafts,
                    value=int(defaults.num_assistant_tokens),
                    step=1,
                    label="Block cap (most drafts sent per round)",
                )
                temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                compare_plain = gr.Checkbox(
                    value=True, label="Also run the target alone (checks the answer, measures the speed-up)"
                )
            with gr.Column(scale=2):
                status = gr.Markdown(label=OUTPUT_LABELS[2], elem_id="dspark-status")
                gr.HTML(legend_html(confidence_label(drafter.calibration)))
                answer_view = gr.HTML(label=OUTPUT_LABELS[0], elem_id="dspark-answer")
                metrics = gr.HTML(label=OUTPUT_LABELS[3], elem_id="dspark-metrics")
                chart = gr.HTML(label=OUTPUT_LABELS[4], elem_id="dspark-chart")
                with gr.Accordion("Rounds: what was drafted, kept, rejected and pruned", open=False):
                    rounds = gr.HTML(label=OUTPUT_LABELS[5], elem_id="dspark-rounds")
                with gr.Accordion("Plain text and data", open=False):
                    answer_text = gr.Textbox(
                        label=OUTPUT_LABELS[1], lines=6, interactive=False, elem_id="dspark-answer-text"
                    )
                    plain_text = gr.Textbox(label=OUTPUT_LABELS[6], lines=6, interactive=False, elem_id="dspark-plain")
                    details = gr.JSON(label=OUTPUT_LABELS[7])
        ui_only = dict(queue=False, api_visibility="private", show_progress="hidden")
        demo.load(session.prompt_info, prompt, prompt_count, **ui_only)
        prompt.change(session.prompt_info, prompt, prompt_count, trigger_mode="always_last", **ui_only)
        scheduler.change(lambda choice: gr.Slider(interactive=choice != FULL_BLOCK), scheduler, threshold, **ui_only)
        # Busy state: the button is disabled while a run is on (and for its queue wait), then given back;
        # Gradio's `then` does not follow a failed event (an empty prompt), hence `failure` too.
        generation = generate_button.click(
            lambda: gr.Button("Generating…", interactive=False), None, generate_button, **ui_only
        ).then(
            session.generate,
            inputs=[prompt, max_new_tokens, scheduler, threshold, block_cap, temperature, compare_plain],
            outputs=[answer_view, answer_text, status, metrics, chart, rounds, plain_text, details],
            api_name="generate",
            show_progress="hidden",
            concurrency_limit=1,
        )
        for after in (generation.then, generation.failure):
            after(lambda: gr.Button("Generate", interactive=True), None, generate_button, **ui_only)
        stop_button.click(session.stop, api_name="stop", queue=False)
    return demo


# ---------------------------------------------------------------- command line
def add_arguments(parser) -> None:
    parser.add_argument("--target", default=DEFAULT_TARGET, help="Hub id or directory ('smollm2': offline default)")
    parser.add_argument(
        "--drafter", default=None, help="Hub id or directory (default: the drafter shipped for smollm2)"
    )
    parser.add_argument("--local-files-only", action="store_true", help="never reach the Hub; use its cache only")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.set_defaults(func=run)


def port_in_use(port: int) -> InputError:
    return InputError(
        f"port {port} on 127.0.0.1 is in use (another demo?); pick a free one with --port, e.g. --port {port + 1}."
    )


def check_port_free(port: int) -> None:
    """Fail in one line before the models load, rather than with Gradio's traceback after."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no conflict
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise port_in_use(port) from None


def serve_in_background(demo) -> str:
    """Serve built Blocks on a free local port without blocking (tests, screenshots); returns the URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    demo.launch(
        server_name="127.0.0.1", server_port=port, share=False, ssr_mode=False, prevent_thread_lock=True, quiet=True
    )
    return demo.local_url


def run(args) -> None:
    """Serve the demo on 127.0.0.1:<port>, never shared."""
    check_port_free(args.port)
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer, drafter = load_pair(args.target, args.drafter, args.local_files_only)
    try:
        build_demo(target, tokenizer, drafter).launch(
            server_name="127.0.0.1", server_port=args.port, share=False, ssr_mode=False
        )
    except OSError as error:  # taken while the models loaded
        if "port" not in str(error):
            raise
        raise port_in_use(args.port) from None
