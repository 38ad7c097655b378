"""A LiveRun as the page shows it: the answer's HTML, the rounds table and chart, metrics, status, JSON.

Every value shown is read from the run's round records (the generator's own account of
each round: its source, budget, cut and the confidences the scheduler read); this module
only puts them into words and colours.
"""

from __future__ import annotations

import html
import itertools
from typing import Optional

import torch

from ...core.scheduling import AUTO_SCHEDULER
from ...core.trace import CUT_BUDGET, CUT_COST, CUT_GATE, CUT_THRESHOLD, summarize
from .state import FULL_BLOCK, AnswerToken, DraftToken, LiveRun, RoundView

# Shipped inside the legend so build_demo() looks the same however the Blocks are launched.
STYLES = """
<style>
.dspark-answer { white-space: pre-wrap; line-height: 1.75; font-size: 1.02rem; padding: 0.8rem 1rem;
  border: 1px solid var(--border-color-primary); border-radius: 8px; min-height: 3rem; }
.dspark-answer .tok, .dspark-legend .tok, .dspark-rounds .tok { border-radius: 3px; color: #1d1d1d; }
.tok-accepted { background: #d9f2d9; }
.tok-ngram { background: #fbe3b4; }
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
.dspark-rounds .source { white-space: nowrap; }
</style>
"""

CHART_COLOURS = {"accepted": "#6cc070", "ngram": "#e9a93a", "target": "#6d9be6", "tau": "#666666", "axis": "#999999"}
CHART_PLOT_WIDTH, CHART_UNIT = 520, 16  # pixels: width of the plotting area, height of one token
CHART_MARGINS = {"left": 44, "right": 78, "top": 26, "bottom": 36}
# A greedy answer may leave the target alone's only where its top two logits were this close (issue #19's bound):
# verifying a block rounds differently from one-token steps in bf16, and a near-tie can fall either way.
NEAR_TIE_STEPS = 2
SOURCE_NAMES = {"dspark": "DSpark", "ngram": "n-gram", "none": "–"}

# The page's outputs, in the order of `outputs()`; also the labels of the `generate` API endpoint's returns.
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


def confidence_label(calibrated: bool) -> str:
    return "confidence (calibrated)" if calibrated else "confidence (raw)"


def one_line(text: str) -> str:
    """Drafts and hover notes never break a line: a newline shows as ↵."""
    return text.replace("\r", "").replace("\n", "\u21b5")


def shown(confidence: Optional[float]) -> str:
    return "–" if confidence is None else f"{confidence:.2f}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def models_markdown(target, drafter) -> str:
    """What the page runs: the target's name, its dtype and device, the drafter's dtype, the CPU threads."""
    name = str(getattr(target.config, "_name_or_path", "") or type(target).__name__).rstrip("/").split("/")[-1]
    count = torch.get_num_threads()
    threads = f" · {count} CPU thread{'s' * (count != 1)}" if target.device.type == "cpu" else ""
    return (
        f"Target **{html.escape(name)}** in **{dtype_name(target.dtype)}** on {target.device} · "
        f"drafter in {dtype_name(drafter.dtype)}{threads} (`dspark demo --dtype`, `--threads` to change)"
    )


# ---------------------------------------------------------------- one round in words
def round_summary(run: LiveRun, view: RoundView) -> str:
    """What happened in a round, in words: 'drafted 7, kept 3 of 5 sent, rejected at draft 4, ...'."""
    record = view.record
    drafted, sent, kept = len(record.draft_ids), record.num_verified, record.num_accepted
    if record.cut == CUT_GATE:
        return "no draft: the cost scheduler's gate skipped drafting, which had not paid in recent rounds"
    if drafted == 0:
        if record.budget <= 0:
            return "no draft: only the target's token fits before the max-new-tokens limit"
        return "no draft: no proposal was expected to pay for its verification here"
    if record.source == "ngram":
        proposed = f"n-gram: a {record.match_length}-token match proposed {drafted}"
    else:
        proposed = f"drafted {drafted}"
    parts = [proposed, f"kept {kept} of {sent} sent" if sent else "none sent"]
    if sent > kept:
        parts.append(f"rejected at draft {kept + 1}")
    if sent < drafted:
        parts.append(f"{drafted - sent} pruned by {pruned_reason(run, view)}")
    return ", ".join(parts)


