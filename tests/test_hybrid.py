"""Hybrid drafting: each round proposes the DSpark block or an n-gram continuation from the context.

Greedy output stays plain generate()'s; every n-gram proposal is the one an independent
naive search of the context finds; every DSpark round drafts what the independent
reference loop drafts; the sampled output law, enumerated through the real generate(),
is the target's whichever source each branch chose.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from conftest import tiny_target, write_bigram_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.core.generation import DSparkCandidateGenerator
from dspark_hf.core.modeling import DraftBlock
from dspark_hf.core.ngram import AcceptanceStats, NgramIndex
from dspark_hf.core.scheduling import CostTable, best_geometric_length, geometric_expected
from dspark_hf.core.trace import SOURCE_DSPARK, SOURCE_NGRAM
from reference_drafting import reference_block
from test_exact_sampling import Enumerated, StopAfter, small_drafter, target_law
from test_exact_sampling import PROMPT, LENGTH, TEMPERATURE, TOP_K, VOCAB
from test_generation import assert_trace_matches_output, prompts

# Verifying n tokens costs 1 + 0.02 (n - 1) forwards (bf16 on a CPU with native bf16 matmuls looks like this),
# up to 33 tokens; a draft pass costs 0.1.
CHEAP_LONG = CostTable(0.1, tuple(1.0 + 0.02 * n for n in range(33)))


def naive_match(tokens: list[int], max_tokens: int, longest: int = 4):
    """The continuation after the latest earlier occurrence of the longest suffix (<= `longest` tokens)."""
    for n in range(min(longest, len(tokens) - 1), 0, -1):
        for end in range(len(tokens) - 1, n - 1, -1):
            if tokens[end - n : end] == tokens[-n:]:
                return tokens[end : end + max_tokens], n
    return None


# ------------------------------------------------------------- pure parts
def test_index_finds_the_latest_longest_earlier_occurrence():
    index = NgramIndex(max_match=3)
    index.extend([5, 6, 7, 8, 5, 6, 9, 1, 5, 6])
    match = index.lookup(max_tokens=4)
    assert (match.tokens, match.start, match.match_length) == ([9, 1, 5, 6], 6, 2)  # "5 6" ended last at 6, not 2
    index.extend([9])  # "5 6 9" occurred at 4..6
    match = index.lookup(max_tokens=2)
    assert (match.tokens, match.match_length) == ([1, 5], 3)
    assert NgramIndex().lookup(4) is None
    lonely = NgramIndex()
    lonely.extend([1, 2, 3])
    assert lonely.lookup(4) is None  # the suffix itself is not an earlier occurrence


def test_index_agrees_with_a_naive_search_as_the_context_grows():
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 4, (300,), generator=generator).tolist()
    index, seen = NgramIndex(), 0
    for stop in range(2, 300, 7):  # grows by a few tokens per round, as generation does
        index.extend(tokens[seen:stop])
        seen = stop
        match = index.lookup(max_tokens=6)
        expected = naive_match(tokens[:stop], 6)
        assert (None if match is None else (match.tokens, match.match_length)) == expected
        if match is not None:
            assert tokens[match.start : match.start + len(match.tokens)] == match.tokens


def test_acceptance_is_geometric_with_a_one_trial_prior():
    stats = AcceptanceStats()
    assert stats.alpha(3) == 0.5
    stats.record(3, num_verified=4, num_accepted=4)  # four survivals
    stats.record(3, num_verified=4, num_accepted=1)  # one survival, then a failure
    assert stats.alpha(3) == pytest.approx((1 + 5) / (1 + 5 + 1 + 1))
    assert stats.alpha(2) == 0.5


def test_geometric_length_weighs_tokens_against_verify_cost():
    steep = CostTable(0.0, (1.0, 2.0, 2.1, 2.2))
    assert best_geometric_length(0.3, steep, 3) == (0, 1.0)  # a second token never pays for a doubled forward
    length, rate = best_geometric_length(0.9, steep, 3)
    assert length == 3 and rate == pytest.approx(geometric_expected(0.9, 3) / 2.2)
    assert best_geometric_length(0.9, steep, 10)[0] == 3  # capped by the table
    assert best_geometric_length(0.6, CHEAP_LONG, 32)[0] > 5
    assert geometric_expected(0.5, 2) == 1.75


# ------------------------------------------------------------- through generate()
def drafter_with_costs(target, tmp_path, costs=CHEAP_LONG):
    drafter = DSparkDrafter.from_pretrained(write_bigram_deepspec(target, tmp_path / "d"), target)
    drafter.cost_table = costs
    return drafter


def test_greedy_hybrid_equals_plain_and_proposes_what_the_references_do(tmp_path):
    target = tiny_target("qwen3")  # its greedy text falls into cycles: the n-gram source has matches
    drafter = drafter_with_costs(target, tmp_path)
    sources = []
    for i, prompt in enumerate(prompts(5, seed=3)):
        new_tokens = 6 + 17 * i
        expected = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False)
        produced = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False, assistant_model=drafter,
                                   dspark_ngram=True)
        assert produced.tolist() == expected.tolist()
        assert_trace_matches_output(drafter, prompt, produced)
        sequence = produced[0].tolist()
        for record in drafter.last_trace:
            context = sequence[: record.position + 1]
            room = len(sequence) - record.position - 2
            sources.append((record.source, len(record.draft_ids)))
            if record.source == "ngram":
                tokens, length = naive_match(context, min(32, room))
                assert (record.draft_ids, record.match_length) == (tokens, length)
                assert record.confidences == [] and 0 < record.num_verified <= len(tokens)
            elif record.source == "dspark":
                ids = torch.tensor([context])
                assert record.draft_ids == reference_block(drafter, ids, torch.ones_like(ids))[0]
    assert {source for source, _ in sources} >= {"ngram", "dspark"}
    assert max(n for source, n in sources if source == "ngram") > drafter.config.block_size  # beyond the block


def test_ngram_off_proposes_dspark_blocks_only(tmp_path):
    target = tiny_target("qwen3")
    drafter = drafter_with_costs(target, tmp_path)
    prompt = prompts(3, seed=3)[2]
    target.generate(prompt, max_new_tokens=40, do_sample=False, assistant_model=drafter, dspark_ngram=True)
    assert any(r.source == "ngram" for r in drafter.last_trace)
    target.generate(prompt, max_new_tokens=40, do_sample=False, assistant_model=drafter, dspark_ngram=False)
    assert {r.source for r in drafter.last_trace} == {"dspark"}
    drafter.generation_config.dspark_ngram = True  # the drafter's own default, when generate() does not say
    target.generate(prompt, max_new_tokens=40, do_sample=False, assistant_model=drafter)
    assert any(r.source == "ngram" for r in drafter.last_trace)


def test_rounds_reach_the_callers_list_as_they_end(tmp_path):
    target = tiny_target("qwen3")
    drafter = drafter_with_costs(target, tmp_path)
    prompt = prompts(3, seed=3)[2]
    first, second = [], []
    target.generate(prompt, max_new_tokens=30, do_sample=False, assistant_model=drafter, dspark_rounds=first)
    target.generate(prompt, max_new_tokens=9, do_sample=False, assistant_model=drafter, dspark_rounds=second)
    assert first and second and first != second  # one list per call, not a shared module attribute
    assert second == list(drafter.last_trace)
    assert all(r.cut in ("whole", "budget", "threshold", "cost", "gate", "no-draft") for r in first + second)


# ------------------------------------------------------------- the sampled law
def hybrid_law(target, drafter, **kwargs):
    law, sources = {}, set()
    with Enumerated(PROMPT.shape[1]) as enumerated:
        while True:
            enumerated.branches.reset()
            out = target.generate(
                PROMPT, do_sample=True, temperature=TEMPERATURE, top_k=TOP_K, max_new_tokens=12,
                assistant_model=drafter, stopping_criteria=[StopAfter(PROMPT.shape[1])], dspark_ngram=True, **kwargs,
            )
            key = tuple(out[0, PROMPT.shape[1] : PROMPT.shape[1] + LENGTH].tolist())
            law[key] = law.get(key, 0.0) + enumerated.branches.probability
            sources |= {(r.source, r.num_verified) for r in drafter.last_trace if r.num_verified}
            if not enumerated.branches.advance():
                return law, sources


@pytest.mark.parametrize("scheduler", [pytest.param("threshold", marks=pytest.mark.slow), "cost"])
def test_hybrid_sampling_is_exact(scheduler, tmp_path):
    """Which source a round uses depends on c_1 and past rounds only, and an n-gram round's q is one-hot."""
    target = tiny_target("qwen3", vocab=VOCAB, seed=7, layers=3)
    drafter = small_drafter(target, tmp_path)
    drafter.cost_table = CostTable(0.3, (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7))
    law, sources = hybrid_law(target, drafter, dspark_scheduler=scheduler)
    expected = target_law(target)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
    worst = max(abs(law.get(key, 0.0) - value) for key, value in expected.items())
    assert worst < 1e-6, f"largest difference from the target's law: {worst:.3e}"
    kinds = {source for source, _ in sources}
    assert kinds == {"ngram", "dspark"}, sources  # both sources were taken on some branches
    assert max(n for source, n in sources if source == "ngram") >= 2


