"""Gradio demo: watch a DSpark drafter propose, and the target verify, one round at a time.

`dspark demo` (or `python demo/app.py`) serves it on 127.0.0.1 only, with analytics off, so
nothing leaves the machine. Gradio is imported only when the demo is built: it is an optional
extra (`pip install dspark_hf[demo]`) and `dspark` loads this module for every command.
"""

from __future__ import annotations

import dataclasses
import html
import os
import queue
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from ..core.trace import RoundRecord, summarize
from .prompts import render_prompt
from .targets import DEFAULT_TARGET, load_pair

if TYPE_CHECKING:
    import gradio as gr

DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_PORT = 7860
WORKER_THREAD_NAME = "dspark-demo-generate"

# label -> what the legend says about it; each token span carries the CSS class tok-<label>
TOKEN_KINDS = {
    "accepted": "accepted draft token",
    "rejected": "rejected draft token (verified, not kept)",
    "bonus": "target token (correction after a rejection, bonus after a full accept)",
    "pruned": "pruned draft token (the scheduler never sent it)",
}

# Shipped inside the legend so build_demo() looks the same however the Blocks are launched.
TOKEN_STYLES = """
<style>
.dspark-tokens { white-space: pre-wrap; font-family: ui-monospace, monospace; line-height: 2; }
.dspark-tokens .tok, .dspark-legend .tok { border-radius: 3px; padding: 1px 1px; }
.tok-accepted { background: #c7ecc9; color: #12391a; }
.tok-rejected { background: #f8d0d0; color: #7d1d1d; text-decoration: line-through; }
.tok-bonus { background: #c9dcfb; color: #0d2b63; font-weight: 600; }
.tok-pruned { background: #e6e6e6; color: #6b6b6b; font-style: italic; }
.dspark-legend .tok { margin-right: 0.8em; }
</style>
"""

CHART_COLOURS = {"accepted": "#4caf50", "bonus": "#3f7fe0", "tau": "#888888"}
CHART_BAR_WIDTH, CHART_GAP, CHART_UNIT = 8, 2, 14  # pixels: bar width, gap, height per token


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
    temperature: float
    threshold: float
    block_cap: int
    compare_plain: bool

    def generate_kwargs(self, stop: threading.Event) -> dict:
        sampling = dict(do_sample=True, temperature=self.temperature) if self.temperature > 0 else dict(do_sample=False)
        return dict(
            max_new_tokens=self.max_new_tokens, stopping_criteria=StoppingCriteriaList([StopWhenSet(stop)]), **sampling
        )


