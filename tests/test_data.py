"""Tests for dspark_hf.tools.training.data with a tiny random Llama and a word-level tokenizer."""

import ast
import functools
import gzip
import json
import pathlib
import re
import subprocess
import sys

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.cache_utils import DynamicLayer

from dspark_hf.tools.cli import main
from dspark_hf.tools.prompts import read_prompts, render_prompt
from dspark_hf.tools.training.data import load_sequences, read_jsonl, tokenize_texts
from dspark_hf.tools.training.regenerate import PreallocatedLayer, regenerate
from dspark_hf.tools.training.synthesize import KIND_OPENERS, PromptFilter, batch_seed, synthesize, user_header, words

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


def test_load_sequences_rejects_damage_before_the_last_line(tmp_path):
    path = tmp_path / "regen.jsonl"
    record = {"prompt_index": 0, "prompt_ids": [1], "response_ids": [2]}
    path.write_text(json.dumps(record) + "\n" + '{"prompt_in\n' + json.dumps(record) + "\n")

    with pytest.raises(ValueError, match=rf"{path}, line 2"):
        load_sequences(path)


# ------------------------------------------------------------------ regenerate: shards of the target's answers
def answers_in(folder):
    return {(r["prompt_index"], r.get("sample", 0)): r for r in load_sequences(folder)}


def count_rows(monkeypatch, model):
    """Rows of every forward pass after the prefill, per regenerate batch (each pass checks its cache)."""
    rows = []
    original = model.forward

    @functools.wraps(original)  # keeps the signature, which says how the cache is passed
    def counting(*args, **kwargs):
        rows.append((kwargs["input_ids"].shape[1] > 1, kwargs["input_ids"].shape[0]))
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        assert all(type(layer) is PreallocatedLayer for layer in cache.layers)  # no copy of the cache per step
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting)
    return rows


def test_regenerate_matches_unbatched_greedy_and_drops_finished_rows(tmp_path, target_and_tokenizer, monkeypatch):
    model, tokenizer = target_and_tokenizer
    alone = [greedy_alone(model, render_prompt(tokenizer, prompt)) for prompt in PROMPTS]
    rows = count_rows(monkeypatch, model)

    done = regenerate(model, tokenizer, PROMPTS, tmp_path / "out", batch_size=4, shard_size=3,
                      max_new_tokens=MAX_NEW_TOKENS)

    decode_rows = sum(count for prefill, count in rows if not prefill)
    records = answers_in(tmp_path / "out")
    assert done.answers == len(records) == len(PROMPTS)
    eos, stopped_early = tokenizer.eos_token_id, 0
    for index, prompt in enumerate(PROMPTS):
        prompt_ids = render_prompt(tokenizer, prompt)
        response = records[(index, 0)]["response_ids"]
        assert records[(index, 0)]["prompt_ids"] == prompt_ids
        assert response == alone[index]
        stopped_early += response[-1] == eos and len(response) < MAX_NEW_TOKENS
    assert 0 < stopped_early < len(PROMPTS)  # both stopping and non-stopping answers were checked
    # a finished row leaves the batch: after the prefill, one row per answer token still to come
    assert decode_rows == sum(len(r["response_ids"]) - 1 for r in records.values())
    # shards 0 and 1 hold prompts 0-2 and 3-5, compressed; the tail (6-7) waits for a third prompt
    names = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert names == ["recipe.json", "shard-00000.jsonl.gz", "shard-00001.jsonl.gz", "shard-00002.partial.jsonl"]


def test_preallocated_layer_holds_what_concatenation_holds_without_reallocating():
    torch.manual_seed(0)
    grown, preallocated = DynamicLayer(), PreallocatedLayer(capacity=9)
    steps = [(torch.randn(4, 2, 5, 3), torch.randn(4, 2, 5, 8))] + [
        (torch.randn(4, 2, 1, 3), torch.randn(4, 2, 1, 8)) for _ in range(2)]
    rows = torch.tensor([0, 2, 3])
    for step, (keys, values) in enumerate(steps + [(k[rows], v[rows]) for k, v in steps[1:]]):
        if step == len(steps):  # one row finished: both keep rows 0, 2 and 3
            grown.batch_select_indices(rows)
            preallocated.batch_select_indices(rows)
        expected = grown.update(keys, values)
        storage = preallocated.key_buffer.untyped_storage().data_ptr() if step else None
        got = preallocated.update(keys, values)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
        assert preallocated.get_seq_length() == grown.get_seq_length() == 5 + step
        if step:  # written in place: the buffers allocated by the prefill are the ones still in use
            assert preallocated.key_buffer.untyped_storage().data_ptr() == storage
    with pytest.raises(RuntimeError, match="holds 9 positions"):
        preallocated.update(*(tensor[rows] for tensor in steps[1]))


