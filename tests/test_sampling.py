"""Sampling rules: q is exactly what draft tokens are drawn from, and the output keeps the target's distribution."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from conftest import tiny_target, write_deepspec, write_zlab
from dspark_hf import DSparkDrafter
from dspark_hf.core import sampling
from dspark_hf.core.sampling import DraftTokenChooser
from dspark_hf.core.scheduling import threshold_length

SMALL_VOCAB = 6


def chi_square_critical(dof: int, z: float = 3.09) -> float:
    """Upper 0.1% point of chi-square (Wilson-Hilferty), so a correct sampler fails 1 run in 1000."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def exact_joint(target, prompt, length, temperature, top_k):
    """P(x_1..x_length | prompt) from the target's own logits after temperature and top-k."""
    def processed(ids):
        logits = target(ids).logits[0, -1] / temperature
        if top_k:
            cutoff = logits.topk(top_k).values[-1]
            logits = logits.masked_fill(logits < cutoff, -float("inf"))
        return logits.softmax(-1)

    table = {}
    with torch.no_grad():
        for seq in itertools.product(range(SMALL_VOCAB), repeat=length):
            prob, ids = 1.0, prompt
            for token in seq:
                prob *= processed(ids)[token].item()
                ids = torch.cat((ids, torch.tensor([[token]])), dim=1)
            table[seq] = prob
    return table


def chi_square(counts: dict, expected_probs: dict, samples: int) -> tuple[float, int]:
    """Pearson statistic, cells with expected count < 5 pooled into one."""
    stat, pooled_observed, pooled_expected, cells = 0.0, 0, 0.0, 0
    for cell, prob in expected_probs.items():
        expected = prob * samples
        observed = counts.get(cell, 0)
        if expected < 5:
            pooled_observed += observed
            pooled_expected += expected
            continue
        stat += (observed - expected) ** 2 / expected
        cells += 1
    if pooled_expected > 0:
        stat += (pooled_observed - pooled_expected) ** 2 / max(pooled_expected, 1e-9)
        cells += 1
    return stat, cells - 1


@pytest.mark.parametrize(
    "fmt,temperature,top_k,threshold",
    # Monte Carlo through the real random draws; test_exact_sampling enumerates DSpark thresholds exactly
    [pytest.param("deepspec", 0.8, 4, 0.3, marks=pytest.mark.slow), ("zlab", 1.0, 0, 0.0)],
)
def test_sampled_output_has_the_target_distribution(fmt, temperature, top_k, threshold, tmp_path):
    target = tiny_target("qwen3", vocab=SMALL_VOCAB, seed=7, layers=3)
    if fmt == "deepspec":
        path = write_deepspec(target, tmp_path / "d", mask_token_id=SMALL_VOCAB - 1, markov_rank=4, block_size=4)
    else:
        path = write_zlab(target, tmp_path / "d", block_size=4, mask_token_id=SMALL_VOCAB - 1)
    drafter = DSparkDrafter.from_pretrained(path, target)
    prompt = torch.tensor([[1, 3, 0, 2]])
    length, samples = 3, 1000
    torch.manual_seed(0)
    counts, verified, accepted, max_verified = {}, 0, 0, 0
    for _ in range(samples):
        out = target.generate(
            prompt,
            do_sample=True,
            temperature=temperature,
            top_k=top_k or None,
            max_new_tokens=8,  # the budget covers whole blocks; the law of the first `length` tokens is tested
            assistant_model=drafter,
            assistant_confidence_threshold=threshold,
        )
        key = tuple(out[0, prompt.shape[1] : prompt.shape[1] + length].tolist())
        counts[key] = counts.get(key, 0) + 1
        verified += sum(r.num_verified for r in drafter.last_trace)
        accepted += sum(r.num_accepted for r in drafter.last_trace)
        max_verified = max([max_verified] + [r.num_verified for r in drafter.last_trace])
    # both paths of rejection sampling were exercised, on multi-token blocks
    assert 0 < accepted < verified and max_verified >= 2
    stat, dof = chi_square(counts, exact_joint(target, prompt, length, temperature, top_k), samples)
    print(f"chi2={stat:.1f} dof={dof} critical={chi_square_critical(dof):.1f} accept={accepted / verified:.2f}")
    assert stat < chi_square_critical(dof)