# Every verified token costs half a forward: sending 3 n-gram tokens costs 2.5 forwards, not 1.
STEEP = CostTable(0.1, tuple(1.0 + 0.5 * n for n in range(33)))


def planned(tmp_path, monkeypatch, costs: CostTable, c1: float):
    """A round's plan where the context ends in a repeat -- a 3-token match, its n-gram length accepted with alpha
    0.9 so far -- and the DSpark block's first confidence is c1; and whether the draft pass ran."""
    target = tiny_target("qwen3")
    drafter = drafter_with_costs(target, tmp_path, costs)
    drafter.generation_config.dspark_ngram = True
    generator = DSparkCandidateGenerator(drafter, GenerationConfig(max_length=200, do_sample=False))
    context = [*range(1, 12), 1, 2, 3]
    generator.ngram.extend(context)
    generator.ngram_stats.counts[3] = [9.0, 1.0]
    budget = drafter.config.num_draft_tokens
    block = DraftBlock(torch.arange(budget), None, torch.tensor([c1] + [0.9] * (budget - 1)))
    drafted = []
    monkeypatch.setattr(drafter, "draft", lambda *args: drafted.append(True) or block)
    return generator._plan(torch.tensor([context]), budget, room=100), bool(drafted)


def test_a_round_prices_the_ngram_proposal_by_the_tokens_it_sends(tmp_path, monkeypatch):
    """On steep costs the n-gram proposal (3 of its tokens: 3.44 expected in 2.5 forwards) loses to a block with
    c_1 = 0.95 (about 1.46 tokens per forward against 1.32), wins against c_1 = 0.3, and skips the draft pass only
    when that pass costs more than a whole surviving block could repay."""
    proposal, drafted = planned(tmp_path / "a", monkeypatch, STEEP, c1=0.95)
    assert proposal.source == SOURCE_DSPARK and drafted  # a whole block could win: the draft pass runs
    proposal, drafted = planned(tmp_path / "b", monkeypatch, STEEP, c1=0.3)
    assert (proposal.source, proposal.num_verified, proposal.match.match_length) == (SOURCE_NGRAM, 3, 3) and drafted
    proposal, drafted = planned(tmp_path / "c", monkeypatch, CostTable(5.0, STEEP.verify_seconds), c1=0.95)
    assert proposal.source == SOURCE_NGRAM and not drafted


def test_no_draft_pass_when_even_a_whole_block_could_not_beat_the_match(tmp_path, monkeypatch):
    """With a draft pass dearer than a long verify, n-gram rounds skip drafting; with a cheap one, they draft first."""
    target = tiny_target("qwen3")
    prompt = prompts(3, seed=3)[2]
    for draft_seconds, skips in ((5.0, True), (0.0, False)):
        drafter = drafter_with_costs(target, tmp_path / str(draft_seconds),
                                     CostTable(draft_seconds, CHEAP_LONG.verify_seconds))
        calls = []
        draft = drafter.draft
        monkeypatch.setattr(drafter, "draft", lambda *args, **kwargs: calls.append(1) or draft(*args, **kwargs))
        target.generate(prompt, max_new_tokens=40, do_sample=False, assistant_model=drafter, dspark_ngram=True)
        ngram_rounds = sum(r.source == "ngram" for r in drafter.last_trace)
        dspark_rounds = sum(r.source == "dspark" for r in drafter.last_trace)
        assert ngram_rounds > 0
        assert len(calls) == dspark_rounds + (0 if skips else ngram_rounds)