def test_regenerate_rewrites_one_shard_and_resumes_after_a_kill(tmp_path, target_and_tokenizer, monkeypatch):
    model, tokenizer = target_and_tokenizer
    out = tmp_path / "out"
    regenerate(model, tokenizer, PROMPTS, out, batch_size=2, shard_size=4, max_new_tokens=MAX_NEW_TOKENS)
    complete = answers_in(out)
    first_shard = (out / "shard-00001.jsonl.gz").read_bytes()

    # shard 1 killed after one answer and in the middle of writing the second
    lines = gzip.decompress(first_shard).decode().splitlines(keepends=True)
    (out / "shard-00001.jsonl.gz").unlink()
    (out / "shard-00001.partial.jsonl").write_text(lines[0] + lines[1][:15])
    rows = count_rows(monkeypatch, model)
    later = gzip.time.time() + 3600  # a rerun an hour on still writes the same bytes
    monkeypatch.setattr(gzip.time, "time", lambda: later)
    again = regenerate(model, tokenizer, PROMPTS, out, batch_size=2, shard_size=4, shards=[1],
                       max_new_tokens=MAX_NEW_TOKENS)

    assert again.answers == 3 and sum(count for prefill, count in rows if prefill) == 3
    assert (out / "shard-00001.jsonl.gz").read_bytes() == first_shard
    assert answers_in(out) == complete


