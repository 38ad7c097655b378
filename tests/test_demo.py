"""The Gradio demo: its views, its API endpoint (gradio_client) and its page in headless Chromium (Playwright)."""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

import pytest
import torch
from transformers import LogitsProcessorList

from conftest import VOCAB, tiny_target, write_bigram_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.core.calibration import Calibration
from dspark_hf.core.scheduling import CostTable
from dspark_hf.core.trace import RoundRecord
from dspark_hf.tools.cli import main as dspark_main
from dspark_hf.tools.demo import (
    DEFAULT_MAX_NEW_TOKENS,
    MAX_PROMPT_TOKENS,
    OUTPUT_LABELS,
    WORKER_THREAD_NAME,
    DemoSession,
    build_demo,
    serve_in_background,
)
from dspark_hf.tools.demo import app as demo_app
from dspark_hf.tools.demo.render import CHART_COLOURS, confidence_label, legend_html, models_markdown, outputs
from dspark_hf.tools.demo.state import LiveRun, Settings
from dspark_hf.tools.demo.worker import TopTwoScores, generate_both
from dspark_hf.tools.prompts import render_prompt

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# One word per id of the tiny vocabulary; '<b>' and '&' check that token text is escaped, not rendered.
WORDS = ["<|im_start|>", "<|im_end|>", "[UNK]", "user", "assistant", "the", "cat", "sat", "on", "mat", "a", "dog"]
WORDS += ["ran", "to", "park", "and", "it", "was", "big", "red", "<b>", "&", "fast", "<mask>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|> {{ message['role'] }} {{ message['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
PROMPT = "the cat sat on the mat"
# The tiny drafter's confidences sit mostly between 0.75 and 1: this threshold prunes some drafts of most rounds.
PRUNING_THRESHOLD = 0.9


def tiny_tokenizer():
    """An offline word-level tokenizer over the tiny models' 24 ids, with a ChatML-like template."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    assert len(WORDS) == VOCAB
    backend = Tokenizer(WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<mask>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """The tiny target, tokenizer and bigram drafter; a flat cost table makes "auto" pick the threshold scheduler."""
    target = tiny_target("qwen3")
    drafter = DSparkDrafter.from_pretrained(write_bigram_deepspec(target, tmp_path_factory.mktemp("drafter")), target)
    drafter.cost_table = CostTable(0.001, [0.01] * (drafter.config.num_draft_tokens + 1))
    return target, tiny_tokenizer(), drafter


@pytest.fixture(scope="module")
def served(tiny_pair):
    """The demo on the tiny pair, served on 127.0.0.1 for the whole module."""
    demo = build_demo(*tiny_pair)
    serve_in_background(demo)
    yield demo, tiny_pair
    demo.close()


@pytest.fixture(scope="module")
def greedy_answer(tiny_pair) -> str:
    """What the target alone answers to PROMPT with the page's defaults (greedy), as text without special tokens."""
    target, tokenizer, _ = tiny_pair
    prompt_ids = render_prompt(tokenizer, PROMPT)
    output = target.generate(torch.tensor([prompt_ids]), max_new_tokens=DEFAULT_MAX_NEW_TOKENS, do_sample=False)[0]
    return tokenizer.decode(output[len(prompt_ids) :], skip_special_tokens=True)


# ---------------------------------------------------------------- the views, from hand-made rounds
class PieceTokenizer:
    """Each id decodes to a fixed piece of text, so rounds can hold newlines, a special token and markup."""

    PIECES = ["<|im_end|>", "Hello", " world", "\n", " again", "!", " <b>&"]
    all_special_ids = [0]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.PIECES[i] for i in ids if not (skip_special_tokens and i in self.all_special_ids))

    def convert_ids_to_tokens(self, token_id):
        return self.PIECES[token_id]


def record(position, drafts, confidences, budget, sent, cut, kept, committed, calibrated=None, **fields):
    """A DSpark round as the generator reports it (calibrated = raw unless given)."""
    fields = {"source": "dspark" if drafts else "none", **fields}
    calibrated = list(confidences) if calibrated is None else calibrated
    return RoundRecord(
        position=position, draft_ids=drafts, confidences=confidences, calibrated=calibrated, budget=budget,
        num_verified=sent, cut=cut, num_accepted=kept, committed_ids=committed, draft_seconds=0.01,
        verify_seconds=0.02, **fields,
    )


