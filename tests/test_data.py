"""Tests for dspark_hf.tools.training.data with a tiny random Llama and a word-level tokenizer."""

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from dspark_hf.tools.cli import main
from dspark_hf.tools.prompts import read_prompts, render_prompt
from dspark_hf.tools.training.data import load_sequences, regenerate, tokenize_texts

WORDS = ["<pad>", "<unk>", "user", "bot", "nothink"] + [f"w{i}" for i in range(27)]
CHAT_TEMPLATE = (
    "{% for message in messages %}user {{ message['content'] }} {% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}nothink {% endif %}"
    "{% if add_generation_prompt %}bot{% endif %}"
)
# Prompt lengths differ a lot, so batches need real left padding.
PROMPTS = [
    "w3",
    "w4 w5 w6 w7 w8 w9 w10 w11 w12 w13",
    "w14 w15",
    "w16 w17 w18 w19 w20",
    "w21 w22 w23 w24 w25 w26 w3 w4",
    "w5 w9",
    "w7 w7 w7 w7 w7 w7 w7 w7 w7 w7 w7 w7 w7 w7 w7 w7 w7",
    "w26 w1 w8",
]
MAX_NEW_TOKENS = 10


def make_tokenizer(eos_word="w0"):
    backend = Tokenizer(models.WordLevel(vocab={word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=eos_word, pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def greedy_alone(model, prompt_ids):
    """Reference: unpadded greedy generation of one prompt, cut after the first EOS."""
    output = model.generate(
        torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=MAX_NEW_TOKENS,
    )
    response = output[0, len(prompt_ids):].tolist()
    eos = model.generation_config.eos_token_id
    return response[: response.index(eos) + 1] if eos in response else response


@pytest.fixture(scope="module")
def target_and_tokenizer():
    """Tiny random Llama whose EOS is a token it emits mid-response for some prompts only.

    A random model rarely chooses any fixed EOS, so the EOS word is picked from
    its own greedy outputs; that makes the early-stop path actually exercised.
    A wide weight init keeps the outputs varied and the logits far from ties.
    """
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, initializer_range=0.2, pad_token_id=0, bos_token_id=None,
        eos_token_id=None, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    tokenizer = make_tokenizer()
    continuations = [greedy_alone(model, render_prompt(tokenizer, prompt)) for prompt in PROMPTS]

    def stop_positions(token):
        return [c.index(token) if token in c else None for c in continuations]

    eos_id = next(
        token for token in range(WORDS.index("w0"), len(WORDS))
        if None in stop_positions(token) and len({p for p in stop_positions(token) if p}) >= 2
    )
    model.generation_config.eos_token_id = eos_id
    return model, make_tokenizer(eos_word=WORDS[eos_id])


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_read_prompts_interleaves_round_robin(tmp_path):
    files = {"a": ["a1", "a2", "a3"], "b": ["b1"], "c": ["c1", "c2"]}
    for name, prompts in files.items():
        write_jsonl(tmp_path / f"{name}.jsonl", [{"turns": [p, "second turn"]} for p in prompts])
    paths = [tmp_path / f"{name}.jsonl" for name in files]

    assert read_prompts(paths) == ["a1", "b1", "c1", "a2", "c2", "a3"]
    assert read_prompts(paths, limit=4) == ["a1", "b1", "c1", "a2"]


@pytest.mark.parametrize("bad_line", ['{"turns": ["ok"', '{"text": "no turns"}', '{"turns": []}'])
def test_read_prompts_names_file_and_line_of_bad_record(tmp_path, bad_line):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"turns": ["fine"]}) + "\n\n" + bad_line + "\n")

    with pytest.raises(ValueError, match=rf"{path}, line 3"):
        read_prompts([path])


def test_render_prompt_uses_chat_template_in_non_thinking_mode():
    tokenizer = make_tokenizer()
    expected = tokenizer("user w3 w4 nothink bot", add_special_tokens=False)["input_ids"]
    assert render_prompt(tokenizer, "w3 w4") == expected


def test_render_prompt_without_chat_template_tokenizes_plainly():
    tokenizer = make_tokenizer()
    tokenizer.chat_template = None
    assert render_prompt(tokenizer, "w3 w4") == tokenizer("w3 w4")["input_ids"]


def test_tokenize_texts_cuts_texts_into_response_chunks():
    tokenizer = make_tokenizer()
    ids = tokenizer("w3 w4 w5 w6 w7", add_special_tokens=False)["input_ids"]
    records = tokenize_texts(tokenizer, ["w3 w4 w5 w6 w7", "w8", "w9 w10"], chunk_tokens=2)
    # chunks of two tokens; a one-token chunk (the text's tail, or a whole text) predicts nothing and is dropped
    assert [r["response_ids"] for r in records] == [ids[:2], ids[2:4], tokenizer("w9 w10")["input_ids"]]
    assert [r["prompt_index"] for r in records] == [0, 1, 2] and all(r["prompt_ids"] == [] for r in records)