def test_chooser_returns_processed_logits_and_samples_from_them():
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.5), TopKLogitsWarper(2)])
    logits = torch.tensor([[0.1, 2.0, 1.0, -1.0]])
    chooser = DraftTokenChooser(torch.tensor([[3, 1]]), processors, do_sample=True)
    torch.manual_seed(0)
    draws = [int(chooser(logits)) for _ in range(400)]
    expected = processors(torch.tensor([[3, 1]]), logits.clone())[0]
    torch.testing.assert_close(chooser.q_logits()[-1], expected)
    assert torch.cat(chooser.chosen).tolist() == draws and chooser.prefix_ids.tolist() == [[3, 1]]
    q = expected.softmax(-1)
    assert set(draws) <= {1, 2}  # top-k removed the rest
    share = draws.count(1) / len(draws)
    assert abs(share - q[1].item()) < 4 * math.sqrt(q[1].item() * (1 - q[1].item()) / len(draws))


def test_draw_follows_the_probabilities_row_by_row():
    """The exponential race draws each row's law; zero-probability tokens never come up."""
    torch.manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 0.1, 0.9]])
    rows = 20000
    draws = sampling.draw(p.repeat(rows, 1)).view(rows, 2)
    for row in range(2):
        counts = torch.bincount(draws[:, row], minlength=4).double() / rows
        assert counts[p[row] == 0].sum() == 0
        assert (counts - p[row]).abs().max() < 4 * math.sqrt(0.25 / rows)


def test_greedy_chooser_takes_the_processed_argmax():
    chooser = DraftTokenChooser(torch.tensor([[0]]), None, do_sample=False)
    assert chooser(torch.tensor([[0.0, 3.0, 1.0]])).tolist() == [1]
    assert chooser.q_logits() is None  # greedy verification needs no q


@pytest.mark.parametrize(
    "processor",
    [TemperatureLogitsWarper(0.7), TopKLogitsWarper(3), TopKLogitsWarper(10), TopPLogitsWarper(0.8),
     MinPLogitsWarper(0.3)],
    ids=["temperature", "top-k", "top-k-wider-than-the-draft-vocabulary", "top-p", "min-p"],
)
def test_pruned_rows_are_processed_like_target_vocabulary_rows(processor):
    """Over a pruned vocabulary, prefix-free processors act as on the target row that is -inf elsewhere,
    even top-k with k above the draft vocabulary's size (both keep every draft token)."""
    draft_ids = torch.tensor([1, 4, 5, 7, 8, 11])
    logits = torch.randn(3, len(draft_ids), generator=torch.Generator().manual_seed(0))
    chooser = DraftTokenChooser(torch.tensor([[2]]), LogitsProcessorList([processor]), True, 12, draft_ids)
    chosen = chooser(logits)
    full = torch.full((3, 12), float("-inf"))
    full[:, draft_ids] = logits
    expected = processor(torch.tensor([[2]]), full)
    torch.testing.assert_close(chooser.q_logits(), expected)
    assert set(chosen.tolist()) <= set(draft_ids.tolist())


def test_a_processor_that_reads_the_prefix_sees_the_draft_tokens():
    """Repetition penalty: the second draft token is penalised for the first, as the target will see it."""
    chooser = DraftTokenChooser(torch.tensor([[5]]), LogitsProcessorList([RepetitionPenaltyLogitsProcessor(100.0)]))
    assert not chooser.prefix_free
    row = torch.tensor([[0.0, 3.0, 2.0, 0.0, 0.0, 1.0]])
    assert [int(chooser(row)) for _ in range(2)] == [1, 2]
    assert chooser.running_prefix(row.device).tolist() == [[5, 1, 2]]


def test_threshold_cut_is_the_first_low_confidence():
    c = torch.tensor([0.9, 0.8, 0.2, 0.95])
    assert threshold_length(c, 0.5, 4, 10) == 2
    assert threshold_length(c, 0.0, 4, 10) == 4
    assert threshold_length(c, 0.5, 4, 1) == 1
    assert threshold_length(c, 0.95, 4, 10) == 0
    assert threshold_length(None, 0.9, 4, 3) == 3
    assert threshold_length(c, 0.5, 4, 0) == 0