def live_run(records, max_new_tokens=9, block_cap=4, calibrated=False) -> LiveRun:
    """Prompt 'Hello' (id 1), prefill ' world' (id 2); greedy, threshold 0.5."""
    run = LiveRun(PieceTokenizer(), [1], Settings(max_new_tokens, "threshold", 0.5, block_cap, 0.0, True), calibrated)
    run.apply("prefill", [2])
    for r in records:
        run.apply("round", r)
    run.apply("speculative_seconds", 0.1)
    return run


def hand_made_run(calibrated_values=None) -> LiveRun:
    """Max 9 new tokens, threshold 0.5, cap 4: a rejection and a threshold cut, a threshold cut, the length cut."""
    first_calibrated = calibrated_values or [0.9, 0.8, 0.3, 0.9]
    return live_run(
        [
            # draft '\n' rejected; 2 pruned by the threshold at c = 0.3
            record(1, [2, 3, 4, 5], [0.9, 0.8, 0.3, 0.9], 4, 2, "threshold", 1, [2, 6], first_calibrated),
            # '\n', <|im_end|>, '!' kept; bonus ' world'
            record(3, [3, 0, 5, 4], [0.9, 0.9, 0.9, 0.2], 4, 3, "threshold", 3, [3, 0, 5, 2]),
            record(7, [4, 5, 5, 5], [0.9, 0.9, 0.9, 0.9], 1, 1, "budget", 1, [4, 5]),  # one draft fits
        ],
        calibrated=calibrated_values is not None,
    )


class VisibleText(HTMLParser):
    """The text a browser shows for an HTML fragment (no CSS generated content)."""

    def __init__(self, markup: str):
        super().__init__()
        self.text = ""
        self.feed(markup)

    def handle_data(self, data):
        self.text += data


def test_answer_is_the_committed_text_and_drafts_stay_out_of_it():
    answer, answer_text, status, metrics, chart, rounds, _, details = outputs(hand_made_run())

    assert VisibleText(answer).text == answer_text == " world world <b>&\n! world again!"
    assert set(re.findall(r'class="([^"]*)"', answer)) == {  # no rejected or pruned draft in the text flow
        "dspark-answer",
        "tok tok-accepted",
        "tok tok-target",
        "tok-special",
        "dspark-mark mark-rejected",
        "dspark-mark mark-pruned",
    }
    assert 'class="tok-special" data-token="&lt;|im_end|&gt;"' in answer  # a badge, not text
    assert answer.count("dspark-mark mark-rejected") == 1 and answer.count("dspark-mark mark-pruned") == 2
    assert "rejected: “\u21b5”" in answer  # the marker's hover names the rejected newline draft

    assert '<span class="tok tok-rejected" title="rejected · confidence (raw) 0.80">\u21b5</span>' in rounds
    assert "\n" not in rounds  # a drafted newline never breaks the table's layout
    assert "rejected at draft 2, 2 pruned by the threshold: confidence (raw) 0.30 &lt; 0.50" in rounds
    assert "kept 1 of 1 sent, 3 pruned by the max-new-tokens limit (room for 1)" in rounds
    assert [t["origin"] for t in details["tokens"]] == ["target", "accepted", "target"] + ["accepted"] * 3 + [
        "target",
        "accepted",
        "target",
    ]
    assert [r["cut"] for r in details["rounds"]] == ["threshold", "threshold", "budget"]
    assert "τ = 2.67" in metrics and "acceptance rate 83%" in metrics  # 8 tokens in 3 rounds; 5 kept of 6 sent
    assert "τ = 2.67" in chart and ">round<" in chart and ">tokens committed<" in chart
    assert "scheduler **threshold**" in status


def test_confidences_shown_are_the_calibrated_ones_the_scheduler_read():
    calibrated = [0.8, 0.7, 0.45, 0.8]  # the record's own: not the raw 0.9, 0.8, 0.3, 0.9
    *_, rounds, _, details = outputs(hand_made_run(calibrated))
    assert details["confidence"] == "confidence (calibrated)"
    assert details["rounds"][0]["confidences"] == calibrated
    assert "pruned by the threshold: confidence (calibrated) 0.45 &lt; 0.50" in rounds
    assert "confidence (calibrated)" in legend_html(confidence_label(True))
    assert "confidence (raw)" in legend_html(confidence_label(False))


