"""The offline default pair: SmolLM2-135M-Instruct with the shipped DSpark drafter."""

from __future__ import annotations

import pytest
import torch

from dspark_hf import load_default, summarize
from dspark_hf.tools.exactness import find_divergence
from dspark_hf.tools.prompts import render_prompt

# Not from the dev sets: short prompts in the style the drafter was trained on.
PROMPTS = [
    "A baker makes 12 muffins per tray and bakes 5 trays. He sells 38 muffins. How many are left? "
    "Please reason step by step.",
    "Write a Python function that returns the factorial of n.",
    "Give three tips for staying focused while studying.",
]


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def default_pair(monkeypatch_module):
    """As `load_default()` gives it: the target in the dtype 'auto' picks here."""
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    return load_default()


@pytest.fixture(scope="module")
def float32_pair(monkeypatch_module):
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    return load_default("float32")


def test_default_pair_loads_offline_in_the_auto_dtype(default_pair):
    target, tokenizer, drafter = default_pair
    assert drafter.target is target
    assert drafter.config.vocab_size == target.get_input_embeddings().weight.shape[0] == 49152
    assert drafter.embed_tokens is target.get_input_embeddings()
    native_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert target.dtype == drafter.dtype == (torch.bfloat16 if native_bf16 else torch.float32)


def test_default_pair_is_lossless_in_float32_and_fast_enough(float32_pair):
    target, tokenizer, drafter = float32_pair
    taus = []
    for prompt in PROMPTS:
        ids = torch.tensor([render_prompt(tokenizer, prompt)])
        expected = target.generate(ids, max_new_tokens=48, do_sample=False)
        produced = target.generate(ids, max_new_tokens=48, do_sample=False, assistant_model=drafter,
                                   dspark_scheduler="threshold", dspark_ngram=False)  # the drafter's own blocks
        assert produced.tolist() == expected.tolist()
        taus.append(summarize(drafter.last_trace).tau)
    print("tau per prompt:", [round(t, 2) for t in taus])
    # The shipped drafter measured 2.04 / 2.76 / 1.18 here (mean 1.99); an untrained one gives 1.0,
    # the previous drafter 1.73.
    assert sum(taus) / len(taus) >= 1.85


def test_default_pair_leaves_plain_decoding_only_at_near_ties(default_pair):
    """In bf16 a batched verify rounds differently from one-token decoding: a flip must be a near-tie."""
    target, tokenizer, drafter = default_pair
    for prompt in PROMPTS:
        ids = render_prompt(tokenizer, prompt)
        plain = target.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids):].tolist()
        ours = target.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False, assistant_model=drafter)
        divergence = find_divergence(target, ids, plain, ours[0, len(ids):].tolist())
        assert divergence is None or divergence.steps <= 2
