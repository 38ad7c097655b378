"""The transformers surfaces users reach for, each with a DSpark drafter: pipeline, streamers,
a saved GenerationConfig, and the `custom_generate` convention (examples in docs/surfaces.md).

Each compares with plain greedy decoding, and checks that the drafter really drafted."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, TextIteratorStreamer, TextStreamer, pipeline

import dspark_hf
from conftest import VOCAB, drafter_config, tiny_target, write_bigram_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.core.scheduling import CostTable

PROMPT = "w3 w4 w5 w6"
NEW_TOKENS = 16


def word_tokenizer() -> PreTrainedTokenizerFast:
    """One word per token id of the tiny target's vocabulary: w0 .. w23."""
    backend = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = tiny_target("qwen3")
    # Special tokens in the model config (not the generation config, so that generation does not stop early):
    # transformers' pipeline compares them with the assistant's.
    target.config.bos_token_id, target.config.eos_token_id, target.config.pad_token_id = 1, 2, 0
    drafter = DSparkDrafter.from_pretrained(write_bigram_deepspec(target, tmp_path_factory.mktemp("d")), target)
    # Built before the per-test defaults apply: the threshold scheduler, whole blocks, DSpark rounds only.
    drafter.generation_config.dspark_scheduler, drafter.generation_config.dspark_ngram = "threshold", False
    return target, drafter, word_tokenizer()


def prompt_ids(tokenizer) -> torch.Tensor:
    return tokenizer(PROMPT, return_tensors="pt")["input_ids"]


def plain_ids(target, tokenizer) -> list[int]:
    return target.generate(prompt_ids(tokenizer), max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()


def test_pipeline_takes_the_drafter_at_construction_and_per_call(pair):
    target, drafter, tokenizer = pair
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    expected = plain(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False)

    # At construction transformers compares the assistant's special tokens with the model's.
    assisted = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
    rounds = []
    assert assisted(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False, dspark_rounds=rounds) == expected
    assert rounds and sum(r.num_accepted for r in rounds) > 0

    rounds = []
    assert plain(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False, assistant_model=drafter,
                 dspark_rounds=rounds) == expected
    assert rounds


def test_text_streamer_prints_the_assisted_text(pair, capsys):
    target, drafter, tokenizer = pair
    output = target.generate(prompt_ids(tokenizer), max_new_tokens=NEW_TOKENS, do_sample=False,
                             assistant_model=drafter, streamer=TextStreamer(tokenizer, skip_prompt=True))
    assert output[0].tolist() == plain_ids(target, tokenizer)
    generated = tokenizer.decode(output[0, prompt_ids(tokenizer).shape[1] :])
    assert capsys.readouterr().out.split() == generated.split()


def test_text_iterator_streamer_yields_the_assisted_text(pair):
    target, drafter, tokenizer = pair
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=60)
    result = {}

    def run():
        result["ids"] = target.generate(prompt_ids(tokenizer), max_new_tokens=NEW_TOKENS, do_sample=False,
                                        assistant_model=drafter, streamer=streamer)

    worker = threading.Thread(target=run)
    worker.start()
    pieces = list(streamer)
    worker.join()
    assert result["ids"][0].tolist() == plain_ids(target, tokenizer)
    generated = tokenizer.decode(result["ids"][0, prompt_ids(tokenizer).shape[1] :])
    assert "".join(pieces).split() == generated.split()
    assert len(pieces) > 1  # streamed round by round, not once at the end


def test_generation_config_round_trips_dspark_fields(pair, tmp_path):
    target, drafter, tokenizer = pair
    saved = GenerationConfig(
        max_new_tokens=NEW_TOKENS, do_sample=False, num_assistant_tokens=2, assistant_confidence_threshold=0.0,
        dspark_scheduler="cost", dspark_ngram=False,
    )
    saved.save_pretrained(tmp_path)
    loaded = GenerationConfig.from_pretrained(tmp_path)
    fields = ("num_assistant_tokens", "assistant_confidence_threshold", "dspark_scheduler", "dspark_ngram")
    assert {key: getattr(loaded, key) for key in fields} == {key: getattr(saved, key) for key in fields}

    # The loaded config steers the call: the cost scheduler (a flat cost table: nothing profiled), 2 tokens a round.
    drafter.cost_table = CostTable(1e-4, (1e-2,) * 40)
    try:
        output = target.generate(prompt_ids(tokenizer), generation_config=loaded, assistant_model=drafter)
    finally:
        drafter.cost_table = None
    assert output[0].tolist() == plain_ids(target, tokenizer)
    assert drafter.last_scheduler == "cost"
    assert drafter.last_trace and max(r.num_verified for r in drafter.last_trace) == 2


def test_custom_generate_folder_runs_dspark_drafting(tmp_path):
    """A target and drafter built by hand, never attached: the shipped custom_generate/ routes the call."""
    target = tiny_target("qwen3")
    drafter = DSparkDrafter(drafter_config(target), target)
    prompt = torch.tensor([[3, 4, 5, 6]])
    expected = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False).tolist()
    rounds = []
    output = target.generate(
        prompt, max_new_tokens=NEW_TOKENS, do_sample=False, assistant_model=drafter, dspark_rounds=rounds,
        custom_generate=os.path.dirname(dspark_hf.__file__), trust_remote_code=True,
    )
    assert output.tolist() == expected
    assert rounds and drafter.last_trace
    with pytest.raises(ValueError, match="trust_remote_code"):
        target.generate(prompt, max_new_tokens=2, assistant_model=drafter,
                        custom_generate=os.path.dirname(dspark_hf.__file__), trust_remote_code=False)