def test_each_cut_is_told_from_the_record_not_worked_out_again():
    """Confidences that would explain a threshold cut, in rounds the records say were cut by something else.

    The second round's position leaves room for 36 drafts: only its record's budget says the limit cut it."""
    run = live_run(
        [
            record(1, [3, 4, 5, 6], [0.9, 0.3, 0.9, 0.9], 4, 1, "cost", 1, [3, 2]),
            record(3, [3, 4, 5, 6], [0.9, 0.9, 0.3, 0.9], 2, 2, "budget", 2, [3, 4, 2]),
            record(6, [3, 4, 5, 6, 3], [0.9, 0.9, 0.9, 0.9, 0.3], 4, 4, "budget", 4, [3, 4, 5, 6, 2]),
            record(11, [], [], 4, 0, "gate", 0, [2]),
        ],
        max_new_tokens=40,
    )
    assert [r["summary"] for r in outputs(run)[-1]["rounds"]] == [
        "drafted 4, kept 1 of 1 sent, 3 pruned by the cost scheduler: more drafts would not pay",
        "drafted 4, kept 2 of 2 sent, 2 pruned by the max-new-tokens limit (room for 2)",
        "drafted 5, kept 4 of 4 sent, 1 pruned by the block cap (4)",
        "no draft: the cost scheduler's gate skipped drafting, which had not paid in recent rounds",
    ]


def test_ngram_rounds_are_coloured_apart_in_the_text_the_table_the_chart_and_the_legend():
    run = live_run(
        [
            record(1, [4, 5], [0.9, 0.9], 4, 2, "whole", 2, [4, 5, 6]),
            record(4, [4, 5, 6, 4], [], 8, 4, "whole", 3, [4, 5, 6, 2], source="ngram", match_length=3),
        ],
        max_new_tokens=40,
    )
    answer, _, status, metrics, chart, rounds, _, details = outputs(run)
    assert answer.count('class="tok tok-accepted"') == 2 and answer.count('class="tok tok-ngram"') == 3
    assert "round 2: n-gram draft 1, kept" in answer
    assert '<span class="source tok tok-ngram">n-gram</span><br>match 3' in rounds
    assert '<span class="source">DSpark</span>' in rounds
    assert rounds.count('class="tok tok-ngram" title="accepted') == 3 and 'class="tok tok-rejected"' in rounds
    assert "n-gram: a 3-token match proposed 4, kept 3 of 4 sent, rejected at draft 4" in rounds
    assert f'fill="{CHART_COLOURS["ngram"]}"' in chart and "n-gram drafts kept" in chart
    assert "(1 n-gram)" in status and "1 n-gram round" in metrics
    assert [(r["source"], r["match_length"]) for r in details["rounds"]] == [("dspark", 0), ("ngram", 3)]
    assert [t["origin"] for t in details["tokens"]].count("ngram") == 3
    legend = legend_html(confidence_label(False))
    colours = {kind: re.search(rf"\.tok-{kind} {{ background: (#\w+);", legend).group(1) for kind in
               ("accepted", "ngram", "target", "rejected", "pruned")}
    assert len(set(colours.values())) == 5 and 'class="tok tok-ngram">n-gram draft kept' in legend


# ---------------------------------------------------------------- the identity check
def finish_with_plain(run: LiveRun, plain_ids: list[int], top_two: list[tuple[float, float]]) -> str:
    for kind, payload in (("plain", plain_ids), ("plain_top_two", top_two), ("plain_seconds", 0.2), ("end", False)):
        run.apply(kind, payload)
    return outputs(run)[2]


def test_identity_check_says_identical_only_when_the_answers_are():
    run = hand_made_run()
    status = finish_with_plain(run, run.answer_ids, [(10.0, 5.0)] * 9)
    assert "✓ **Identical to the target alone**: the same 9 tokens" in status


@pytest.mark.parametrize("runner_up, verdict", [(9.9375, "tied"), (9.0, "not tied")])
def test_identity_check_names_the_first_difference_and_the_plain_runs_own_margin_there(runner_up, verdict):
    """The target alone parts at token 5 (index 4); its top two scores there are 1 or 16 bf16 steps apart."""
    run = hand_made_run()
    plain = run.answer_ids[:4] + [5] * 5  # '!' where the answer has <|im_end|>
    top_two = [(10.0, 5.0)] * 9  # 80 bf16 steps everywhere else: a margin read at the wrong step is no tie
    top_two[4] = (10.0, runner_up)
    status = finish_with_plain(run, plain, top_two)
    assert "**Differs from the target alone from token 5 on**" in status
    assert "<code>&lt;|im_end|&gt;</code> here, <code>!</code> from the target alone" in status
    if verdict == "tied":
        assert "top two tokens were tied (margin 0.0625, 1 bf16 steps of its logit)" in status, status
    else:
        assert "were not tied (margin 1, 16 bf16 steps of its logit)" in status and "please report" in status, status


