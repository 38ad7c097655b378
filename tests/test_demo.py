"""The Gradio demo: its views, its API endpoint (gradio_client) and its page in headless Chromium (Playwright)."""

from __future__ import annotations

import re
import socket
import threading
import time
from html.parser import HTMLParser
from urllib.parse import urlparse

import pytest
import torch

from conftest import VOCAB, tiny_target, write_bigram_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.core.calibration import Calibration
from dspark_hf.core.scheduling import CostTable
from dspark_hf.core.trace import RoundRecord
from dspark_hf.tools import demo as demo_module
from dspark_hf.tools.cli import main as dspark_main
from dspark_hf.tools.demo import (
    DEFAULT_MAX_NEW_TOKENS,
    MAX_PROMPT_TOKENS,
    OUTPUT_LABELS,
    WORKER_THREAD_NAME,
    DemoSession,
    LiveRun,
    Settings,
    build_demo,
    confidence_label,
    legend_html,
    serve_in_background,
)
from dspark_hf.tools.prompts import render_prompt

CHROMIUM = "/usr/bin/chromium"
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


def hand_made_run(calibration=None) -> LiveRun:
    """Prompt 'Hello', max 9 new tokens, threshold 0.5, cap 4: a rejection, a threshold cut, the length cut."""
    settings = Settings(9, "threshold", 0.5, 4, 0.0, True)
    run = LiveRun(PieceTokenizer(), [1], settings, calibration)
    run.apply("prefill", [1])
    rounds = [  # position, drafts, raw confidences, sent, kept, committed
        (1, [2, 3, 4, 5], [0.9, 0.8, 0.3, 0.9], 2, 1, [2, 6]),  # draft '\n' rejected; 2 pruned at c = 0.3
        (3, [3, 0, 5, 4], [0.9, 0.9, 0.9, 0.2], 3, 3, [3, 0, 5, 2]),  # '\n', <|im_end|>, '!' kept; bonus ' world'
        (7, [4, 5, 5, 5], [0.9, 0.9, 0.9, 0.9], 1, 1, [4, 5]),  # one draft fits before the limit
    ]
    for position, drafts, confidences, sent, kept, committed in rounds:
        record = RoundRecord(position, drafts, confidences, sent, kept, committed, 0.01, 0.02)
        run.apply("round", (record, "threshold"))
    run.apply("speculative_seconds", 0.1)
    return run


class VisibleText(HTMLParser):
    """The text a browser shows for an HTML fragment (no CSS generated content)."""

    def __init__(self, markup: str):
        super().__init__()
        self.text = ""
        self.feed(markup)

    def handle_data(self, data):
        self.text += data


def test_answer_is_the_committed_text_and_drafts_stay_out_of_it():
    answer, answer_text, status, metrics, chart, rounds, _, details = hand_made_run().outputs()

    assert VisibleText(answer).text == answer_text == "Hello world <b>&\n! world again!"
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
    assert "kept 1 of 1 sent, 3 pruned by the max-new-tokens limit" in rounds
    assert [t["origin"] for t in details["tokens"]] == ["target", "accepted", "target"] + ["accepted"] * 3 + [
        "target",
        "accepted",
        "target",
    ]
    assert "τ = 2.67" in metrics and "acceptance rate 83%" in metrics  # 8 tokens in 3 rounds; 5 kept of 6 sent
    assert "τ = 2.67" in chart and ">round<" in chart and ">tokens committed<" in chart
    assert "scheduler **threshold**" in status


def test_confidences_shown_are_the_calibrated_ones_the_threshold_reads():
    calibration = Calibration(temperatures=[2.0] * 4)
    _, _, _, _, _, rounds, _, details = hand_made_run(calibration).outputs()
    raw = torch.tensor([0.9, 0.8, 0.3, 0.9])
    calibrated = calibration.apply(raw).tolist()
    assert details["rounds"][0]["confidences"] == calibrated
    assert f"confidence (calibrated) {calibrated[2]:.2f} &lt; 0.50" in rounds
    assert "confidence (calibrated)" in legend_html(confidence_label(calibration))
    assert "confidence (raw)" in legend_html(confidence_label(None))


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
    cuts = 0
    for round_ in details["rounds"]:
        sent = sum(fate != "pruned" for fate in round_["fates"])
        assert all(c >= 0.7 for c in round_["confidences"][:sent]), round_
        if sent < len(round_["fates"]) and "max-new-tokens limit" not in round_["summary"]:
            assert "pruned by the threshold" in round_["summary"] and round_["confidences"][sent] < 0.7, round_
            cuts += 1
    assert cuts > 0


def test_prompt_count_and_limits(tiny_pair):
    session = DemoSession(*tiny_pair)
    assert session.prompt_info(PROMPT).startswith(f"{len(render_prompt(tiny_pair[1], PROMPT))} prompt tokens")
    assert session.prompt_info("  ") == "Type a prompt to start."
    assert f"over this demo's limit of {MAX_PROMPT_TOKENS}" in session.prompt_info("the cat " * MAX_PROMPT_TOKENS)


def test_port_in_use_is_a_one_line_error_naming_port(monkeypatch):
    monkeypatch.setattr(demo_module, "load_pair", lambda *args: pytest.fail("the models loaded before the port check"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            dspark_main(["demo", "--port", str(port)])
    message = str(exit_.value.code)
    assert message.startswith(f"dspark demo: error: port {port} ") and "--port" in message and "\n" not in message


# ---------------------------------------------------------------- the API endpoint
def test_generate_endpoint_has_named_outputs_and_the_plain_answer(served, greedy_answer):
    from gradio_client import Client

    demo, _ = served
    client = Client(demo.local_url, verbose=False)
    returns = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["returns"]
    assert tuple(output["label"] for output in returns) == OUTPUT_LABELS

    outputs = dict(zip(OUTPUT_LABELS, client.predict(PROMPT, api_name="/generate")))  # the page's defaults
    assert outputs["Answer (plain text)"] == greedy_answer
    assert outputs["Target alone (plain text)"] == outputs["Answer (plain text)"]
    status = outputs["Status and comparison with the target alone"]
    assert "**done**" in status and "Identical to the target alone" in status and "auto → threshold" in status
    assert "speed-up ×" in outputs["Metrics"] and "<svg" in outputs["Tokens committed per round (chart)"]
    data = outputs["Tokens and rounds (JSON)"]
    assert {token["origin"] for token in data["tokens"]} == {"accepted", "target"}
    assert "rejected" in {fate for round_ in data["rounds"] for fate in round_["fates"]}

    *_, status, _, _, _, _, _ = client.predict(PROMPT, max_new_tokens=16, temperature=1.0, api_name="/generate")
    assert "Sampling (temperature 1)" in status or "by chance" in status

    for prompt, message in (("", "Type a prompt first"), ("the cat " * MAX_PROMPT_TOKENS, "at most")):
        with pytest.raises(Exception, match=message):
            client.predict(prompt, api_name="/generate")


# ---------------------------------------------------------------- the page, in Chromium
@pytest.fixture()
def slow_target(served):
    """Each forward of the tiny target takes 30 ms, so rounds arrive one by one as on a real model."""
    _, (target, _, _) = served
    handle = target.register_forward_pre_hook(lambda module, args: time.sleep(0.03))
    yield target
    handle.remove()


def test_browser_answer_reads_as_text_with_drafts_aside(served, greedy_answer, slow_target, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    demo, (_, tokenizer, _) = served
    origin = urlparse(demo.local_url).netloc
    outside_requests = []
    screenshots = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
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
        assert len(set(colours.values())) == 4, colours
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