def pruned_reason(run: LiveRun, view: RoundView) -> str:
    """The record's cut, in words, with the value that made it."""
    record, sent = view.record, view.record.num_verified
    if record.cut == CUT_BUDGET:  # the budget is the block cap, or the room left before max-new-tokens if less
        if record.budget < run.settings.block_cap:
            return f"the max-new-tokens limit (room for {record.budget})"
        return f"the block cap ({record.budget})"
    if record.cut == CUT_THRESHOLD and sent < len(view.drafts) and view.drafts[sent].confidence is not None:
        label = confidence_label(run.calibrated)
        return f"the threshold: {label} {view.drafts[sent].confidence:.2f} < {run.settings.threshold_used:.2f}"
    if record.cut == CUT_COST:
        return "the cost scheduler: more drafts would not pay"
    return f"the scheduler ({record.cut})"


def target_role(view: RoundView) -> str:
    drafts, kept, sent = view.drafts, view.record.num_accepted, view.record.num_verified
    if sent > kept:
        return f"the target's token, in place of rejected draft {kept + 1} “{one_line(drafts[kept].text)}”"
    if sent:
        return f"the target's bonus token, after all {sent} drafts sent were kept"
    return "the target's token (no draft sent)"


# ---------------------------------------------------------------- HTML pieces
def answer_span(token: AnswerToken, note: str) -> str:
    title = html.escape(one_line(note))
    if token.special is not None:
        name = html.escape(token.special)
        return f'<span class="tok-special" data-token="{name}" title="{title} · special token {name}"></span>'
    return f'<span class="tok tok-{token.origin}" title="{title}">{html.escape(token.text)}</span>'


def marker_span(kind: str, note: str) -> str:
    return f'<span class="dspark-mark mark-{kind}" title="{html.escape(one_line(note))}"></span>'


def draft_span(view: RoundView, draft: DraftToken, label: str) -> str:
    value = shown(draft.confidence)
    colour = view.kept_origin if draft.fate == "accepted" else draft.fate
    return (
        f'<span class="tok tok-{colour}" title="{draft.fate} · {label} {value}">{html.escape(one_line(draft.text))}'
        f"</span><sub>{value}</sub>"
    )


def token_cell(token: AnswerToken) -> str:
    return f'<span class="tok tok-{token.origin}">{html.escape(one_line(token.special or token.text))}</span>'


def source_cell(view: Optional[RoundView]) -> str:
    if view is None or view.record.source == "none":
        return "–"
    if view.record.source == "ngram":
        return f'<span class="source tok tok-ngram">n-gram</span><br>match {view.record.match_length}'
    return '<span class="source">DSpark</span>'


def tokens_by_round(run: LiveRun) -> list[list[AnswerToken]]:
    """The answer's tokens grouped by the round that committed them; [0] is the prefill."""
    groups: list[list[AnswerToken]] = [[] for _ in range(len(run.rounds) + 1)]
    for token in run.tokens:
        groups[token.round_number].append(token)
    return groups