# ---------------------------------------------------------------- the worker and real runs
def test_worker_streams_this_calls_round_records_and_the_plain_runs_own_scores(tiny_pair):
    target, tokenizer, drafter = tiny_pair
    prompt_ids = render_prompt(tokenizer, PROMPT)
    settings = Settings(24, "threshold", PRUNING_THRESHOLD, drafter.config.num_draft_tokens, 0.0, True, False)
    events: queue.Queue = queue.Queue()
    generate_both(target, drafter, prompt_ids, settings, events, threading.Event())
    sent = list(events.queue)
    assert ("error" not in dict(sent)), sent
    rounds = [payload for kind, payload in sent if kind == "round"]
    assert rounds and rounds == list(drafter.last_trace)  # the generator's own records of this very call
    assert ("scheduler", "threshold") in sent and any(r.cut == "threshold" for r in rounds)
    plain = [token for kind, payload in sent if kind == "plain" for token in payload]
    (top_two,) = [payload for kind, payload in sent if kind == "plain_top_two"]
    replay = target.generate(
        torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False, output_logits=True,
        return_dict_in_generate=True,
    )
    assert plain == replay.sequences[0, len(prompt_ids) :].tolist()
    assert top_two == [tuple(step[0].topk(2).values.tolist()) for step in replay.logits]


def test_top_two_scores_are_the_best_two_of_each_step():
    scores = TopTwoScores()
    LogitsProcessorList([scores])(None, torch.tensor([[0.5, 3.0, -1.0, 2.5]]))
    LogitsProcessorList([scores])(None, torch.tensor([[7.0, 3.0, 7.0, 2.5]]))
    assert scores.pairs() == [(3.0, 2.5), (7.0, 7.0)]


def test_shown_confidences_explain_every_threshold_cut_of_a_real_run(tiny_pair):
    """With strong STS temperatures the raw and calibrated cuts differ; the shown values must explain each cut."""
    target, tokenizer, drafter = tiny_pair
    drafter.calibration = Calibration(temperatures=[3.0] * drafter.config.num_draft_tokens)
    try:
        session = DemoSession(target, tokenizer, drafter)
        *_, last = session.generate(PROMPT, 48, "threshold", 0.7, drafter.config.num_draft_tokens, 0.0, False)
    finally:
        drafter.calibration = None
    details = last[-1]
    assert details["confidence"] == "confidence (calibrated)"
    assert [r["confidences"] for r in details["rounds"]] == [r.calibrated for r in drafter.last_trace]
    cuts = 0
    for round_ in details["rounds"]:
        sent = sum(fate != "pruned" for fate in round_["fates"])
        assert all(c >= 0.7 for c in round_["confidences"][:sent]), round_
        if round_["cut"] == "threshold":
            assert "pruned by the threshold" in round_["summary"] and round_["confidences"][sent] < 0.7, round_
            cuts += 1
    assert cuts > 0


def test_ngram_rounds_of_a_real_run_are_shown_as_the_generator_reported_them(tiny_pair):
    """A draft pass that costs 5 verify steps makes the n-gram source win most rounds of the tiny target's loops."""
    target, tokenizer, drafter = tiny_pair
    table, drafter.cost_table = drafter.cost_table, CostTable(0.05, [0.01] * 40)
    try:
        session = DemoSession(target, tokenizer, drafter)
        *_, last = session.generate(PROMPT, 64, "threshold", 0.0, drafter.config.num_draft_tokens, 0.0, True, True)
    finally:
        drafter.cost_table = table
    records, details = list(drafter.last_trace), last[-1]
    assert "Identical to the target alone" in last[2]
    assert [(r["source"], r["match_length"], r["cut"]) for r in details["rounds"]] == [
        (r.source, r.match_length, r.cut) for r in records
    ]
    ngram_kept = sum(r.num_accepted for r in records if r.source == "ngram")
    assert ngram_kept > 0 and [t["origin"] for t in details["tokens"]].count("ngram") == ngram_kept
    shown_as_text = sum(t["origin"] == "ngram" and not t["special"] for t in details["tokens"])  # not badges
    assert last[0].count('class="tok tok-ngram"') == shown_as_text > 0