def generate_both(
    target, drafter, prompt_ids: list[int], settings: Settings, events: queue.Queue, stop: threading.Event
):
    """Worker thread: the speculative run, then (optionally) the target alone; every step goes into `events`."""
    ids = torch.tensor([prompt_ids])
    common = dict(attention_mask=torch.ones_like(ids), **settings.generate_kwargs(stop))
    try:
        drafter.on_round = lambda record: events.put(("round", record))
        started = time.perf_counter()
        target.generate(
            ids,
            assistant_model=drafter,
            assistant_confidence_threshold=settings.threshold,
            num_assistant_tokens=settings.block_cap,
            streamer=TokenForwarder(lambda new: events.put(("prefill", new)), first_only=True),
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


# ---------------------------------------------------------------- tokens of a round
@dataclasses.dataclass
class ShownToken:
    text: str
    kind: str  # a TOKEN_KINDS key
    note: str  # hover text


def token_text(tokenizer, context: list[int], token_id: int, window: int = 6) -> str:
    """The text `token_id` adds after `context`: decoding a short tail keeps BPE spaces and merges right."""
    tail = context[-window:]
    before = tokenizer.decode(tail, skip_special_tokens=False)
    after = tokenizer.decode(tail + [token_id], skip_special_tokens=False)
    return after[len(before) :] if after.startswith(before) else tokenizer.decode([token_id], skip_special_tokens=False)


def round_tokens(tokenizer, context: list[int], record: RoundRecord, round_number: int) -> list[ShownToken]:
    """Accepted, rejected, the target's token, pruned: in that order, each with its hover note."""
    drafts, committed, accepted, verified = (
        record.draft_ids,
        record.committed_ids,
        record.num_accepted,
        record.num_verified,
    )

    def draft(k: int, kind: str) -> ShownToken:
        return ShownToken(
            token_text(tokenizer, context + drafts[:k], drafts[k]), kind, draft_note(record, k, round_number)
        )

    role = "bonus" if accepted == verified else "correction"
    target_text = token_text(tokenizer, context + committed[:accepted], committed[accepted])
    return (
        [draft(k, "accepted") for k in range(accepted)]
        + [draft(k, "rejected") for k in range(accepted, verified)]
        + [ShownToken(target_text, "bonus", f"round {round_number}: target's {role} token")]
        + [draft(k, "pruned") for k in range(verified, len(drafts))]
    )


def draft_note(record: RoundRecord, k: int, round_number: int) -> str:
    note = f"round {round_number}, draft {k + 1}"
    if k < len(record.confidences):
        note += f", confidence {record.confidences[k]:.2f}"
    return note


# ---------------------------------------------------------------- HTML pieces
def token_span(token: ShownToken) -> str:
    text = token.text.replace("\n", "\u21b5\n")  # a newline token stays visible
    return f'<span class="tok tok-{token.kind}" title="{html.escape(token.note)}">{html.escape(text)}</span>'


def tokens_html(tokens: list[ShownToken]) -> str:
    return '<div class="dspark-tokens">' + "".join(token_span(t) for t in tokens) + "</div>"


def legend_html() -> str:
    items = "".join(token_span(ShownToken(kind, kind, description)) for kind, description in TOKEN_KINDS.items())
    notes = "Hover a draft token for its confidence. Bars: tokens committed per round (green accepted, blue target)."
    return f'{TOKEN_STYLES}<div class="dspark-legend">{items}<br><small>{notes}</small></div>'


def chart_bar(x: int, bottom: int, tokens: int, colour: str) -> str:
    return (
        f'<rect x="{x}" y="{bottom - tokens * CHART_UNIT}" width="{CHART_BAR_WIDTH}" '
        f'height="{tokens * CHART_UNIT}" fill="{colour}"/>'
    )


def acceptance_chart(records: list[RoundRecord]) -> str:
    """One stacked bar per round (accepted drafts, then the target's token) and a dashed line at tau."""
    if not records:
        return ""
    height = max(r.num_accepted + 1 for r in records) * CHART_UNIT
    width = len(records) * (CHART_BAR_WIDTH + CHART_GAP)
    bars = []
    for i, record in enumerate(records):
        x = i * (CHART_BAR_WIDTH + CHART_GAP)
        accepted_top = height - record.num_accepted * CHART_UNIT
        tip = f"round {i + 1}: {record.num_accepted} accepted of {record.num_verified} sent"
        bars.append(
            f"<g><title>{tip}, {len(record.draft_ids)} drafted</title>"
            + chart_bar(x, height, record.num_accepted, CHART_COLOURS["accepted"])
            + chart_bar(x, accepted_top, 1, CHART_COLOURS["bonus"])
            + "</g>"
        )
    tau_y = f"{height - summarize(records).tau * CHART_UNIT:.1f}"
    tau_line = (
        f'<line x1="0" x2="{width}" y1="{tau_y}" y2="{tau_y}" stroke="{CHART_COLOURS["tau"]}" stroke-dasharray="4 3"/>'
    )
    return (
        f'<div class="dspark-chart" style="overflow-x:auto"><svg width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">{"".join(bars)}{tau_line}</svg></div>'
    )


# ---------------------------------------------------------------- one run, as the page shows it
class LiveRun:
    """The page's view of one generation, rebuilt from the events the worker sends."""

    def __init__(self, tokenizer, prompt_ids: list[int], compare_plain: bool):
        self.tokenizer = tokenizer
        self.sequence = list(prompt_ids)  # prompt + committed tokens: the context of the next round
        self.prompt_length = len(prompt_ids)
        self.compare_plain = compare_plain
        self.tokens: list[ShownToken] = []
        self.records: list[RoundRecord] = []
        self.plain_ids: list[int] = []
        self.started = time.perf_counter()
        self.speculative_seconds: Optional[float] = None
        self.plain_seconds: Optional[float] = None
        self.status = "generating"

    def apply(self, kind: str, payload) -> None:
        if kind == "prefill":
            for token_id in payload:
                self.tokens.append(ShownToken(self.text_of(token_id), "bonus", "target token from the prefill"))
                self.sequence.append(token_id)
        elif kind == "round":
            self.records.append(payload)
            self.tokens += round_tokens(self.tokenizer, self.sequence, payload, len(self.records))
            self.sequence += payload.committed_ids
        elif kind == "plain":
            self.plain_ids += payload
        elif kind == "speculative_seconds":
            self.speculative_seconds = payload
        elif kind == "plain_seconds":
            self.plain_seconds = payload

    def text_of(self, token_id: int) -> str:
        return token_text(self.tokenizer, self.sequence, token_id)

    @property
    def generated(self) -> int:
        return len(self.sequence) - self.prompt_length

    def tokens_per_second(self) -> float:
        seconds = (
            self.speculative_seconds if self.speculative_seconds is not None else time.perf_counter() - self.started
        )
        return self.generated / seconds if seconds > 0 else 0.0

    def stats_markdown(self) -> str:
        summary = summarize(self.records)
        lines = [
            f"**{self.status}** · {self.generated} tokens in {summary.rounds} rounds · "
            f"**{self.tokens_per_second():.1f} tokens/s**",
            f"τ (tokens per round, target's included) **{summary.tau:.2f}** · verify rate {summary.verify_rate:.2f} · "
            f"draft {summary.draft_seconds:.2f} s / verify {summary.verify_seconds:.2f} s",
        ]
        if self.plain_seconds:
            plain_rate = len(self.plain_ids) / self.plain_seconds
            lines.append(
                f"plain generate(): {plain_rate:.1f} tokens/s · "
                f"speed-up **×{self.tokens_per_second() / plain_rate:.2f}**"
            )
        elif self.compare_plain:
            lines.append(f"plain generate(): {len(self.plain_ids)} tokens so far")
        return "\n\n".join(lines)

    def token_pairs(self) -> list[list[str]]:
        return [[token.text, token.kind] for token in self.tokens]

    def outputs(self) -> tuple:
        plain_text = self.tokenizer.decode(self.plain_ids, skip_special_tokens=False)
        return (
            tokens_html(self.tokens),
            self.stats_markdown(),
            acceptance_chart(self.records),
            plain_text,
            self.token_pairs(),
        )


# ---------------------------------------------------------------- the app
class DemoSession:
    """The models, and the one generation the app runs at a time (the drafter's on_round hook is shared)."""

    def __init__(self, target, tokenizer, drafter):
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.stop_event = threading.Event()

    def stop(self) -> None:
        self.stop_event.set()

    def generate(self, prompt, max_new_tokens, temperature, confidence_threshold, block_cap, compare_plain):
        """Yields the page outputs once per finished round (and per plain token) until generate() returns."""
        import gradio as gr

        prompt_ids = render_prompt(self.tokenizer, prompt)
        settings = Settings(
            int(max_new_tokens), float(temperature), float(confidence_threshold), int(block_cap), bool(compare_plain)
        )
        stop = self.stop_event = threading.Event()
        events: queue.Queue = queue.Queue()
        worker = threading.Thread(
            target=generate_both,
            args=(self.target, self.drafter, prompt_ids, settings, events, stop),
            name=WORKER_THREAD_NAME,
            daemon=True,
        )
        run = LiveRun(self.tokenizer, prompt_ids, settings.compare_plain)
        worker.start()
        try:
            yield run.outputs()
            while (event := events.get())[0] != "end":
                kind, payload = event
                if kind == "error":
                    raise gr.Error(f"generation failed: {payload!r}")
                run.apply(kind, payload)
                yield run.outputs()
            run.status = "stopped" if event[1] else "done"
            yield run.outputs()
        finally:
            stop.set()  # the page went away or failed: end the worker too
            worker.join()


def build_demo(target, tokenizer, drafter) -> "gr.Blocks":
    """The Blocks app for a target, its tokenizer and a DSparkDrafter loaded for that target."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    import gradio as gr

    session = DemoSession(target, tokenizer, drafter)
    most_drafts = drafter.config.num_draft_tokens
    default_threshold = float(drafter.generation_config.assistant_confidence_threshold or 0.0)
    with gr.Blocks(title="DSpark speculative decoding", analytics_enabled=False) as demo:
        gr.Markdown(
            "## DSpark speculative decoding, round by round\n"
            "The drafter proposes a block, the confidence scheduler sends a prefix of it to the target, "
            "the target keeps what it agrees with and adds one token of its own."
        )
        with gr.Row():
            with gr.Column(scale=1):
                prompt = gr.Textbox(
                    label="Prompt (a user chat turn)", lines=4, value="What is 17 * 23? Explain step by step."
                )
                max_new_tokens = gr.Slider(1, 512, value=DEFAULT_MAX_NEW_TOKENS, step=1, label="Max new tokens")
                temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                threshold = gr.Slider(0.0, 1.0, value=default_threshold, step=0.05, label="Confidence threshold")
                block_cap = gr.Slider(
                    1, most_drafts, value=most_drafts, step=1, label="Block cap (drafts sent per round)"
                )
                compare_plain = gr.Checkbox(label="Also run the target alone, for the speed-up")
                with gr.Row():
                    generate_button = gr.Button("Generate", variant="primary", elem_id="dspark-generate")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="dspark-stop")
            with gr.Column(scale=2):
                gr.HTML(legend_html())
                tokens_view = gr.HTML(elem_id="dspark-tokens")
                stats = gr.Markdown(elem_id="dspark-stats")
                chart = gr.HTML(elem_id="dspark-chart")
                plain_text = gr.Textbox(label="Target alone (when compared)", lines=4, interactive=False)
                with gr.Accordion("Tokens and labels", open=False):
                    pairs = gr.JSON(label="[token, label] pairs")
        generate_button.click(
            session.generate,
            inputs=[prompt, max_new_tokens, temperature, threshold, block_cap, compare_plain],
            outputs=[tokens_view, stats, chart, plain_text, pairs],
            api_name="generate",
            show_progress="hidden",
            concurrency_limit=1,
        )
        stop_button.click(session.stop, api_name="stop", queue=False)
    return demo


# ---------------------------------------------------------------- command line
def add_arguments(parser) -> None:
    parser.add_argument("--target", default=DEFAULT_TARGET, help="Hub id or directory ('smollm2': offline default)")
    parser.add_argument(
        "--drafter", default=None, help="Hub id or directory (default: the drafter shipped for smollm2)"
    )
    parser.add_argument("--local-files-only", action="store_true", help="never reach the Hub; use its cache only")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.set_defaults(func=run)


def run(args) -> None:
    """Serve the demo on 127.0.0.1:<port>, never shared."""
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer, drafter = load_pair(args.target, args.drafter, args.local_files_only)
    build_demo(target, tokenizer, drafter).launch(
        server_name="127.0.0.1", server_port=args.port, share=False, ssr_mode=False
    )
