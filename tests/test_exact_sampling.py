"""The exact output law of speculative sampling, enumerated through the real generate() code.

Every random draw of a generate() call -- the target's samples, each draft token, each
accept/reject test, each resample -- is made to follow one branch of the decision tree,
and generate() is replayed until every branch with nonzero probability has been taken.
Summing path probabilities gives the law of the first three generated tokens exactly,
which must equal the target's own joint law (after temperature and top-k) to 1e-6.

Draws that cannot change the first three tokens are not branched: a draft token beyond
them takes its likeliest value, and acceptance patterns that keep all of them are merged.
Every scheduling decision stays non-anticipating, so the law stays exact.
"""

from __future__ import annotations

import itertools
import sys

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from conftest import tiny_target, write_deepspec, write_zlab
from dspark_hf import DSparkDrafter
from dspark_hf.core import sampling
from dspark_hf.core.scheduling import CostTable

VOCAB = 5
LENGTH = 3  # tokens whose law is compared
PROMPT = torch.tensor([[1, 3, 0, 2]])
TEMPERATURE, TOP_K = 0.8, 3  # 3 of 5 tokens live: top-k still cuts, and the tree is a quarter of top-4's


class Branches:
    """Depth-first replay: the i-th draw of a run follows `script[i]`; new draws take their first option."""

    def __init__(self):
        self.script: list[int] = []
        self.reset()

    def reset(self):
        self.taken: list[tuple[int, int]] = []  # (option taken, number of options) per draw
        self.probability = 1.0

    def choose(self, probabilities: list[float]) -> int:
        options = [i for i, p in enumerate(probabilities) if p > 0]
        depth = len(self.taken)
        position = self.script[depth] if depth < len(self.script) else 0
        self.taken.append((position, len(options)))
        self.probability *= probabilities[options[position]]
        return options[position]

    def advance(self) -> bool:
        """The next unexplored branch; False once the tree is exhausted."""
        while self.taken:
            position, count = self.taken.pop()
            if position + 1 < count:
                self.script = [p for p, _ in self.taken] + [position + 1]
                return True
        return False


class Enumerated:
    """Patches the random draws (torch's, and draft tokens' sampling.draw) for the duration of the enumeration."""

    def __init__(self, prompt_length: int):
        self.prompt_length = prompt_length
        self.branches = Branches()
        self.real_multinomial, self.real_rand_like = torch.multinomial, torch.rand_like
        self.real_draw = sampling.draw

    def committed(self, frame) -> int:
        """New tokens already committed when the draw at `frame` happens."""
        names = frame.f_locals
        if "candidate_input_ids" in names and "candidate_length" in names:  # verification
            return names["candidate_input_ids"].shape[1] - names["candidate_length"] - self.prompt_length
        if isinstance(names.get("self"), sampling.DraftTokenChooser):  # drafting: the chooser's prefix is committed
            return names["self"].prefix_ids.shape[1] - self.prompt_length
        return names["input_ids"].shape[1] - self.prompt_length  # the target's own sample

    def pick(self, probs, position: int) -> int:
        """A draw that would be token number position + 1: branched if it can change the first LENGTH tokens."""
        row = probs.double()
        row = (row / row.sum()).tolist()
        if position < LENGTH:
            return self.branches.choose(row)
        return max(range(len(row)), key=row.__getitem__)  # cannot reach the first LENGTH tokens: no branching

    def multinomial(self, probs, num_samples=1, **kwargs):
        """One draw per row: row i of a verification without q (a proposal matched against the target's own
        samples) is the token i places after the committed ones."""
        frame = sys._getframe(1)
        position = self.committed(frame)
        if frame.f_code.co_name == "_speculative_sampling":  # a resample or bonus after n_matches drafts
            position += int(frame.f_locals["n_matches"])
        choices = [self.pick(row, position + i) for i, row in enumerate(probs.reshape(-1, probs.shape[-1]))]
        ids = torch.tensor(choices, dtype=torch.long, device=probs.device).reshape(probs.shape[:-1] + (1,))
        return ids.expand(probs.shape[:-1] + (num_samples,))

    def draw(self, probabilities):
        """Draft tokens (sampling.draw, one per row): row i follows the drafts the chooser has chosen, and i more."""
        frame = sys._getframe(1)
        first = self.committed(frame) + sum(len(ids) for ids in frame.f_locals["self"].chosen)
        choices = [self.pick(row, first + i) for i, row in enumerate(probabilities)]
        return torch.tensor(choices, dtype=torch.long, device=probabilities.device)

    def rand_like(self, ratios, **kwargs):
        """Acceptance tests: branch on the first rejection, merged once LENGTH tokens are safe."""
        ratios_list = ratios.double().clamp(max=1.0).tolist()
        needed = LENGTH - self.committed(sys._getframe(1))
        outcomes, probabilities, alive = [], [], 1.0
        for j, ratio in enumerate(ratios_list):
            if j >= needed:
                break
            outcomes.append(j)  # first rejection at j
            probabilities.append(alive * (1 - ratio))
            alive *= ratio
        outcomes.append(None)  # nothing rejected among the first `needed` (or all)
        probabilities.append(alive)
        first_rejection = outcomes[self.branches.choose(probabilities)]
        uniforms = torch.zeros_like(ratios)  # 0 <= ratio accepts whenever ratio > 0
        uniforms[ratios <= 0] = 1.0
        if first_rejection is not None:
            uniforms[first_rejection] = 1.0  # above a ratio < 1: rejected
        return uniforms

    def __enter__(self):
        torch.multinomial, torch.rand_like, sampling.draw = self.multinomial, self.rand_like, self.draw
        return self

    def __exit__(self, *exc):
        torch.multinomial, torch.rand_like, sampling.draw = self.real_multinomial, self.real_rand_like, self.real_draw