def test_the_page_names_the_dtype_it_runs(tiny_pair):
    _, _, drafter = tiny_pair
    line = models_markdown(tiny_target("qwen3").to(torch.bfloat16), drafter)
    assert "in **bfloat16** on cpu" in line and "drafter in float32" in line and "--dtype" in line


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_demo_command_takes_the_shared_model_options(monkeypatch):
    seen = {}

    def load(args):
        seen.update(dtype=args.dtype, threads=args.threads, target=args.target)
        raise SystemExit("loaded")

    monkeypatch.setattr(demo_app, "load_pair_from_args", load)
    with pytest.raises(SystemExit, match="loaded"):
        dspark_main(["demo", "--dtype", "bfloat16", "--threads", "1", "--port", str(free_port())])
    assert seen == {"dtype": "bfloat16", "threads": 1, "target": "smollm2"}


def test_prompt_count_and_limits(tiny_pair):
    session = DemoSession(*tiny_pair)
    assert session.prompt_info(PROMPT).startswith(f"{len(render_prompt(tiny_pair[1], PROMPT))} prompt tokens")
    assert session.prompt_info("  ") == "Type a prompt to start."
    assert f"over this demo's limit of {MAX_PROMPT_TOKENS}" in session.prompt_info("the cat " * MAX_PROMPT_TOKENS)