def answer_and_rows(run: LiveRun) -> tuple[str, list[str], list[str]]:
    """The answer's HTML, the rounds table's rows and each round's summary."""
    label = confidence_label(run.calibrated)
    groups = tokens_by_round(run)
    parts, rows, summaries = [], [], []
    for token in groups[0]:
        note = "the target's first token, from reading the prompt"
        parts.append(answer_span(token, note))
        rows.append(f"<tr><td>prefill</td><td>–</td><td>–</td><td>{token_cell(token)}</td><td>{note}</td></tr>")
    for view, tokens in zip(run.rounds, groups[1:]):
        summary = round_summary(run, view)
        summaries.append(summary)
        for k, token in enumerate(tokens):
            if k < view.kept:
                what = "n-gram draft" if view.record.source == "ngram" else "draft"
                note = f"round {view.number}: {what} {k + 1}, kept · {label} {shown(view.drafts[k].confidence)}"
            else:
                note = f"round {view.number}: {target_role(view)} · {summary}"
            parts.append(answer_span(token, note))
        left_out = {fate: "".join(d.text for d in view.drafts if d.fate == fate) for fate in ("rejected", "pruned")}
        if any(left_out.values()):  # a marker at the end of the round holds what the text leaves out
            listed = "".join(f" · {fate}: “{text}”" for fate, text in left_out.items() if text)
            kind = "rejected" if left_out["rejected"] else "pruned"
            parts.append(marker_span(kind, f"round {view.number}: {summary}{listed}"))
        block = "<wbr>".join(draft_span(view, d, label) for d in view.drafts) or "–"  # long n-gram proposals wrap
        last = token_cell(tokens[-1]) if tokens else "–"
        cells = (str(view.number), source_cell(view), block, last, html.escape(summary))
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return '<div class="dspark-answer">' + "".join(parts) + "</div>", rows, summaries


def rounds_table(rows: list[str], label: str) -> str:
    if not rows:
        return ""
    columns = ("round", "source", f"proposal, each draft with its {label}", "target's token", "what happened")
    head = "<tr>" + "".join(f"<th>{html.escape(column)}</th>" for column in columns) + "</tr>"
    return f'<div class="dspark-rounds"><table>{head}{"".join(rows)}</table></div>'


def legend_html(label: str) -> str:
    answer = (
        '<span class="tok tok-accepted">DSpark draft kept</span> <span class="tok tok-ngram">n-gram draft kept</span>'
        ' <span class="tok tok-target">target token</span>'
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
        "the value the threshold and the cost scheduler read. An n-gram round proposes what followed the same "
        "tokens earlier in the context (prompt lookup) instead of a DSpark block."
    )
    return f'{STYLES}<div class="dspark-legend">Answer: {answer}<br>Rounds: {rounds}<br>{confidence}</div>'


# ---------------------------------------------------------------- the chart and the positions table
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


def rounds_chart(views: list[RoundView]) -> str:
    """Stacked bars per round (drafts kept, by source, then the target's token), with axes and a labelled τ line."""
    if not views:
        return ""
    records = [view.record for view in views]
    tau = summarize(records).tau
    top = max(2, max(len(r.committed_ids) for r in records), int(tau) + 1)
    left, right, upper, lower = (CHART_MARGINS[side] for side in ("left", "right", "top", "bottom"))
    plot_height = top * CHART_UNIT
    base = upper + plot_height
    step = CHART_PLOT_WIDTH / len(records)
    bar = max(1.0, min(14.0, step * 0.75))
    parts = []
    for i, view in enumerate(views):
        record, kept = view.record, view.kept
        x = left + i * step + (step - bar) / 2
        kept_top = base - kept * CHART_UNIT
        target_height = (len(record.committed_ids) - kept) * CHART_UNIT
        source = SOURCE_NAMES[record.source] + " " if record.source != "none" else ""
        parts.append(
            f"<g><title>round {i + 1}: {kept} {source}drafts kept + the target's token "
            f"({len(record.draft_ids)} proposed, {record.num_verified} sent)</title>"
            f'<rect x="{x:.1f}" y="{kept_top:.1f}" width="{bar:.1f}" height="{kept * CHART_UNIT}" '
            f'fill="{CHART_COLOURS[view.kept_origin]}"/>'
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
    ]
    keys = (("accepted", "DSpark drafts kept"), ("ngram", "n-gram drafts kept"), ("target", "the target's token"))
    for offset, (colour, text) in zip(range(0, 360, 120), keys):
        parts.append(f'<rect x="{left + offset}" y="6" width="10" height="10" fill="{CHART_COLOURS[colour]}"/>')
        parts.append(svg_text(left + offset + 14, 15, text, anchor="start"))
    width, height = left + CHART_PLOT_WIDTH + right, base + lower
    return (
        f'<div class="dspark-chart"><svg viewBox="0 0 {width} {height}" width="100%" style="max-width:{width}px" '
        f'xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg></div>'
    )