def test_regenerate_matches_unbatched_greedy_up_to_eos(tmp_path, target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    out_path = tmp_path / "regen.jsonl"

    regenerate(model, tokenizer, PROMPTS, out_path, batch_size=3, max_new_tokens=MAX_NEW_TOKENS)

    records = {record["prompt_index"]: record for record in load_sequences(out_path)}
    assert sorted(records) == list(range(len(PROMPTS)))
    eos = tokenizer.eos_token_id
    stopped_early = 0
    for index, prompt in enumerate(PROMPTS):
        prompt_ids = render_prompt(tokenizer, prompt)
        assert records[index]["prompt_ids"] == prompt_ids
        response = records[index]["response_ids"]
        assert response == greedy_alone(model, prompt_ids)
        assert eos not in response[:-1]
        stopped_early += response[-1] == eos and len(response) < MAX_NEW_TOKENS
    assert 0 < stopped_early < len(PROMPTS)  # both stopping and non-stopping responses were checked


def test_regenerate_resumes_after_kill_mid_write(tmp_path, target_and_tokenizer, monkeypatch):
    model, tokenizer = target_and_tokenizer
    complete_path = tmp_path / "complete.jsonl"
    regenerate(model, tokenizer, PROMPTS, complete_path, batch_size=3, max_new_tokens=MAX_NEW_TOKENS)
    complete_lines = complete_path.read_text().splitlines(keepends=True)

    # A run killed after four records, in the middle of writing the fifth.
    resumed_path = tmp_path / "resumed.jsonl"
    resumed_path.write_text("".join(complete_lines[:4]) + complete_lines[4][:15])
    assert len(load_sequences(resumed_path)) == 4

    generated_rows = []
    original_generate = model.generate

    def counting_generate(*args, **kwargs):
        generated_rows.append(kwargs["input_ids"].shape[0])
        return original_generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", counting_generate)
    regenerate(model, tokenizer, PROMPTS, resumed_path, batch_size=3, max_new_tokens=MAX_NEW_TOKENS)

    assert sum(generated_rows) == len(PROMPTS) - 4
    lines = resumed_path.read_text().splitlines()
    resumed = sorted((json.loads(line) for line in lines), key=lambda record: record["prompt_index"])
    complete = sorted(load_sequences(complete_path), key=lambda record: record["prompt_index"])
    assert resumed == complete


def test_regenerate_skips_prompts_over_the_length_limit(tmp_path, target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    lengths = [len(render_prompt(tokenizer, prompt)) for prompt in PROMPTS]
    limit = sorted(lengths)[-3]  # the two longest prompts exceed it
    out_path = tmp_path / "regen.jsonl"

    regenerate(model, tokenizer, PROMPTS, out_path, batch_size=4, max_new_tokens=MAX_NEW_TOKENS,
               max_prompt_tokens=limit)

    written = sorted(record["prompt_index"] for record in load_sequences(out_path))
    assert written == [index for index, length in enumerate(lengths) if length <= limit]
    assert len(written) == len(PROMPTS) - 2

    # the band an earlier file skipped: only prompts of limit + 1 tokens or more, indexed as before
    band = tmp_path / "longer.jsonl"
    regenerate(model, tokenizer, PROMPTS, band, batch_size=4, max_new_tokens=MAX_NEW_TOKENS,
               min_prompt_tokens=limit + 1, max_prompt_tokens=max(lengths))
    assert sorted(record["prompt_index"] for record in load_sequences(band)) == [
        index for index, length in enumerate(lengths) if length > limit]


def test_load_sequences_rejects_damage_before_the_last_line(tmp_path):
    path = tmp_path / "regen.jsonl"
    record = {"prompt_index": 0, "prompt_ids": [1], "response_ids": [2]}
    path.write_text(json.dumps(record) + "\n" + '{"prompt_in\n' + json.dumps(record) + "\n")

    with pytest.raises(ValueError, match=rf"{path}, line 2"):
        load_sequences(path)


def test_regenerate_samples_several_answers_per_prompt_and_resumes(tmp_path, target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    out_path = tmp_path / "sampled.jsonl"
    torch.manual_seed(0)
    done = regenerate(model, tokenizer, PROMPTS, out_path, batch_size=3, max_new_tokens=MAX_NEW_TOKENS,
                      temperature=1.5, samples_per_prompt=2)

    records = load_sequences(out_path)
    assert done.answers == len(records) == 2 * len(PROMPTS)
    keys = sorted((r["prompt_index"], r["sample"]) for r in records)
    assert keys == [(index, sample) for index in range(len(PROMPTS)) for sample in (0, 1)]
    assert all(r["temperature"] == 1.5 for r in records)
    by_prompt = {}
    for record in records:
        by_prompt.setdefault(record["prompt_index"], []).append(record["response_ids"])
    assert any(first != second for first, second in by_prompt.values())  # sampled, not greedy twice
    again = regenerate(model, tokenizer, PROMPTS, out_path, batch_size=3, max_new_tokens=MAX_NEW_TOKENS,
                       temperature=1.5, samples_per_prompt=2)
    assert again.answers == 0 and len(load_sequences(out_path)) == 2 * len(PROMPTS)

    with pytest.raises(ValueError, match=rf"{out_path} holds answers at temperature 1.5, not 0"):
        regenerate(model, tokenizer, PROMPTS, out_path, max_new_tokens=MAX_NEW_TOKENS)
    with pytest.raises(ValueError, match="give a temperature above 0"):
        regenerate(model, tokenizer, PROMPTS, tmp_path / "greedy.jsonl", samples_per_prompt=2)


def test_regenerate_command_writes_what_the_function_writes_and_reports_answers_per_hour(
    tmp_path, target_and_tokenizer, capsys
):
    model, tokenizer = target_and_tokenizer
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    write_jsonl(tmp_path / "prompts.jsonl", [{"turns": [prompt]} for prompt in PROMPTS])
    out_path = tmp_path / "answers.jsonl"

    main(["regenerate", "--target", str(tmp_path / "target"), "--prompts", str(tmp_path / "prompts.jsonl"),
          "--out", str(out_path), "--batch-size", "3", "--max-new-tokens", str(MAX_NEW_TOKENS), "--dtype", "float32",
          "--threads", "1"])

    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["answers"] == len(PROMPTS) and report["skipped"] == 0 and report["answers_per_hour"] > 0
    for record in load_sequences(out_path):
        assert record["response_ids"] == greedy_alone(model, render_prompt(tokenizer, PROMPTS[record["prompt_index"]]))
