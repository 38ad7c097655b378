"""Lossless greedy generation through target.generate(assistant_model=drafter)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

from conftest import MASK_ID, tiny_target, write_bigram_deepspec, write_deepspec, write_zlab
from dspark_hf import DSparkCandidateGenerator, DSparkDrafter, summarize
from reference_drafting import assert_rounds_match, reference_rounds


def prompts(count: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, MASK_ID, (1, 2 + (7 * i) % 23), generator=generator) for i in range(count)]


def assert_trace_matches_output(drafter, prompt, output):
    """The rounds account for every generated token, in order, and never accept more than they verified."""
    trace = drafter.last_trace
    generated = output[0, prompt.shape[1] :].tolist()
    committed = [token for record in trace for token in record.committed_ids]
    assert generated[: len(generated) - len(committed)] == generated[:1] or not trace  # prefill made the first one
    assert committed == generated[1:]
    for record in trace:
        assert 0 <= record.num_accepted <= record.num_verified <= len(record.draft_ids)
        assert record.committed_ids[: record.num_accepted] == record.draft_ids[: record.num_accepted]
        assert len(record.committed_ids) <= record.num_accepted + 1


VARIANTS = {
    "bigram-vanilla": dict(kind="bigram"),
    "bigram-gated": dict(kind="bigram", markov_head_type="gated"),
    "bigram-no-markov-feature": dict(kind="bigram", confidence_head_with_markov=False),
    "rnn": dict(kind="random", markov_head_type="rnn"),
    "gated-no-confidence": dict(kind="random", markov_head_type="gated", enable_confidence_head=False),
    "deepspec-dflash": dict(kind="random", markov_rank=0, enable_confidence_head=False),
    "zlab": dict(kind="zlab"),
}


def build(target, tmp_path, kind, **fields):
    if kind == "bigram":
        return DSparkDrafter.from_pretrained(write_bigram_deepspec(target, tmp_path / "d", **fields), target)
    if kind == "zlab":
        return DSparkDrafter.from_pretrained(write_zlab(target, tmp_path / "d", **fields), target)
    return DSparkDrafter.from_pretrained(write_deepspec(target, tmp_path / "d", **fields), target)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_equals_plain_generate(family, variant, tmp_path):
    target = tiny_target(family)
    drafter = build(target, tmp_path, **VARIANTS[variant])
    for i, prompt in enumerate(prompts(6, seed=len(variant))):
        new_tokens = 5 + 9 * i
        expected = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False)
        produced = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False, assistant_model=drafter)
        assert produced.tolist() == expected.tolist()
        assert_trace_matches_output(drafter, prompt, produced)
        assert_rounds_match(drafter.last_trace, reference_rounds(target, drafter, prompt, expected))


@pytest.mark.parametrize("block_size", [2, 3, 7, 9])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.6, 0.95])
def test_greedy_equality_across_block_sizes_and_thresholds(block_size, threshold, tmp_path):
    target = tiny_target("qwen3", seed=3)
    drafter = build(target, tmp_path, "bigram", block_size=block_size)
    for prompt in prompts(4, seed=block_size):
        expected = target.generate(prompt, max_new_tokens=23, do_sample=False)
        produced = target.generate(
            prompt, max_new_tokens=23, do_sample=False, assistant_model=drafter, assistant_confidence_threshold=threshold
        )
        assert produced.tolist() == expected.tolist()
        assert_rounds_match(drafter.last_trace, reference_rounds(target, drafter, prompt, expected, threshold=threshold))
        for record in drafter.last_trace:
            kept = record.num_verified
            if record.confidences and kept < len(record.draft_ids) and threshold > 0:
                # the cut is the first confidence below the threshold (or the length budget)
                assert all(c >= threshold for c in record.confidences[:kept])


def test_bigram_drafter_is_actually_accepted(tmp_path):
    """Guard for the tests above: they must exercise multi-token acceptance, not only rejections."""
    target = tiny_target("qwen3")
    drafter = build(target, tmp_path, "bigram")
    target.generate(prompts(1)[0], max_new_tokens=60, do_sample=False, assistant_model=drafter)
    assert summarize(drafter.last_trace).tau > 2.0
    assert max(r.num_accepted for r in drafter.last_trace) >= 2


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_max_new_tokens_around_block_boundaries(family, tmp_path):
    target = tiny_target(family)
    drafter = build(target, tmp_path, "bigram", block_size=5)
    n = drafter.config.num_draft_tokens
    for new_tokens in (1, n - 1, n, n + 1, 2 * n + 1):
        for prompt in prompts(3, seed=new_tokens):
            expected = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False)
            produced = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False, assistant_model=drafter)
            assert produced.shape[1] == prompt.shape[1] + new_tokens
            assert produced.tolist() == expected.tolist()


def first_occurrences_accepted_mid_block(prompt_length, output, trace):
    """Tokens whose first appearance in the output is an accepted draft followed by more accepted drafts."""
    generated = output[0, prompt_length:].tolist()
    seen = {generated[0]}  # the prefill token
    found = []
    for record in trace:
        for j, token in enumerate(record.committed_ids):
            if token not in seen and j < record.num_accepted - 1:
                found.append(token)
            seen.add(token)
    return found


def test_eos_accepted_in_the_middle_of_a_block(tmp_path):
    """EOS accepted mid-block: the tokens drafted and accepted after it must not reach the output."""
    target = tiny_target("qwen3")
    drafter = build(target, tmp_path, "bigram", block_size=7)
    checked = 0
    for prompt in prompts(10, seed=5):
        unstopped = target.generate(prompt, max_new_tokens=40, do_sample=False, assistant_model=drafter)
        for eos in first_occurrences_accepted_mid_block(prompt.shape[1], unstopped, drafter.last_trace)[:2]:
            expected = target.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=eos, pad_token_id=0)
            produced = target.generate(
                prompt, max_new_tokens=40, do_sample=False, eos_token_id=eos, pad_token_id=0, assistant_model=drafter
            )
            assert produced.tolist() == expected.tolist()
            assert produced[0, -1].item() == eos and produced.shape[1] < unstopped.shape[1]
            last = drafter.last_trace[-1]
            stop = last.committed_ids.index(eos)
            # The EOS was a verified draft token; transformers cuts the round there and counts it as the
            # round's last (target) token, so the accepted drafts behind it never reach the output.
            assert last.committed_ids[-1] == eos and last.draft_ids[stop] == eos and stop < last.num_verified
            checked += 1
    assert checked >= 3


class Collector(BaseStreamer):
    def __init__(self):
        self.chunks = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_exactly_the_committed_tokens(tmp_path):
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram")
    prompt = prompts(1, seed=9)[0]
    streamer = Collector()
    produced = target.generate(prompt, max_new_tokens=30, do_sample=False, assistant_model=drafter, streamer=streamer)
    assert streamer.ended
    assert streamer.chunks[0] == prompt[0].tolist()  # transformers streams the prompt first
    streamed = [t for chunk in streamer.chunks[1:] for t in chunk]
    assert streamed == produced[0, prompt.shape[1] :].tolist()
    # one chunk per round (plus the prefill token): multi-token chunks prove per-round delivery
    assert len(streamer.chunks) - 2 == len(drafter.last_trace)
    assert max(len(c) for c in streamer.chunks[1:]) > 1


def test_attention_mask_and_return_dict(tmp_path):
    target = tiny_target("qwen3")
    drafter = build(target, tmp_path, "bigram")
    prompt = prompts(1, seed=2)[0]
    mask = torch.ones_like(prompt)
    kwargs = dict(attention_mask=mask, max_new_tokens=17, do_sample=False, return_dict_in_generate=True, output_scores=True)
    expected = target.generate(prompt, **kwargs)
    produced = target.generate(prompt, assistant_model=drafter, **kwargs)
    assert produced.sequences.tolist() == expected.sequences.tolist()
    assert len(produced.scores) == len(expected.scores) == 17
    for mine, theirs in zip(produced.scores, expected.scores):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def test_left_padded_prompt_matches_plain_generate(tmp_path):
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram")
    prompt = torch.cat((torch.zeros(1, 3, dtype=torch.long), prompts(1, seed=4)[0]), dim=1)
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0
    expected = target.generate(prompt, attention_mask=mask, max_new_tokens=20, do_sample=False)
    produced = target.generate(prompt, attention_mask=mask, max_new_tokens=20, do_sample=False, assistant_model=drafter)
    assert produced.tolist() == expected.tolist()
    assert_rounds_match(drafter.last_trace, reference_rounds(target, drafter, prompt, expected, attention_mask=mask))


def test_greedy_ensemble_verification_gets_the_draft_distribution(tmp_path):
    """assistant_ensemble_weight makes greedy verification read q, so greedy drafting must hand it over."""
    target = tiny_target("qwen3")
    drafter = build(target, tmp_path, "bigram")
    prompt = prompts(1, seed=6)[0]
    target.generate(prompt, max_new_tokens=15, do_sample=False, assistant_model=drafter, assistant_ensemble_weight=0.7)
    assert max(r.num_verified for r in drafter.last_trace) > 0


def test_greedy_with_logits_processors(tmp_path):
    target = tiny_target("qwen3")
    drafter = build(target, tmp_path, "bigram")
    for prompt in prompts(4, seed=11):
        kwargs = dict(max_new_tokens=25, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=4)
        expected = target.generate(prompt, **kwargs)
        assert target.generate(prompt, assistant_model=drafter, **kwargs).tolist() == expected.tolist()


def test_scheduler_settings_precedence(tmp_path):
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram", block_size=7)
    prompt = prompts(1, seed=3)[0]
    # default: the whole block is verified
    target.generate(prompt, max_new_tokens=30, do_sample=False, assistant_model=drafter)
    assert max(r.num_verified for r in drafter.last_trace) == 7
    # the drafter's generation_config sets the cap...
    drafter.generation_config.num_assistant_tokens = 3
    target.generate(prompt, max_new_tokens=30, do_sample=False, assistant_model=drafter)
    assert max(r.num_verified for r in drafter.last_trace) == 3
    # ...and generate() kwargs override it, even when equal to transformers' own global default
    target.generate(prompt, max_new_tokens=30, do_sample=False, assistant_model=drafter, num_assistant_tokens=20)
    assert max(r.num_verified for r in drafter.last_trace) == 7
    target.generate(prompt, max_new_tokens=30, do_sample=False, assistant_model=drafter, num_assistant_tokens=2)
    assert max(r.num_verified for r in drafter.last_trace) == 2
    # a threshold of 1.0 verifies nothing: every round commits exactly the target's own token
    target.generate(
        prompt, max_new_tokens=10, do_sample=False, assistant_model=drafter, assistant_confidence_threshold=1.0
    )
    assert all(r.num_verified == 0 and len(r.committed_ids) == 1 for r in drafter.last_trace)
    assert {len(r.draft_ids) for r in drafter.last_trace} <= {0, 7}  # whole blocks drafted, then pruned
    assert any(len(r.draft_ids) == 7 for r in drafter.last_trace)


def test_generation_config_object_sets_threshold(tmp_path):
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram")
    config = GenerationConfig(max_new_tokens=10, do_sample=False, assistant_confidence_threshold=1.0)
    target.generate(prompts(1)[0], generation_config=config, assistant_model=drafter)
    assert all(r.num_verified == 0 for r in drafter.last_trace)


def test_no_global_patching(tmp_path):
    """Only the attached instance changes, and only when the assistant is a DSpark drafter."""
    target = tiny_target("llama")
    other = tiny_target("llama", seed=5)
    class_method = type(target)._get_candidate_generator
    build(target, tmp_path, "bigram")  # loading attaches the hook to `target` only
    assert type(target)._get_candidate_generator is class_method
    assert "_get_candidate_generator" in vars(target) and "_get_candidate_generator" not in vars(other)
    # the patched instance still runs ordinary assisted generation with a normal assistant model
    prompt = prompts(1)[0]
    expected = target.generate(prompt, max_new_tokens=12, do_sample=False)
    assert target.generate(prompt, max_new_tokens=12, do_sample=False, assistant_model=other).tolist() == expected.tolist()
    assert target.generate(prompt, max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=3).tolist() == expected.tolist()


def test_drafter_for_another_target_is_refused(tmp_path):
    target = tiny_target("llama")
    other = tiny_target("llama", seed=5)
    drafter = build(target, tmp_path, "bigram")
    DSparkDrafter.from_pretrained(tmp_path / "d", other)  # attaches `other`
    with pytest.raises(ValueError, match="another model"):
        other.generate(prompts(1)[0], max_new_tokens=5, assistant_model=drafter)


def test_batch_larger_than_one_is_a_clear_error(tmp_path):
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram")
    batch = torch.randint(0, MASK_ID, (2, 6))
    with pytest.raises(ValueError, match="batch_size = 1"):
        target.generate(batch, max_new_tokens=5, assistant_model=drafter)


def test_candidate_generator_is_the_public_class(tmp_path):
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram")
    generator = target._get_candidate_generator(
        generation_config=GenerationConfig(max_length=20, do_sample=False),
        input_ids=prompts(1)[0],
        inputs_tensor=None,
        logits_processor=None,
        model_kwargs={},
        assistant_model=drafter,
    )
    assert isinstance(generator, DSparkCandidateGenerator)
    assert generator.model_kwargs_overrides == {"output_hidden_states": [i + 1 for i in drafter.config.target_layer_ids]}
    # transformers >= 5.25 asks every candidate generator how many tokens a round may propose (the drafter's threshold
    # scheduler in tests has no n-gram rounds, so its block)
    assert generator.num_drafting_tokens == drafter.config.num_draft_tokens


def test_a_prefilled_cache_still_gives_the_drafter_the_whole_context(tmp_path):
    """Prefix caching: transformers' assisted decoding would read the cached start of the prompt twice,
    and the drafter needs its features; the prompt is read again, with a warning, and every round must
    equal the reference that sees the whole sequence."""
    target = tiny_target("qwen3")
    drafter = build(target, tmp_path, "bigram")
    prompt = prompts(3, seed=8)[2]
    with torch.no_grad():
        prefix_cache = target(prompt[:, :-3], use_cache=True).cache
    expected = target.generate(prompt, max_new_tokens=25, do_sample=False)
    with pytest.warns(UserWarning, match=f"already holding {prompt.shape[1] - 3} tokens"):
        produced = target.generate(prompt, max_new_tokens=25, do_sample=False, assistant_model=drafter,
                                   cache=prefix_cache)
    assert produced.tolist() == expected.tolist()
    assert_rounds_match(drafter.last_trace, reference_rounds(target, drafter, prompt, expected))


def test_the_torch_floor_has_what_the_code_uses():
    """enable_gqa in scaled_dot_product_attention arrived in torch 2.5."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    floor = re.search(r'"torch>=(\d+)\.(\d+)', (root / "pyproject.toml").read_text())
    uses_gqa = "enable_gqa" in (root / "src" / "dspark_hf" / "core" / "modeling.py").read_text()
    assert not uses_gqa or (int(floor[1]), int(floor[2])) >= (2, 5)


def test_the_private_methods_we_wrap_keep_their_parameters():
    """attach_to_target wraps two private transformers methods; a release that renames their parameters fails
    here and at attach time, in one line, instead of drafting wrongly."""
    from dspark_hf.core.generation import PATCHED_METHODS, attach_to_target, check_patched_signatures

    target = tiny_target("qwen3")
    check_patched_signatures(target)  # this transformers
    renamed = type("Renamed", (type(target),), {
        "_get_candidate_generator": lambda self, config, logits_processor, assistant_model=None: None,
    })
    target.__class__ = renamed
    with pytest.raises(RuntimeError, match=r"changed Renamed\._get_candidate_generator \(missing: generation_config\)"):
        attach_to_target(target)
    assert "_get_candidate_generator" not in vars(target) and set(PATCHED_METHODS) == {
        "_get_candidate_generator", "_prepare_generation_config"}