def test_regenerate_skips_prompts_outside_the_length_band(tmp_path, target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    lengths = [len(render_prompt(tokenizer, prompt)) for prompt in PROMPTS]
    limit = sorted(lengths)[-3]  # the two longest prompts exceed it

    done = regenerate(model, tokenizer, PROMPTS, tmp_path / "short", batch_size=4, max_new_tokens=MAX_NEW_TOKENS,
                      max_prompt_tokens=limit)
    assert done.skipped == 2
    assert sorted(i for i, _ in answers_in(tmp_path / "short")) == [i for i, n in enumerate(lengths) if n <= limit]

    regenerate(model, tokenizer, PROMPTS, tmp_path / "long", batch_size=4, max_new_tokens=MAX_NEW_TOKENS,
               min_prompt_tokens=limit + 1, max_prompt_tokens=max(lengths))
    assert sorted(i for i, _ in answers_in(tmp_path / "long")) == [i for i, n in enumerate(lengths) if n > limit]


def test_regenerate_samples_several_answers_and_refuses_another_recipe(tmp_path, target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    out = tmp_path / "sampled"
    torch.manual_seed(0)
    done = regenerate(model, tokenizer, PROMPTS, out, batch_size=3, max_new_tokens=MAX_NEW_TOKENS,
                      temperature=1.5, samples_per_prompt=2)

    records = answers_in(out)
    assert done.answers == len(records) == 2 * len(PROMPTS)
    assert sorted(records) == [(index, sample) for index in range(len(PROMPTS)) for sample in (0, 1)]
    assert any(records[(i, 0)]["response_ids"] != records[(i, 1)]["response_ids"] for i in range(len(PROMPTS)))
    with pytest.raises(ValueError, match=r"temperature: 1.5 there, 0.0 now"):
        regenerate(model, tokenizer, PROMPTS, out, max_new_tokens=MAX_NEW_TOKENS)
    with pytest.raises(ValueError, match="give a temperature above 0"):
        regenerate(model, tokenizer, PROMPTS, tmp_path / "greedy", samples_per_prompt=2)


def test_regenerate_command_writes_what_the_function_writes_and_reports_answers_per_hour(
    tmp_path, target_and_tokenizer, capsys
):
    model, tokenizer = target_and_tokenizer
    model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    write_jsonl(tmp_path / "prompts.jsonl", [{"turns": [prompt]} for prompt in PROMPTS])

    main(["regenerate", "--target", str(tmp_path / "target"), "--prompts", str(tmp_path / "prompts.jsonl"),
          "--out", str(tmp_path / "answers"), "--batch-size", "3", "--shard-size", "4",
          "--max-new-tokens", str(MAX_NEW_TOKENS), "--dtype", "float32", "--threads", "1"])

    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["answers"] == len(PROMPTS) and report["skipped"] == 0 and report["answers_per_hour"] > 0
    for record in load_sequences(tmp_path / "answers"):
        assert record["response_ids"] == greedy_alone(model, render_prompt(tokenizer, PROMPTS[record["prompt_index"]]))


# ------------------------------------------------------------------ synthesize: prompts the target writes
def test_prompt_filter_says_why_a_prompt_is_dropped():
    dev = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."]
    keep = PromptFilter(dev, kept=["What is the capital of France?"])
    assert keep.reason("How do I reverse a list in Python without copying it?", complete=True) == ""
    assert keep.reason("How do I reverse a list in Python without copying it?", complete=True) == "duplicate"
    assert keep.reason("what is the capital of   France", complete=True) == "duplicate"
    assert keep.reason("Write a poem about the sea and the sky at night", complete=False) == "unfinished"
    assert keep.reason("Hi there", complete=True) == "length"
    assert keep.reason("Écrivez une fonction qui trie une liste de nombres réels données", complete=True) == "language"
    assert keep.reason("I'm sorry, but as an AI I cannot help you with the request.", complete=True) == "refusal"
    assert keep.reason("the cat the cat the cat the cat the cat the cat the cat the cat", complete=True) == "loop"
    assert keep.reason("Natalia sold clips to 48 of her friends in April. How many in all?", complete=True) == "near-dev"


@pytest.mark.parametrize("name", ["prompts.jsonl", "prompts.jsonl.gz"])
def test_synthesize_writes_exactly_count_prompts_of_each_kind_and_resumes(name, tmp_path, target_and_tokenizer,
                                                                          monkeypatch):
    model, tokenizer = target_and_tokenizer
    monkeypatch.setattr(PromptFilter, "reason", lambda self, text, complete: "" if complete else "unfinished")
    out = tmp_path / name

    first = synthesize(model, tokenizer, out, count=4, kinds=("math", "code"), batch_size=8, max_prompt_tokens=6)
    second = synthesize(model, tokenizer, out, count=7, kinds=("math", "code"), batch_size=8, max_prompt_tokens=6)

    text = gzip.decompress(out.read_bytes()).decode() if name.endswith(".gz") else out.read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert first["written"] == 4 and second["written"] == 3 and len(records) == 7
    assert {r["kind"] for r in records} == {"math", "code"} and all(r["source"] == "magpie" for r in records)
    assert read_prompts([out]) == [r["turns"][0] for r in records]  # a prompt file like any other
    assert [p.name for p in tmp_path.iterdir()] == [name]  # nothing left beside it
    header = tokenizer.decode(user_header(tokenizer, "code"))
    assert header.startswith("user") and "w" not in header  # the template up to the user's words, no further


def test_writing_prompts_open_with_an_imperative_drawn_per_batch(tmp_path, target_and_tokenizer, monkeypatch):
    """A writing prompt is the opener the target was handed plus what it wrote after it, one opener drawn per batch
    (from the bare header the target asks for advice, not for a text)."""
    model, tokenizer = target_and_tokenizer
    monkeypatch.setattr(PromptFilter, "reason", lambda self, text, complete: "")
    monkeypatch.setitem(KIND_OPENERS, "writing", ("w1 w2", "w3", "w4 w5", "w6"))  # words the tiny tokenizer has
    out = tmp_path / "writing.jsonl"
    synthesize(model, tokenizer, out, count=12, kinds=("writing",), batch_size=4, max_prompt_tokens=4)
    records = read_jsonl(out)
    openers = KIND_OPENERS["writing"]
    drawn = [openers[batch_seed(0, 0, batch) % len(openers)] for batch in range(3)]
    assert [r["turns"][0].startswith(drawn[n // 4]) for n, r in enumerate(records)] == [True] * 12
    assert {r["kind"] for r in records} == {"writing"}
    header, opened = user_header(tokenizer, "writing"), user_header(tokenizer, "writing", "w4 w5")
    assert opened[:len(header)] == header and tokenizer.decode(opened[len(header):]) == "w4 w5"


def test_a_resumed_synthesize_samples_afresh(tmp_path, target_and_tokenizer, monkeypatch):
    """Every batch of every run draws with its own seed. A run that continues a file must not replay the batches
    its predecessor drew past the file's end (there, dropped prompts move the count on): those come back as
    duplicates, 6-10% of a round once it happened."""
    model, tokenizer = target_and_tokenizer

    def every_other(self, text, complete):  # half of what is written is dropped
        self.calls = getattr(self, "calls", 0) + 1
        return "loop" if self.calls % 2 == 0 else ""

    monkeypatch.setattr(PromptFilter, "reason", every_other)
    out = tmp_path / "prompts.jsonl"
    for count in (4, 8, 12):
        synthesize(model, tokenizer, out, count=count, kinds=("chat",), batch_size=4, max_prompt_tokens=6)
    prompts = read_prompts([out])
    assert len(prompts) == 12 and len(set(prompts)) == 12


def test_synthesize_does_not_write_again_what_an_excluded_file_holds(tmp_path, target_and_tokenizer, monkeypatch):
    """What another machine answered, or holds out, must not come back as a new prompt: the same seed writes
    the same prompts again unless their file is excluded."""
    model, tokenizer = target_and_tokenizer
    monkeypatch.setattr(PromptFilter, "reason",  # duplicates only; the tiny target writes no English
                        lambda self, text, complete: "duplicate" if " ".join(words(text)) in self.seen else "")
    run = functools.partial(synthesize, model, tokenizer, count=6, kinds=("chat",), batch_size=6, max_prompt_tokens=6)
    earlier = read_prompts([run(tmp_path / "earlier.jsonl")["out"]])

    again = read_prompts([run(tmp_path / "again.jsonl")["out"]])
    report = run(tmp_path / "new.jsonl", exclude=tuple(earlier))

    assert again == earlier  # the seed alone decides: without the exclusion, every prompt comes back
    assert report["dropped"]["duplicate"] >= 1 and report["written"] == 6
    assert not set(read_prompts([report["out"]])) & set(earlier)


def test_committed_answer_shards_are_whole_and_answer_their_own_prompts():
    """Shards land by an unattended loop, bf16 ones in magpie/ and fp32 ones in magpie_fp32/ (whichever dtype the
    machine's `auto` was); together they must number 0..n-1 once each, each holding exactly its 256 prompts' answers."""
    root = pathlib.Path(__file__).resolve().parents[1] / "data" / "smollm2"
    folders = [root / "magpie", *[root / "magpie_fp32"] * (root / "magpie_fp32").is_dir()]
    recipes = [json.loads((folder / "recipe.json").read_text()) for folder in folders]
    assert [r["dtype"] for r in recipes] == ["bfloat16", "float32"][: len(folders)]
    assert all({**r, "dtype": None} == {**recipes[0], "dtype": None} for r in recipes)  # only the dtype differs
    size = recipes[0]["shard_size"]
    prompts = read_jsonl(root / "magpie_prompts.jsonl.gz")
    shards = sorted((path for folder in folders for path in folder.glob("shard-*.jsonl.gz")), key=lambda p: p.name)
    assert [p.name for p in shards] == [f"shard-{i:05d}.jsonl.gz" for i in range(len(shards))]
    assert len(prompts) >= size * len(shards) and {p["kind"] for p in prompts} == {"math", "code", "chat"}
    for number, shard in enumerate(shards):
        records = read_jsonl(shard)
        first = number * size
        assert sorted(r["prompt_index"] for r in records) == list(range(first, first + size)), shard
        assert all(r["prompt_ids"] and r["response_ids"] for r in records), shard
    assert sum(len(load_sequences(shard)) for shard in shards) == size * len(shards)  # what training reads of them


def skeleton(text: str) -> str:
    return re.sub(r"\d+", lambda m: "#" * len(m.group()), text)


def test_vary_prompts_redraws_the_numbers_of_training_prompts_only(tmp_path):
    """Variants are training data: none may come from a held-out prompt (`prompt_index % 20 == 19`) or sit close to
    a dev problem, and each keeps its origin's words and digit counts."""
    instruction = "Please reason step by step, and put your final answer within \\boxed{}."
    dev_problem = read_prompts(["gsm8k"])[0].rpartition("\n")[0]
    problems = [f"Tom has {i + 10} apples and buys {3 * i + 100} pears on day {i % 7 + 1}; how many fruits "
                f"does he have in shop {i} of the {i}th street?" for i in range(60)]
    problems[12] = dev_problem  # a training line that copies a dev problem: its variants are near-dev
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for kind in ("aime24", "arena-hard-v2", "lbpp", "livecodebench"):
        (prompts / f"{kind}.jsonl").write_text(json.dumps({"turns": [f"A {kind} prompt of 12 words."]}) + "\n")
    (prompts / "gsm8k.jsonl").write_text("".join(json.dumps({"turns": [p + "\n" + instruction]}) + "\n" for p in problems))
    out = tmp_path / "variants.jsonl.gz"
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "vary_prompts.py"
    subprocess.run([sys.executable, str(script), "--train-prompts", str(prompts), "--per-prompt", "3",
                    "--shard-size", "4", "--out", str(out)], check=True, capture_output=True)
    # round-robin order: aime24, arena-hard-v2, gsm8k, lbpp, livecodebench, then gsm8k alone from index 5
    index_of_line = [2] + list(range(5, 64))
    origin_text = {index: problems[line] for line, index in enumerate(index_of_line)}
    records = read_jsonl(out)
    origins = [r["origin"] for r in records]
    assert len(records) % 4 == 0 and len(records) >= 4 * 3 * 10
    assert all(origin % 20 != 19 for origin in origins) and {19, 39, 59} <= set(index_of_line)
    assert index_of_line[12] not in origins  # near-dev
    assert set(origins) <= set(origin_text) and len(set(origins)) >= 40
    for record in records:
        variant, _, last = record["turns"][0].rpartition("\n")
        assert last == instruction and record["source"] == "gsm8k-variant"
        assert skeleton(variant) == skeleton(origin_text[record["origin"]]) and not re.search(r"\b0\d", variant)
    assert sum(r["turns"][0].split("\n")[0] != origin_text[r["origin"]] for r in records) == len(records)
    assert len({r["turns"][0] for r in records}) == len(records)


def assert_whole_shards(folder: pathlib.Path, size: int = 256) -> list:
    """Shards named 0..n-1, shard k holding the answers to prompts k*size to (k+1)*size-1, none empty."""
    shards = sorted(folder.glob("shard-*.jsonl.gz"))
    assert shards and [p.name for p in shards] == [f"shard-{i:05d}.jsonl.gz" for i in range(len(shards))], folder
    for number, shard in enumerate(shards):
        records = read_jsonl(shard)
        assert sorted(r["prompt_index"] for r in records) == list(range(size * number, size * (number + 1))), shard
        assert all(r["prompt_ids"] and r["response_ids"] for r in records), shard
    return shards


def test_committed_gsm8k_variants_come_from_training_prompts_and_shards_answer_them():
    root = pathlib.Path(__file__).resolve().parents[1] / "data" / "smollm2"
    prompts = read_jsonl(root / "gsm8k_variants_prompts.jsonl.gz")
    assert len(prompts) == 256 * len(assert_whole_shards(root / "gsm8k_variants"))
    assert all(p["origin"] % 20 != 19 and p["source"] == "gsm8k-variant" for p in prompts)
    by_origin: dict = {}
    for p in prompts:
        by_origin.setdefault(p["origin"], set()).add(skeleton(p["turns"][0]))
    assert all(len(shapes) == 1 for shapes in by_origin.values())  # only the numbers differ between variants
    dev = [prompt.rpartition("\n")[0] for prompt in read_prompts(["gsm8k"])]
    keep = PromptFilter(dev, kept=[])
    assert not any(keep.reason(p["turns"][0].rpartition("\n")[0], complete=True) == "near-dev" for p in prompts)


def stub_prompts_module():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
    import stub_prompts
    return stub_prompts


def test_a_stub_takes_the_first_function_with_arguments_and_the_prompts_first_paragraph():
    stubs = stub_prompts_module()
    answer = ("Sure.\n```python\ndef broken(:\n```\nor\n```python\nimport math\nfrom typing import List\n\n"
              "def helper():\n    return 1\n\ndef area(radii: List[float],\n         scale=2) -> float:\n"
              "    total = 0\n    return total\n\nimport os\n```")
    assert stubs.signature(answer) == (["import math", "from typing import List"],
                                       "def area(radii: List[float],\n         scale=2) -> float:")
    assert stubs.signature("```python\ndef f():\n    pass\n```") is None  # no argument: nothing to call it with
    assert stubs.signature("def f(x):\n    return x") is None  # not in a fenced block
    assert stubs.signature("```python\ndef f(x): return x\n```") is None  # no header line to itself
    decorator = "```python\ndef deco(func):\n    @wraps(func)\n    def inner(*a):\n        return func(*a)\n    return inner\n```"
    assert stubs.signature(decorator) == ([], "def deco(func):")  # the inner function's decorator is body
    prompt = "Write a function that sums the areas of circles\nwith the given radii.\n\nHere is my try: ..."
    assert stubs.docstring(prompt) == "    Write a function that sums the areas of circles with the given radii."
    for unusable in ("Fix this code:", "Fix `x` in ```python\nx\n```", "Short one", "word " * 100):
        assert stubs.docstring(unusable) is None, unusable
    text = stubs.stub_prompt("Finish this Python function:", *stubs.signature(answer), stubs.docstring(prompt))
    instruction, code = text.split("\n", 1)
    assert instruction == "Finish this Python function:" and code.startswith("```python\n") and code.endswith("\n```")
    tree = ast.parse(code[len("```python\n"):-len("```")])
    function = tree.body[-1]
    assert function.name == "area" and [a.arg for a in function.args.args] == ["radii", "scale"]
    assert ast.get_docstring(function) == "Write a function that sums the areas of circles with the given radii."
    assert len(function.body) == 1  # the docstring alone: the body is the answer's to write
    assert stubs.parses(text) and not stubs.parses("Finish:\n```python\ndef f(x): return x\n```")


def test_committed_stub_prompts_come_from_training_code_answers_and_shards_answer_them():
    stubs = stub_prompts_module()
    root = pathlib.Path(__file__).resolve().parents[1] / "data" / "smollm2"
    prompts = read_jsonl(root / "stub_prompts.jsonl.gz")
    held_out = read_jsonl(root / "stub_heldout_prompts.jsonl.gz")
    magpie_kinds = [record["kind"] for record in read_jsonl(root / "magpie_prompts.jsonl.gz")]
    assert len(prompts) % 256 == 0 and len({p["turns"][0] for p in prompts}) == len(prompts)
    assert all(p["origin"] % 20 != 19 and magpie_kinds[p["origin"]] == "code" and p["source"] == "stub" for p in prompts)
    assert len(held_out) == 256 and all(p["origin"] % 20 == 19 and magpie_kinds[p["origin"]] == "code" for p in held_out)
    assert not {p["turns"][0] for p in held_out} & {p["turns"][0] for p in prompts}
    dev = read_prompts(["gsm8k", "humaneval", "mt-bench"])
    dev_names = {name for prompt in dev for name in stubs.DEF.findall(prompt)}
    keep = PromptFilter(dev, kept=[])
    for p in prompts + held_out:
        instruction, code = p["turns"][0].split("\n", 1)
        assert instruction in stubs.INSTRUCTIONS and instruction not in "\n".join(dev)
        function = ast.parse(code[len("```python\n"):-len("```")]).body[-1]
        assert ast.get_docstring(function) and function.name not in dev_names
        assert keep.reason(p["turns"][0], complete=True) != "near-dev"
    assert_whole_shards(root / "stubs")
    assert [p.name for p in assert_whole_shards(root / "stubs_heldout")] == ["shard-00000.jsonl.gz"]


def test_committed_writing_prompts_open_with_an_opener_and_shards_answer_them():
    root = pathlib.Path(__file__).resolve().parents[1] / "data" / "smollm2"
    prompts = read_jsonl(root / "writing_prompts.jsonl.gz")
    assert len(prompts) % 256 == 0 and len({p["turns"][0] for p in prompts}) == len(prompts)
    assert all(p["kind"] == "writing" and p["turns"][0].startswith(KIND_OPENERS["writing"]) for p in prompts)
    keep = PromptFilter(read_prompts(["gsm8k", "humaneval", "mt-bench"]), kept=[])
    assert not any(keep.reason(p["turns"][0], complete=True) for p in prompts)  # every filter, near-dev included
    assert_whole_shards(root / "writing")


def test_smollm2_splits_names_the_missing_prompt_file_in_one_line(tmp_path):
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "smollm2_splits.py"
    run = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "runs"), "--train-prompts", str(tmp_path)],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert run.stderr.strip() == (f"smollm2_splits.py: no aime24.jsonl in {tmp_path}; pass --train-prompts DIR, "
                                  "the folder of the training prompts the answers were regenerated from")
    assert not (tmp_path / "runs").exists()


def test_smollm2_splits_continue_mix_holds_every_new_answer_and_the_replay(tmp_path):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for kind, lines in (("aime24", 30), ("arena-hard-v2", 600), ("gsm8k", 1119), ("lbpp", 162), ("livecodebench", 1055)):
        (prompts / f"{kind}.jsonl").write_text('{"turns": ["?"]}\n' * lines)  # only the kinds' order is read
    root = pathlib.Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, str(root / "scripts/smollm2_splits.py"), "--out", str(tmp_path / "runs"),
                    "--train-prompts", str(prompts), "--shards", "94", "--new-from", "92", "--replay", "3000", "--focus", "50"],
                   check=True, capture_output=True)
    mix = [json.loads(line) for line in open(tmp_path / "runs/grown/continue.jsonl")]
    new = [r for r in mix if r.get("source") == "magpie" and r["prompt_index"] >= 92 * 256]
    assert len(new) == len(mix) - 3000 and mix[:len(new)] == new  # the new answers first, then the replay
    assert all(r["prompt_index"] % 20 != 19 for r in mix)
    expected = sum(r["prompt_index"] % 20 != 19 for shard in (92, 93)
                   for r in read_jsonl(root / f"data/smollm2/magpie/shard-{shard:05d}.jsonl.gz"))
    assert len(new) == expected
    keys = {(r.get("source"), r["prompt_index"]) for r in mix}
    assert len(keys) == len(mix)  # no answer twice
    focus = [json.loads(line) for line in open(tmp_path / "runs/focus/train.jsonl")]
    stubs = [r for r in focus if r.get("source") == "stub"]
    assert len(stubs) == 256 * len(list((root / "data/smollm2/stubs").glob("shard-*.jsonl.gz")))
    assert focus[len(focus) - len(stubs):] == stubs  # after the ninth run's file, which stays as it was
    focus = focus[:len(focus) - len(stubs)]
    variants = [r for r in focus if r.get("source") == "gsm8k-variant"]
    assert len(variants) == 256 * len(list((root / "data/smollm2/gsm8k_variants").glob("shard-*.jsonl.gz")))
    assert sum(r.get("source") == "magpie" for r in focus) == 50
    assert len({(r.get("source"), r["prompt_index"]) for r in focus}) == len(focus)
    assert all(r["prompt_index"] % 20 != 19 for r in focus if r.get("source") != "gsm8k-variant")
    grown = [json.loads(line) for line in open(tmp_path / "runs/grown/train.jsonl")]
    assert not any(r.get("source") in ("gsm8k-variant", "stub", "writing") for r in grown)  # --shards: before them
    writing = [json.loads(line) for line in open(tmp_path / "runs/writing/train.jsonl")]
    held_writing = [json.loads(line) for line in open(tmp_path / "runs/final/heldout_writing.jsonl")]
    assert {r["prompt_index"] % 20 == 19 for r in writing} == {False} and {r["source"] for r in writing} == {"writing"}
    assert {r["prompt_index"] % 20 for r in held_writing} == {19}
    assert len(writing) + len(held_writing) == 256 * len(list((root / "data/smollm2/writing").glob("shard-*.jsonl.gz")))
