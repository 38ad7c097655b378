"""The Gradio demo: its API endpoint (gradio_client) and its page in a real headless Chromium (Playwright)."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlparse

import pytest
import torch

from conftest import VOCAB, tiny_target, write_bigram_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.tools.demo import DEFAULT_MAX_NEW_TOKENS, WORKER_THREAD_NAME, ShownToken, build_demo, tokens_html
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
    target = tiny_target("qwen3")
    drafter = DSparkDrafter.from_pretrained(write_bigram_deepspec(target, tmp_path_factory.mktemp("drafter")), target)
    return target, tiny_tokenizer(), drafter


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def served(tiny_pair):
    """The demo on the tiny pair, served on 127.0.0.1 for the whole module."""
    demo = build_demo(*tiny_pair)
    demo.launch(
        server_name="127.0.0.1",
        server_port=free_port(),
        share=False,
        ssr_mode=False,
        prevent_thread_lock=True,
        quiet=True,
    )
    yield demo, tiny_pair
    demo.close()


def plain_greedy_text(target, tokenizer, max_new_tokens: int) -> str:
    """What the target alone says after PROMPT, as text following the prompt's text."""
    prompt_ids = render_prompt(tokenizer, PROMPT)
    output = target.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)[0].tolist()
    full = tokenizer.decode(output, skip_special_tokens=False)
    return full[len(tokenizer.decode(prompt_ids, skip_special_tokens=False)) :]


def test_token_text_is_escaped_and_classed():
    shown = tokens_html([ShownToken("<|im_end|>", "bonus", 'say "hi"'), ShownToken("<b>", "rejected", "x")])
    assert '<span class="tok tok-bonus" title="say &quot;hi&quot;">&lt;|im_end|&gt;</span>' in shown
    assert '<span class="tok tok-rejected" title="x">&lt;b&gt;</span>' in shown


def test_generate_endpoint_labels_and_lossless_text(served):
    from gradio_client import Client

    demo, (target, tokenizer, _) = served
    client = Client(demo.local_url, verbose=False)
    tokens_view, stats, chart, plain_text, pairs = client.predict(PROMPT, api_name="/generate")  # defaults for the rest

    labels = [label for _, label in pairs]
    assert set(labels) <= {"accepted", "rejected", "bonus", "pruned"}
    assert labels[0] == "bonus"  # the prefill token is the target's own
    assert "accepted" in labels and "rejected" in labels  # the bigram drafter is right often, not always
    kept = "".join(text for text, label in pairs if label in ("accepted", "bonus"))
    assert kept == plain_greedy_text(target, tokenizer, DEFAULT_MAX_NEW_TOKENS)
    assert "tok-accepted" in tokens_view and "<svg" in chart and "**done**" in stats and "τ" in stats
    assert plain_text == ""

    *_, plain_text, pairs = client.predict(PROMPT, max_new_tokens=12, compare_plain=True, api_name="/generate")
    expected = plain_greedy_text(target, tokenizer, 12)
    assert plain_text == expected.lstrip()  # decoded on its own, without the prompt's trailing context
    assert "".join(text for text, label in pairs if label in ("accepted", "bonus")) == expected


@pytest.fixture()
def slow_target(served):
    """Each forward of the tiny target takes 40 ms, so rounds arrive one by one as on a real model."""
    _, (target, _, _) = served
    handle = target.register_forward_pre_hook(lambda module, args: time.sleep(0.04))
    yield target
    handle.remove()


def test_browser_streams_coloured_rounds_and_stops(served, slow_target, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    demo, _ = served
    origin = urlparse(demo.local_url).netloc
    outside_requests = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on(
            "request",
            lambda request: urlparse(request.url).netloc in (origin, "") or outside_requests.append(request.url),
        )
        page.goto(demo.local_url)
        page.get_by_label("Prompt (a user chat turn)").fill(PROMPT)
        count_token_updates(page)

        page.locator("#dspark-generate").click()
        expect(page.locator("#dspark-stats")).to_contain_text("done", timeout=60_000)
        counts = page.evaluate("window.dsparkTokenCounts")
        print(f"\ntoken spans on screen after each update: {counts}")
        assert len(counts) >= 3 and counts == sorted(counts), counts  # grew round by round, not all at once
        for kind in ("accepted", "rejected", "bonus"):
            assert page.locator(f"#dspark-tokens .tok-{kind}").count() > 0, kind
        struck = page.locator("#dspark-tokens .tok-rejected").first.evaluate(
            "e => getComputedStyle(e).textDecorationLine"
        )
        assert struck == "line-through"
        assert "confidence" in page.locator("#dspark-tokens .tok-accepted").first.get_attribute("title")
        assert page.locator("#dspark-chart svg rect").count() > 0
        screenshot = tmp_path / "demo.png"
        page.screenshot(path=str(screenshot), full_page=True)
        print(f"browser screenshot: {screenshot}")
        kept = page.locator("#dspark-tokens .tok-accepted, #dspark-tokens .tok-bonus")
        assert kept.count() == DEFAULT_MAX_NEW_TOKENS

        max_new_tokens = page.get_by_role("spinbutton", name="number input for Max new tokens")
        max_new_tokens.fill("400")
        max_new_tokens.press("Tab")
        page.locator("#dspark-generate").click()
        expect(page.locator("#dspark-stats")).to_contain_text("generating", timeout=30_000)
        page.locator("#dspark-stop").click()
        expect(page.locator("#dspark-stats")).to_contain_text("stopped", timeout=30_000)
        assert kept.count() < 400
        browser.close()
    assert not any(thread.name == WORKER_THREAD_NAME for thread in threading.enumerate())
    assert outside_requests == []


def count_token_updates(page) -> None:
    """Record in the page every distinct number of token spans the token view shows."""
    page.locator("#dspark-tokens").wait_for(state="attached")
    page.evaluate(
        """() => {
            const view = document.querySelector('#dspark-tokens');
            window.dsparkTokenCounts = [];
            new MutationObserver(() => {
                const counts = window.dsparkTokenCounts;
                const shown = view.querySelectorAll('.tok').length;
                if (shown && counts[counts.length - 1] !== shown) counts.push(shown);
            }).observe(view, {subtree: true, childList: true, characterData: true});
        }"""
    )