def positions_table(acceptance: list[Optional[float]]) -> str:
    """Conditional acceptance per DSpark draft position, shaded by its value."""
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
        "Acceptance per DSpark draft position: how often draft k was kept, among the DSpark rounds that sent it "
        "after keeping drafts 1..k−1 (– : never reached)."
    )
    return (
        f'<table class="dspark-positions"><caption>{caption}</caption>'
        f"<tr><th>position</th>{head}</tr><tr><th>kept</th>{cells}</tr></table>"
    )


# ---------------------------------------------------------------- status, comparison, metrics
def scheduler_shown(run: LiveRun) -> str:
    if run.settings.scheduler == AUTO_SCHEDULER:
        return f"auto → {run.scheduler}" if run.scheduler else "auto"
    return "full block (threshold 0)" if run.settings.scheduler == FULL_BLOCK else run.settings.scheduler


def status_markdown(run: LiveRun) -> str:
    ngram_rounds = sum(view.record.source == "ngram" for view in run.rounds)
    ngram = f" ({ngram_rounds} n-gram)" if ngram_rounds else ""
    head = (
        f"**{run.state}** · {len(run.answer_ids)} tokens in {len(run.rounds)} rounds{ngram} · "
        f"prompt {run.prompt_length} tokens · scheduler **{scheduler_shown(run)}**"
    )
    return f"{head}\n\n{comparison(run)}"


def token_name(run: LiveRun, ids: list[int], index: int) -> str:
    if index >= len(ids):
        return "(end)"
    return f"<code>{html.escape(one_line(run.tokenizer.decode([ids[index]])))}</code>"


def comparison(run: LiveRun) -> str:
    """Is the answer the target's own? Greedy matches token for token, or parts at a near-tie; sampling may differ."""
    if not run.settings.compare_plain:
        return "The target-alone run is off: turn it on to check the answer and measure the speed-up."
    if run.stopped:
        return "Stopped, so there is no comparison with the target alone."
    if run.plain_seconds is None:
        return f"The target alone runs next on the same prompt ({len(run.plain_ids)} tokens so far)."
    index = run.first_difference()
    if index is None:
        if run.settings.sampling:
            return "Identical to the target alone, by chance: with sampling each run draws its own tokens."
        return f"✓ **Identical to the target alone**: the same {len(run.plain_ids)} tokens (greedy decoding)."
    tokens = (
        f"{token_name(run, run.answer_ids, index)} here, {token_name(run, run.plain_ids, index)} from the target alone"
    )
    if run.settings.sampling:
        return (
            f"Sampling (temperature {run.settings.temperature:g}): each run draws its own random tokens, so the texts "
            f"can differ; both follow the target's distribution (first difference at token {index + 1}: {tokens})."
        )
    difference = run.divergence()
    if difference is None:
        return (
            f"✗ **Differs from the target alone from token {index + 1} on** ({tokens}): the target alone ended first."
        )
    margin = f"margin {difference.margin:.4g}, {difference.steps:.2g} bf16 steps of its logit"
    if difference.steps <= NEAR_TIE_STEPS:
        return (
            f"≈ **Differs from the target alone from token {index + 1} on**, where the target's top two tokens "
            f"were tied ({margin}): {tokens}. Verifying a block rounds differently from one-token steps in low "
            "precision, so a tie can fall either way; every token before it is the target's own."
        )
    return (
        f"✗ **Differs from the target alone from token {index + 1} on**, where the target's top two tokens were not "
        f"tied ({margin}): {tokens}. Drafting changed the answer: please report it."
    )