def test_port_in_use_is_a_one_line_error_naming_port(monkeypatch):
    monkeypatch.setattr(demo_app, "load_pair_from_args", lambda args: pytest.fail("the models loaded first"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            dspark_main(["demo", "--port", str(port)])
    message = str(exit_.value.code)
    assert message.startswith(f"dspark demo: error: port {port} ") and "--port" in message and "\n" not in message


def test_the_demo_says_where_it_runs_and_never_suggests_sharing(tiny_pair, monkeypatch, capfd):
    import gradio

    monkeypatch.setattr(demo_app, "load_pair_from_args", lambda args: tiny_pair)
    monkeypatch.setattr(gradio.Blocks, "block_thread", lambda demo: demo.close())  # Ctrl-C at once
    port = free_port()
    dspark_main(["demo", "--port", str(port)])
    printed = capfd.readouterr().out
    assert f"dspark demo: running on http://127.0.0.1:{port}/" in printed and "share" not in printed, printed


# ---------------------------------------------------------------- the API endpoint
def test_generate_endpoint_has_named_outputs_and_the_plain_answer(served, greedy_answer):
    from gradio_client import Client

    demo, _ = served
    client = Client(demo.local_url, verbose=False)
    returns = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["returns"]
    assert tuple(output["label"] for output in returns) == OUTPUT_LABELS

    outputs_ = dict(zip(OUTPUT_LABELS, client.predict(PROMPT, api_name="/generate")))  # the page's defaults
    assert outputs_["Answer (plain text)"] == greedy_answer
    assert outputs_["Target alone (plain text)"] == outputs_["Answer (plain text)"]
    status = outputs_["Status and comparison with the target alone"]
    assert "**done**" in status and "Identical to the target alone" in status and "auto → threshold" in status
    assert "speed-up ×" in outputs_["Metrics"] and "<svg" in outputs_["Tokens committed per round (chart)"]
    data = outputs_["Tokens and rounds (JSON)"]
    assert {token["origin"] for token in data["tokens"]} == {"accepted", "target"}
    assert "rejected" in {fate for round_ in data["rounds"] for fate in round_["fates"]}

    *_, status, _, _, _, _, _ = client.predict(PROMPT, max_new_tokens=16, temperature=1.0, api_name="/generate")
    assert "Sampling (temperature 1)" in status or "by chance" in status

    for prompt, message in (("", "Type a prompt first"), ("the cat " * MAX_PROMPT_TOKENS, "at most")):
        with pytest.raises(Exception, match=message):
            client.predict(prompt, api_name="/generate")


# ---------------------------------------------------------------- the browser, fetched only for these tests
SETUP_BROWSER = ROOT / "scripts" / "setup_browser.sh"


def find_chromium(**environ: str) -> tuple[Optional[str], str]:
    """scripts/setup_browser.sh's Chromium (found, or installed where it can be), or None and its one-line why."""
    result = subprocess.run(
        ["bash", str(SETUP_BROWSER)], capture_output=True, text=True,
        env={**os.environ, "PYTHON": sys.executable, **environ},
    )
    if result.returncode == 0:
        return result.stdout.strip().splitlines()[-1], ""
    lines = result.stderr.strip().splitlines()
    return None, lines[-1] if lines else f"{SETUP_BROWSER} exited with {result.returncode}"


@pytest.fixture(scope="session")
def chromium() -> str:
    path, why = find_chromium()
    if path is None:
        pytest.skip(why)
    return path


def test_the_demo_setup_installs_no_browser():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    commands = [line for line in setup.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in commands if re.search(r"apt-get|chromium|playwright install", line)], setup


def test_a_browser_that_cannot_be_had_is_one_line_to_skip_with():
    path, why = find_chromium(DSPARK_CHROMIUM="/nonexistent/chromium")
    assert path is None and "\n" not in why
    assert why.startswith("no Chromium for the browser tests: DSPARK_CHROMIUM=/nonexistent/chromium is not"), why


# ---------------------------------------------------------------- the page, in Chromium
@pytest.fixture()
def slow_target(served):
    """Each forward of the tiny target takes 30 ms, so rounds arrive one by one as on a real model."""
    _, (target, _, _) = served
    handle = target.register_forward_pre_hook(lambda module, args: time.sleep(0.03))
    yield target
    handle.remove()


def test_browser_answer_reads_as_text_with_drafts_aside(served, greedy_answer, slow_target, chromium, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    demo, (_, tokenizer, _) = served
    origin = urlparse(demo.local_url).netloc
    outside_requests = []
    screenshots = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on(
            "request",
            lambda request: urlparse(request.url).netloc in (origin, "") or outside_requests.append(request.url),
        )

        def screenshot(name: str) -> None:
            path = tmp_path / f"{name}.png"
            page.screenshot(path=str(path), full_page=True)
            screenshots.append(str(path))

        page.goto(demo.local_url)
        expect(page.locator("#dspark-prompt-count")).to_contain_text("prompt tokens")  # the page's first update
        expect(page.locator("#dspark-models")).to_contain_text("in float32 on cpu")
        generate, stop = page.locator("#dspark-generate"), page.locator("#dspark-stop")
        prompt = page.get_by_label("Prompt (a user chat turn)")
        count = page.locator("#dspark-prompt-count")

        prompt.fill("")
        expect(count).to_contain_text("Type a prompt")
        generate.click()
        expect(page.get_by_text("Type a prompt first: the prompt box is empty.")).to_be_visible()
        expect(generate).to_be_enabled()
        screenshot("empty-prompt")
        page.locator(".toast-close").click()  # out of the next screenshots

        prompt.fill(PROMPT)
        expect(count).to_contain_text(f"{len(render_prompt(tokenizer, PROMPT))} prompt tokens")
        set_number(page, "Confidence threshold", PRUNING_THRESHOLD)
        count_token_updates(page)
        generate.click()
        expect(generate).to_be_disabled()  # busy: a second click cannot queue a second run
        expect(generate).to_have_text("Generating…")
        expect(page.locator("#dspark-status")).to_contain_text("done", timeout=60_000)
        expect(generate).to_be_enabled()
        counts = page.evaluate("window.dsparkTokenCounts")
        print(f"\ntoken spans on screen after each update: {counts}")
        assert len(counts) >= 3 and counts == sorted(counts), counts  # grew round by round, not all at once

        answer = page.locator("#dspark-answer .dspark-answer")
        assert answer.inner_text() == greedy_answer
        assert answer.locator(".tok-rejected, .tok-pruned").count() == 0
        expect(page.locator("#dspark-status")).to_contain_text("Identical to the target alone")
        assert "rejected: “" in answer.locator(".mark-rejected").first.get_attribute("title")
        assert "pruned: “" in answer.locator(".mark-pruned").first.get_attribute("title")
        assert "confidence (raw)" in answer.locator(".tok-accepted").first.get_attribute("title")

        page.get_by_text("Rounds: what was drafted, kept, rejected and pruned").click()
        table = page.locator("#dspark-rounds")
        expect(table.locator(".tok-pruned").first).to_be_visible()
        colours = {
            kind: where.locator(f".tok-{kind}").first.evaluate("e => getComputedStyle(e).backgroundColor")
            for kind, where in (("accepted", answer), ("target", answer), ("rejected", table), ("pruned", table))
        }
        legend = page.locator(".dspark-legend")
        colours["ngram"] = legend.locator(".tok-ngram").evaluate("e => getComputedStyle(e).backgroundColor")
        assert len(set(colours.values())) == 5, colours
        struck = table.locator(".tok-rejected").first.evaluate("e => getComputedStyle(e).textDecorationLine")
        assert struck == "line-through"
        for words in ("τ =", "acceptance rate", "tokens/s", "speed-up ×"):
            expect(page.locator("#dspark-metrics")).to_contain_text(words)
        labels = page.locator("#dspark-chart svg text").all_text_contents()
        assert {"round", "tokens committed"} <= set(labels) and any(label.startswith("τ = ") for label in labels)
        screenshot("answer")

        set_number(page, "Max new tokens", 400)
        generate.click()
        expect(page.locator("#dspark-status")).to_contain_text("generating", timeout=30_000)
        stop.click()
        expect(page.locator("#dspark-status")).to_contain_text("stopped", timeout=30_000)
        expect(generate).to_be_enabled()
        assert answer.locator(".tok").count() < 400
        screenshot("stopped")
        browser.close()
    print("browser screenshots: " + ", ".join(screenshots))
    assert not any(thread.name == WORKER_THREAD_NAME for thread in threading.enumerate())
    assert outside_requests == []


def set_number(page, label: str, value: float) -> None:
    """Type into a slider's number box, as a user would."""
    box = page.get_by_role("spinbutton", name=f"number input for {label}")
    box.fill(f"{value:g}")
    box.press("Tab")


def count_token_updates(page) -> None:
    """Record in the page every distinct number of token spans the answer shows."""
    page.locator("#dspark-answer").wait_for(state="attached")
    page.evaluate(
        """() => {
            const view = document.querySelector('#dspark-answer');
            window.dsparkTokenCounts = [];
            new MutationObserver(() => {
                const counts = window.dsparkTokenCounts;
                const shown = view.querySelectorAll('.tok').length;
                if (shown && counts[counts.length - 1] !== shown) counts.push(shown);
            }).observe(view, {subtree: true, childList: true, characterData: true});
        }"""
    )


def test_demo_compile_compiles_both_runs_before_serving_and_hands_the_session_the_same_fields(tiny_pair, monkeypatch):
    warmed, built = [], {}
    monkeypatch.setattr(demo_app, "load_pair_from_args", lambda args: tiny_pair)
    monkeypatch.setattr(demo_app, "compile_before_the_clock", lambda target, ids, who, **kw: warmed.append(kw))

    def build(target, tokenizer, drafter, compiled=None):
        built.update(compiled or {})
        raise SystemExit("built")

    monkeypatch.setattr(demo_app, "build_demo", build)
    with pytest.raises(SystemExit, match="built"):
        dspark_main(["demo", "--compile", "--port", str(free_port())])
    assert [("assistant_model" in kw) for kw in warmed] == [True, False]  # the drafted run's lengths, then plain's
    assert all(kw["cache_implementation"] == "static" and kw["compile_config"] is built["compile_config"]
               for kw in warmed)
    built.clear()
    with pytest.raises(SystemExit, match="built"):
        dspark_main(["demo", "--port", str(free_port())])
    assert len(warmed) == 2 and built == {}  # without the flag nothing compiles


def test_the_worker_runs_both_runs_on_the_compiled_target_it_is_given(tiny_pair, monkeypatch):
    import dspark_hf.tools.demo.worker as worker

    calls = []
    monkeypatch.setattr(worker, "timed_generate", lambda target, ids, **kw: calls.append(kw) or ([], 0.1))
    target, tokenizer, drafter = tiny_pair
    settings = Settings(8, "threshold", PRUNING_THRESHOLD, drafter.config.num_draft_tokens, 0.0, True, False)
    compiled = {"cache_implementation": "static", "compile_config": object()}
    generate_both(target, drafter, render_prompt(tokenizer, PROMPT), settings, queue.Queue(), threading.Event(),
                  compiled)
    assert len(calls) == 2 and all(call["compile_config"] is compiled["compile_config"] for call in calls)
