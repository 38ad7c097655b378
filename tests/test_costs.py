"""Profiling the cost table costs a bounded share of a first call: a few verify lengths, straight lines between
them, lengths and repeats only while a budget lasts, and a progress bar when it takes a while."""

from __future__ import annotations

import collections
import time

import pytest

from conftest import tiny_target, write_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.core import costs
from dspark_hf.core.ngram import MAX_PROPOSAL_TOKENS

LONGEST = MAX_PROPOSAL_TOKENS + 1


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = tiny_target("llama")
    drafter = DSparkDrafter.from_pretrained(write_deepspec(target, tmp_path_factory.mktemp("drafter")), target)
    return target, drafter


def profile(target, drafter, seconds=0.0, per_token=0.0):
    """(table, verify forwards by length, context length) of one measure_costs, each of the target's forwards made
    `seconds` + `per_token` * tokens slower (a bigger model). Verify forwards are the ones after the whole context."""
    forwards = []

    def hook(module, args, kwargs):
        tokens = (kwargs["input_ids"] if "input_ids" in kwargs else args[0]).shape[1]
        cache = kwargs.get("cache")
        forwards.append((tokens, 0 if cache is None else cache.get_seq_length()))
        time.sleep(seconds + per_token * tokens)

    handle = target.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        table = costs.measure_costs(drafter)
    finally:
        handle.remove()
    context = max(cached for _, cached in forwards)
    return table, collections.Counter(tokens for tokens, cached in forwards if cached == context), context


def test_a_few_lengths_are_timed_and_the_rest_interpolated(pair, monkeypatch):
    monkeypatch.setattr(costs, "PROFILE_MIN_SECONDS", 30.0)  # a cold first run may not overrun the 2 s here
    table, verifies, context = profile(*pair)
    block = pair[1].config.num_draft_tokens + 1
    assert verifies == {n: costs.PROFILE_RUNS for n in (1, 2, 4, 8, 16, block, LONGEST)}  # fast: every repeat
    assert context == costs.PROFILE_CONTEXT_TOKENS and len(table.verify_seconds) == LONGEST
    assert table.verify(3) == pytest.approx((table.verify(2) + table.verify(4)) / 2)
    assert table.verify(24) == pytest.approx(table.verify(16) + (table.verify(33) - table.verify(16)) * 8 / 17)


def test_interpolation_draws_straight_lines_and_extends_the_last_one():
    assert costs.interpolated({1: 1.0, 2: 2.0, 4: 2.0, 8: 6.0}, 10) == [1.0, 2.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert costs.interpolated({1: 2.0, 4: 1.0}, 6) == pytest.approx([2.0, 5 / 3, 4 / 3, 1.0, 1.0, 1.0])


def test_a_slow_target_times_one_token_and_the_block_only(pair, monkeypatch):
    """Forwards that cost 2 ms + 4 ms a token (compute-bound, like a big model on a CPU without native bf16) and a
    budget of 12 one-token forwards: the first context chunk and the lengths always timed use it up, so the context
    stays short, no other length is timed, nothing is repeated, and the long verifies are extrapolated."""
    monkeypatch.setattr(costs, "PROFILE_MIN_SECONDS", 0.0)
    monkeypatch.setattr(costs, "PROFILE_BUDGET_STEPS", 12)
    table, verifies, context = profile(*pair, seconds=0.002, per_token=0.004)
    block = pair[1].config.num_draft_tokens + 1
    assert context == costs.FIRST_CONTEXT_TOKENS and verifies == {1: 2 + 1, block: 1}  # 2: the first step's
    assert len(table.verify_seconds) == LONGEST and table.verify(LONGEST) > table.verify(block) > table.verify(1)


def test_progress_shows_only_when_profiling_takes_a_while(pair, monkeypatch, capsys):
    _, drafter = pair
    costs.measure_costs(drafter)
    assert capsys.readouterr().err == ""  # fast: no bar
    monkeypatch.setattr(costs, "PROGRESS_AFTER_SECONDS", 0.0)
    costs.measure_costs(drafter)
    assert "[dspark_hf] profiling costs:" in capsys.readouterr().err