class StopAfter(StoppingCriteria):
    def __init__(self, prompt_length: int):
        self.prompt_length = prompt_length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((1,), input_ids.shape[1] - self.prompt_length >= LENGTH, dtype=torch.bool)


def output_law(target, drafter, **generate_kwargs) -> tuple[dict, int, set]:
    """{first LENGTH tokens: probability} of generate(), enumerated; the number of paths; the verify lengths seen."""
    law, paths, lengths = {}, 0, set()
    with Enumerated(PROMPT.shape[1]) as enumerated:
        while True:
            enumerated.branches.reset()
            out = target.generate(
                PROMPT, do_sample=True, temperature=TEMPERATURE, top_k=TOP_K, max_new_tokens=12,
                assistant_model=drafter, stopping_criteria=StoppingCriteriaList([StopAfter(PROMPT.shape[1])]),
                **generate_kwargs,
            )
            key = tuple(out[0, PROMPT.shape[1] : PROMPT.shape[1] + LENGTH].tolist())
            law[key] = law.get(key, 0.0) + enumerated.branches.probability
            paths += 1
            lengths |= {r.num_verified for r in drafter.last_trace if r.draft_ids}
            if not enumerated.branches.advance():
                return law, paths, lengths


@torch.no_grad()
def target_law(target) -> dict:
    def step(ids):
        logits = target(ids).logits[0, -1].double() / TEMPERATURE
        cutoff = logits.topk(TOP_K).values[-1]
        return logits.masked_fill(logits < cutoff, -float("inf")).softmax(-1)

    law = {}
    for tokens in itertools.product(range(VOCAB), repeat=LENGTH):
        probability, ids = 1.0, PROMPT
        for token in tokens:
            probability *= float(step(ids)[token])
            ids = torch.cat((ids, torch.tensor([[token]])), dim=1)
        law[tokens] = probability
    return law


def assert_exact(target, drafter, **kwargs):
    law, paths, lengths = output_law(target, drafter, **kwargs)
    expected = target_law(target)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)
    worst = max(abs(law.get(key, 0.0) - value) for key, value in expected.items())
    print(f"{paths} paths, verify lengths {sorted(lengths)}, largest difference {worst:.2e}")
    assert worst < 1e-6, f"largest difference from the target's law: {worst:.3e}"
    return lengths


@pytest.fixture(scope="module")
def small_target():
    return tiny_target("qwen3", vocab=VOCAB, seed=7, layers=3)


def small_drafter(target, tmp_path, layout="deepspec", **fields):
    if layout == "zlab":
        return DSparkDrafter.from_pretrained(write_zlab(target, tmp_path / "z", block_size=4, mask_token_id=VOCAB - 1),
                                             target)
    fields = dict(mask_token_id=VOCAB - 1, markov_rank=4, block_size=4, **fields)
    drafter = DSparkDrafter.from_pretrained(write_deepspec(target, tmp_path / "d", **fields), target)
    with torch.no_grad():  # confidences spread over 0.2..0.8, so thresholds and costs cut at varying places
        drafter.confidence_head["proj"].bias.fill_(-1.0)
    return drafter


@pytest.mark.parametrize("threshold", [0.0, 0.3, pytest.param(0.6, marks=pytest.mark.slow)])
def test_deepspec_drafter_is_exact(threshold, small_target, tmp_path):
    drafter = small_drafter(small_target, tmp_path)
    lengths = assert_exact(small_target, drafter, assistant_confidence_threshold=threshold)
    assert max(lengths) >= 2  # multi-token blocks are verified
    if threshold > 0:
        assert len(lengths) >= 3  # the cut moves with the confidences


def test_zlab_drafter_is_exact(small_target, tmp_path):
    assert_exact(small_target, small_drafter(small_target, tmp_path, "zlab"))


def test_cost_scheduler_is_exact(small_target, tmp_path):
    drafter = small_drafter(small_target, tmp_path)
    drafter.cost_table = CostTable(0.0, (1.0, 1.4, 1.8, 2.2, 2.6))  # each token costs 40% of a forward
    assert len(assert_exact(small_target, drafter, dspark_scheduler="cost")) >= 2


def test_pruned_drafter_is_exact(small_target, tmp_path):
    """q is zero outside the draft vocabulary, and the residual keeps p's mass there."""
    drafter = small_drafter(small_target, tmp_path, draft_vocab_size=3)
    with torch.no_grad():
        drafter.d2t.copy_(torch.tensor([0, 1, 2]))  # target ids 0, 2, 4
        drafter.lm_head.weight.copy_(small_target.get_output_embeddings().weight[[0, 2, 4]])
    assert drafter.draft_token_ids().tolist() == [0, 2, 4]
    assert_exact(small_target, drafter, assistant_confidence_threshold=0.0)