def speed_up(run: LiveRun) -> tuple[str, str]:
    if not run.settings.compare_plain:
        return "speed-up –", "turn on “Also run the target alone” to measure it."
    if run.stopped:
        return "speed-up –", "not measured: the run was stopped."
    if run.plain_seconds is None or not run.plain_ids:
        return "speed-up …", "measured when the target-alone run ends."
    plain_rate = len(run.plain_ids) / run.plain_seconds
    return (
        f"speed-up ×{run.tokens_per_second() / plain_rate:.2f}",
        f"these tokens/s ÷ the target alone's {plain_rate:.1f} tokens/s, run right after on the same prompt; "
        "above ×1 drafting pays.",
    )


def metrics_html(run: LiveRun) -> str:
    records = run.records
    if not records:
        return ""
    summary = summarize(records)
    sent = sum(r.num_verified for r in records)
    kept = sum(r.num_accepted for r in records)
    rows = [
        (
            f"τ = {summary.tau:.2f}",
            "tokens committed per round: the drafts kept plus the target's own token. 1 means no draft was ever "
            f"kept; at most {run.settings.block_cap + 1} for a DSpark round here (block cap + 1).",
        ),
        (
            f"acceptance rate {summary.verify_rate:.0%}",
            f"accepted ÷ verified: the target kept {kept} of the {sent} drafts sent to it; "
            "pruned drafts never reach it and do not count.",
        ),
        (
            f"{run.tokens_per_second():.1f} tokens/s",
            "answer tokens per second of wall clock, drafter and target together "
            f"(drafting {summary.draft_seconds:.2f} s, verifying {summary.verify_seconds:.2f} s).",
        ),
        speed_up(run),
    ]
    ngram = [r for r in records if r.source == "ngram"]
    if ngram:
        rows.append(
            (
                f"{len(ngram)} n-gram round{'s' * (len(ngram) != 1)}",
                f"rounds that proposed what followed the same tokens earlier in the context; the target kept "
                f"{sum(r.num_accepted for r in ngram)} of the {sum(r.num_verified for r in ngram)} they sent.",
            )
        )
    cells = "".join(f'<b>{html.escape(value)}</b><span class="note">{html.escape(note)}</span>' for value, note in rows)
    positions = summarize(r for r in records if r.source == "dspark").acceptance_per_position
    return f'<div class="dspark-metrics">{cells}</div>{positions_table(positions)}'


def details(run: LiveRun, summaries: list[str]) -> dict:
    tokens = [
        {"text": t.special or t.text, "origin": t.origin, "round": t.round_number, "special": t.special is not None}
        for t in run.tokens
    ]
    rounds = [
        {
            "round": view.number,
            "source": view.record.source,
            "match_length": view.record.match_length,
            "budget": view.record.budget,
            "cut": view.record.cut,
            "drafted": [d.text for d in view.drafts],
            "fates": [d.fate for d in view.drafts],
            "confidences": [d.confidence for d in view.drafts],
            "committed": [run.tokenizer.decode([t]) for t in view.record.committed_ids],
            "summary": summary,
        }
        for view, summary in zip(run.rounds, summaries)
    ]
    return {"confidence": confidence_label(run.calibrated), "tokens": tokens, "rounds": rounds}


def outputs(run: LiveRun) -> tuple:
    """The page's outputs, in the order of OUTPUT_LABELS."""
    answer, rows, summaries = answer_and_rows(run)
    return (
        answer,
        run.tokenizer.decode(run.answer_ids, skip_special_tokens=True),
        status_markdown(run),
        metrics_html(run),
        rounds_chart(run.rounds),
        rounds_table(rows, confidence_label(run.calibrated)),
        run.tokenizer.decode(run.plain_ids, skip_special_tokens=True),
        details(run, summaries),
    )
