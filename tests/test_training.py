"""A short real training run must raise tau in generate(), round-trip, resume exactly, and train DFlash too."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from conftest import MASK_ID, VOCAB, drafter_config, tiny_target
from dspark_hf import DSparkDrafter, summarize
from dspark_hf.tools.cli import main
from dspark_hf.tools.training import trainer as trainer_module
from dspark_hf.tools.training.trainer import (
    FeatureStore,
    TrainSettings,
    answer_vocabulary,
    expected_accepted_length,
    greedy_tau,
    sample_anchors,
    sequence_ids,
    sequence_loss,
    train,
)


def regenerated(target, count=40, new_tokens=40, seed=0):
    generator = torch.Generator().manual_seed(seed)
    records = []
    for i in range(count):
        prompt = torch.randint(0, MASK_ID, (1, 3 + i % 5), generator=generator)
        out = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False)[0].tolist()
        records.append({"prompt_ids": out[: prompt.shape[1]], "response_ids": out[prompt.shape[1] :]})
    return records


def measured_tau(target, drafter, seed=99):
    taus = []
    generator = torch.Generator().manual_seed(seed)
    for i in range(6):
        prompt = torch.randint(0, MASK_ID, (1, 4 + i), generator=generator)
        expected = target.generate(prompt, max_new_tokens=40, do_sample=False)
        produced = target.generate(prompt, max_new_tokens=40, do_sample=False, assistant_model=drafter)
        assert produced.tolist() == expected.tolist()
        taus.append(summarize(drafter.last_trace).tau)
    return sum(taus) / len(taus)


SETTINGS = dict(sequences_per_step=4, anchors_per_sequence=8, learning_rate=3e-3, warmup_steps=5, log_every=5)


@pytest.mark.parametrize("arch, loss_vocab", [
    ("dspark", "full"),
    pytest.param("dflash", "full", marks=pytest.mark.slow),
    pytest.param("dspark", "responses", marks=pytest.mark.slow),
])
def test_training_raises_tau_in_real_generate(arch, loss_vocab, tmp_path):
    target = tiny_target("qwen3", seed=2)
    data = regenerated(target)
    fields = dict(block_size=4, target_layer_ids=[0, 2])
    if arch == "dflash":
        fields.update(markov_rank=0, enable_confidence_head=False)
    config = drafter_config(target, **fields)
    train(target, data, tmp_path / "before", config=config, settings=TrainSettings(max_steps=0, **SETTINGS),
          progress=False)
    before = DSparkDrafter.from_pretrained(tmp_path / "before", target)
    tau_before = measured_tau(target, before)
    settings = TrainSettings(max_steps=150, loss_vocab=loss_vocab, **SETTINGS)
    train(target, data, tmp_path / "after", config=config, settings=settings, progress=False)
    after = DSparkDrafter.from_pretrained(tmp_path / "after", target)  # the written checkpoint round-trips
    tau_after = measured_tau(target, after)
    print(f"{arch}: tau {tau_before:.2f} -> {tau_after:.2f}")
    assert tau_after > tau_before + 0.5
    log = [json.loads(line) for line in (tmp_path / "after" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 150 and log[-1]["ce"] < log[0]["ce"]
    assert ("conf" in log[-1]) == (arch == "dspark")
    if arch == "dspark":  # the L1 term is what drives the 1 - TV survival that expected tau measures
        assert log[-1]["expected_tau"] > log[0]["expected_tau"]


def successor_target(seed=0):
    """A target whose greedy next token depends on the current token only, through a cycle over every token but
    MASK: its answers never repeat within 23 tokens, so a drafter one position off guesses none of its blocks."""
    target = tiny_target("qwen3", seed=seed)
    cycle = torch.randperm(MASK_ID, generator=torch.Generator().manual_seed(seed))
    successor = torch.empty(MASK_ID, dtype=torch.long)
    successor[cycle] = cycle.roll(-1)
    hidden = target.config.hidden_size
    embeddings = torch.linalg.qr(torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(seed)))[0][:VOCAB]
    head = torch.zeros(VOCAB, hidden)
    head[successor] = 10 * embeddings[:MASK_ID]  # the row of succ(t) points along t's embedding
    with torch.no_grad():
        for layer in target.model.layers:  # every layer adds nothing: the last hidden state is the token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        target.get_input_embeddings().weight.copy_(3 * embeddings)
        target.get_output_embeddings().weight.copy_(head)
    return target, successor


@pytest.mark.parametrize("arch", ["dspark", "dflash"])
def test_training_on_a_learnable_sequence_fills_whole_blocks(arch, tmp_path):
    """Labels one position off still raise tau on the random target above (its answers repeat short cycles);
    here only the right labels get most blocks accepted. Mean tau measured with the labels, the Markov inputs or
    the L1 targets shifted by one: 1.6-3.0; with the right ones: 3.9-4.0."""
    target, successor = successor_target()
    data = regenerated(target, count=16, new_tokens=30)
    for record in data:
        ids = record["prompt_ids"][-1:] + record["response_ids"]
        assert all(successor[a] == b for a, b in zip(ids, ids[1:]))
    fields = dict(block_size=4, target_layer_ids=[0, 2])
    if arch == "dflash":
        fields.update(markov_rank=0, enable_confidence_head=False)
    settings = TrainSettings(max_steps=80, **SETTINGS)
    drafter = train(target, data, tmp_path, config=drafter_config(target, **fields), settings=settings,
                    progress=False)  # ready for generate() as it is returned
    generator, taus = torch.Generator().manual_seed(1), []
    for length in range(3, 7):
        prompt = torch.randint(0, MASK_ID, (1, length), generator=generator)
        target.generate(prompt, max_new_tokens=30, do_sample=False, assistant_model=drafter,
                        assistant_confidence_threshold=0.0, dspark_ngram=False)  # whole blocks, no n-gram help
        taus.append(summarize(drafter.last_trace).tau)
    print(f"{arch}: tau {taus}")
    assert sum(taus) / len(taus) > 3.3  # of at most 5 (4 drafts and the target's token)


def test_interrupted_training_resumes_without_losing_steps(tmp_path, monkeypatch):
    target = tiny_target("qwen3", seed=4)
    data = regenerated(target, count=12, new_tokens=24)
    config = drafter_config(target, block_size=3, markov_head_type="rnn")
    settings = TrainSettings(max_steps=12, save_every=100, **SETTINGS)
    straight = train(target, data, tmp_path / "straight", config=config, settings=settings, progress=False)

    real_loss = trainer_module.sequence_loss
    calls = {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 7 * settings.sequences_per_step + 2:  # in the middle of step 8
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "sequence_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(target, data, tmp_path / "resumed", config=config, settings=settings, progress=False)
    state = torch.load(tmp_path / "resumed" / "checkpoint" / "trainer_state.pt")
    assert state["step"] == 7  # every finished step was kept
    monkeypatch.setattr(trainer_module, "sequence_loss", real_loss)
    resumed = train(target, data, tmp_path / "resumed", settings=settings, resume=True, progress=False)
    for key, value in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value, rtol=1e-5, atol=1e-6)


def test_expected_accepted_length_counts_a_draft_only_after_every_earlier_one():
    survival = torch.tensor([0.5, 0.5, 1.0])
    assert expected_accepted_length(survival).item() == pytest.approx(1 + 0.5 + 0.25 + 0.25)
    mask = torch.tensor([1.0, 1.0, 0.0])
    assert expected_accepted_length(survival, mask).item() == pytest.approx(1.75)


def test_answer_vocabulary_ranks_answer_tokens_by_frequency():
    records = [{"prompt_ids": [1, 2], "response_ids": [7, 3, 7]}, {"prompt_ids": [9], "response_ids": [5]}]
    assert answer_vocabulary(records, VOCAB).tolist() == [3, 5, 7]  # prompt-only tokens (1, 2, 9) stay out
    assert answer_vocabulary(records, VOCAB, limit=2).tolist() == [3, 7]  # 7 twice; 3 beats 5 on the id
    assert answer_vocabulary(records, VOCAB, limit=5).tolist() == [0, 1, 3, 5, 7]  # filled with the lowest ids


def one_sequence(settings):
    """(fresh drafter, ids, target features, anchors) of one regenerated answer: what a loss test scores."""
    target = tiny_target("qwen3", seed=3)
    config = drafter_config(target, block_size=4, target_layer_ids=[0, 2])
    torch.manual_seed(0)
    drafter = DSparkDrafter(config, target)
    record = regenerated(target, count=1, new_tokens=30)[0]
    ids = sequence_ids(record, settings)
    anchors = sample_anchors(len(record["prompt_ids"]), len(ids), 8, torch.Generator().manual_seed(0))
    return drafter, ids, FeatureStore(target, config.target_layer_ids).get(ids), anchors


def test_shortlist_loss_equals_full_loss_when_it_covers_the_vocabulary():
    """Scoring through a shuffled shortlist of every token must give the full-vocabulary loss:
    logits, Markov bias, target probabilities and labels are all re-indexed the same way."""
    settings = TrainSettings()
    drafter, ids, features, anchors = one_sequence(settings)
    token_ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))
    full_loss, full_terms = sequence_loss(drafter, ids, features, anchors, settings)
    short_loss, short_terms = sequence_loss(drafter, ids, features, anchors, settings, token_ids)
    torch.testing.assert_close(short_loss, full_loss)
    for name, value in full_terms.items():
        torch.testing.assert_close(short_terms[name], value)


@pytest.mark.parametrize("flags, ce_weight, l1_weight", [([], 0.1, 0.9), (["--ce-weight", "1", "--l1-weight", "0.5"], 1.0, 0.5)])
def test_the_loss_weights_given_on_the_command_line_weigh_the_terms(flags, ce_weight, l1_weight):
    """`dspark train --ce-weight/--l1-weight` reach the loss; unset, they are the paper's 0.1 and 0.9."""
    parser = argparse.ArgumentParser()
    trainer_module.add_arguments(parser)
    settings = trainer_module.train_settings(parser.parse_args(["--target", "t", "--out", "o", "--data", "d", *flags]))
    drafter, ids, features, anchors = one_sequence(settings)
    loss, terms = sequence_loss(drafter, ids, features, anchors, settings)
    torch.testing.assert_close(loss, ce_weight * terms["ce"] + l1_weight * terms["l1"] + terms["conf"])


def test_confidence_only_training_from_a_trained_drafter_moves_only_that_head(tmp_path):
    target = tiny_target("qwen3", seed=5)
    data = regenerated(target, count=12, new_tokens=24)
    config = drafter_config(target, block_size=4, target_layer_ids=[0, 2])
    trained = train(target, data, tmp_path / "base", config=config, settings=TrainSettings(max_steps=20, **SETTINGS),
                    progress=False)
    held_out = regenerated(target, count=12, new_tokens=24, seed=1)
    settings = TrainSettings(max_steps=20, trainable="confidence", **SETTINGS)
    tuned = train(target, held_out, tmp_path / "conf", settings=settings, init_from=tmp_path / "base", progress=False)
    before, after = trained.state_dict(), tuned.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        if key.startswith("confidence_head."):
            assert not torch.equal(after[key], value), key
        else:
            torch.testing.assert_close(after[key], value, rtol=0, atol=0)

    def confidence_loss(drafter):
        store, total = FeatureStore(target, config.target_layer_ids), 0.0
        for i, record in enumerate(held_out):
            ids = sequence_ids(record, settings)
            anchors = sample_anchors(len(record["prompt_ids"]), len(ids), 8, torch.Generator().manual_seed(i))
            with torch.no_grad():
                total += sequence_loss(drafter, ids, store.get(ids), anchors, settings)[1]["conf"].item()
        return total / len(held_out)

    assert confidence_loss(tuned) < confidence_loss(trained)


def test_confidence_only_training_needs_a_confidence_head(tmp_path):
    target = tiny_target("qwen3", seed=5)
    config = drafter_config(target, block_size=4, target_layer_ids=[0, 2], enable_confidence_head=False)
    with pytest.raises(ValueError, match="confidence head"):
        train(target, regenerated(target, count=2, new_tokens=8), tmp_path, config=config,
              settings=TrainSettings(max_steps=1, trainable="confidence"), progress=False)


def test_feature_cache_never_mixes_up_sequences(tmp_path):
    """One cache directory shared by two datasets: every lookup returns its own sequence's features."""
    target = tiny_target("qwen3", seed=6)
    first, second = regenerated(target, count=2, new_tokens=10)
    cached = FeatureStore(target, [0, 2], tmp_path)
    fresh = FeatureStore(target, [0, 2])
    for record in (first, second, first, second):  # the second pass reads from disk
        ids = sequence_ids(record, TrainSettings())
        got_layers, got_final = cached.get(ids)
        want_layers, want_final = fresh.get(ids)
        for got, want in zip([got_final, *got_layers], [want_final, *want_layers]):
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)  # stored in bf16
    assert len(list(tmp_path.glob("*.pt"))) == 2


@pytest.mark.parametrize("pruned", [False, True])
def test_greedy_tau_replays_generate_exactly(pruned, tmp_path):
    """The held-out tau the trainer logs is the tau generate() gets on the same answers, round for round."""
    target = tiny_target("qwen3", seed=2)
    data = regenerated(target, count=40)
    fields = dict(block_size=4, target_layer_ids=[0, 2], draft_vocab_size=18 if pruned else None)
    config = drafter_config(target, **fields)
    train(target, data, tmp_path / "d", config=config, settings=TrainSettings(max_steps=60, **SETTINGS),
          progress=False)
    drafter = DSparkDrafter.from_pretrained(tmp_path / "d", target)
    assert drafter.config.pruned == pruned
    held_out = regenerated(target, count=6, seed=7)
    rounds = []
    for record in held_out:
        prompt = torch.tensor([record["prompt_ids"]])
        target.generate(prompt, max_new_tokens=len(record["response_ids"]), do_sample=False,
                        assistant_model=drafter, assistant_confidence_threshold=0.0)
        rounds += drafter.last_trace
    replayed = greedy_tau(drafter, held_out, FeatureStore(target, config.target_layer_ids), max_tokens=768)
    assert summarize(rounds).tau > 1.3  # a drafter that gets accepted, so the replay is tested on real rounds
    assert replayed == pytest.approx(summarize(rounds).tau, abs=1e-9)


def test_a_full_vocabulary_drafter_prunes_to_the_answer_tokens_it_drafts_the_same_on(tmp_path):
    """--init-from with --draft-vocab: W2 rows and LM-head rows are cut to the most frequent answer tokens."""
    target = tiny_target("qwen3", seed=2)
    data = regenerated(target, count=20)
    config = drafter_config(target, block_size=4, target_layer_ids=[0, 2])
    train(target, data, tmp_path / "full", config=config, settings=TrainSettings(max_steps=30, **SETTINGS),
          progress=False)
    full = DSparkDrafter.from_pretrained(tmp_path / "full", target)
    vocabulary = answer_vocabulary(data, VOCAB, 20)
    small = trainer_module.pruned(full, vocabulary)
    assert small.config.draft_vocab_size == 20 and small.draft_token_ids().tolist() == vocabulary.tolist()
    hidden = torch.randn(3, 32)
    torch.testing.assert_close(small.draft_logits(hidden), full.draft_logits(hidden)[:, vocabulary])
    bias_small = small.markov_head(hidden, torch.tensor([1, 2, 3]))[0]
    bias_full = full.markov_head(hidden, torch.tensor([1, 2, 3]))[0]
    torch.testing.assert_close(bias_small, bias_full[:, vocabulary])
    # zero training steps from it: the saved drafter is exactly the pruned copy
    pruned_config = drafter_config(target, block_size=4, target_layer_ids=[0, 2], draft_vocab_size=20)
    train(target, data, tmp_path / "pruned", config=pruned_config, init_from=tmp_path / "full",
          settings=TrainSettings(max_steps=0, **SETTINGS), progress=False)
    reloaded = DSparkDrafter.from_pretrained(tmp_path / "pruned", target)
    assert reloaded.draft_token_ids().tolist() == vocabulary.tolist()
    torch.testing.assert_close(reloaded.markov_head.markov_w2.weight, small.markov_head.markov_w2.weight)

    # new data, new frequent tokens: known tokens keep their W2 rows, new ones start with no Markov bias
    unseen = sorted(set(range(VOCAB)) - set(vocabulary.tolist()) - {MASK_ID})[:5]
    assert len(unseen) >= 3
    moved = torch.tensor(sorted(vocabulary[::2].tolist() + unseen))
    again = trainer_module.pruned(small, moved)
    assert again.draft_token_ids().tolist() == moved.tolist()
    bias_again = again.markov_head(hidden, torch.tensor([1, 2, 3]))[0]
    expected = torch.where(torch.isin(moved, vocabulary), bias_full[:, moved], torch.zeros(()))
    torch.testing.assert_close(bias_again, expected)
    torch.testing.assert_close(again.draft_logits(hidden), full.draft_logits(hidden)[:, moved])
    # --init-from a pruned drafter with --draft-vocab: the new answers choose the vocabulary
    new_data = data + [dict(r, response_ids=[unseen[i % len(unseen)] for i in range(len(r["response_ids"]))]) for r in data]
    train(target, new_data, tmp_path / "moved", config=pruned_config, init_from=tmp_path / "pruned",
          settings=TrainSettings(max_steps=0, **SETTINGS), progress=False)
    chosen = DSparkDrafter.from_pretrained(tmp_path / "moved", target).draft_token_ids()
    assert set(unseen) <= set(chosen.tolist())
    assert chosen.tolist() == answer_vocabulary(new_data, VOCAB, 20).tolist()


def test_a_failed_run_leaves_no_output_directory(tmp_path, monkeypatch):
    """A bad data file is refused before any model loads; a run that fails before writing anything makes no --out."""
    bad = tmp_path / "answers.jsonl"
    bad.write_text(json.dumps({"prompt_ids": [1, 2], "response_ids": "3 4"}) + "\n")
    with pytest.raises(SystemExit, match=r"answers.jsonl, record 1: field 'response_ids'"):
        main(["train", "--target", str(tmp_path / "never-loaded"), "--data", str(bad), "--out", str(tmp_path / "cli")])
    assert not (tmp_path / "cli").exists()
    def failing(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(trainer_module, "sequence_loss", failing)
    target = tiny_target("qwen3", seed=4)
    with pytest.raises(RuntimeError, match="out of memory"):
        train(target, regenerated(target, count=2, new_tokens=8), tmp_path / "api", config=drafter_config(target),
              settings=TrainSettings(max_steps=3, **SETTINGS), progress=False)
    assert not (tmp_path / "api").exists()


def test_bf16_autocast_is_an_option_on_cpu(tmp_path):
    """'auto' keeps a CPU run in fp32; 'bf16' runs the drafter's passes in bf16."""
    target = tiny_target("qwen3", seed=4)
    data = regenerated(target, count=4, new_tokens=16)
    config = drafter_config(target, block_size=4, target_layer_ids=[0, 2])
    logs = {}
    for autocast in ("auto", "off", "bf16"):
        settings = TrainSettings(max_steps=2, autocast=autocast, **{**SETTINGS, "log_every": 1})
        drafter = train(target, data, tmp_path / autocast, config=config, settings=settings, device="cpu",
                        progress=False)
        assert drafter.dtype == torch.float32
        lines = (tmp_path / autocast / "train_log.jsonl").read_text().splitlines()
        logs[autocast] = [{k: v for k, v in json.loads(line).items() if k != "elapsed"} for line in lines]
    assert logs["auto"] == logs["off"]
    for fp32, bf16 in zip(logs["off"], logs["bf16"]):
        assert fp32["ce"] != bf16["ce"]
        assert bf16["ce"] == pytest.approx(fp32["ce"], rel=0.05)


def test_a_fresh_run_copies_the_targets_deepest_layers_unless_told_random(tmp_path):
    target = tiny_target("qwen3", seed=5)
    data = regenerated(target, count=2, new_tokens=8)
    config = drafter_config(target, num_hidden_layers=1, target_layer_ids=[0, 2])
    deepest = target.get_decoder().layers[-1].mlp.down_proj.weight
    for init in ("target", "random"):
        drafter = train(target, data, tmp_path / init, config=config, progress=False,
                        settings=TrainSettings(max_steps=0, init=init, **SETTINGS))
        copied = torch.equal(drafter.layers[0].mlp.down_proj.weight, deepest)
        assert copied == (init == "target")
    with pytest.raises(ValueError, match="'target' or 'random'"):
        TrainSettings(init="zeros")


def test_a_prompt_that_fills_the_window_is_left_out_not_a_crash(tmp_path):
    """Long-prompt answers cut at max_tokens keep no answer token to anchor on: skipped up front, and every
    step still trains on full batches of the sequences that fit."""
    assert sample_anchors(700, 600, 8, torch.Generator().manual_seed(0)) is None
    assert sample_anchors(599, 600, 8, torch.Generator().manual_seed(0)) is None
    assert sample_anchors(598, 600, 8, torch.Generator().manual_seed(0)).tolist() == [598]
    target = tiny_target("qwen3", seed=4)
    fits = regenerated(target, count=4, new_tokens=16)
    too_long = [{"prompt_ids": [1] * 40, "response_ids": [2] * 10}]
    settings = TrainSettings(max_steps=1, max_tokens=41, **SETTINGS)
    config = drafter_config(target, block_size=4, target_layer_ids=[0, 2])
    trained = []
    original = trainer_module.sequence_loss
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_module, "sequence_loss", lambda d, ids, *a, **k: trained.append(ids) or original(d, ids, *a, **k))
        train(target, too_long * 8 + fits, tmp_path / "out", config=config, settings=settings, progress=False)
    assert len(trained) == 4 and all(len(ids) <= 41 for ids in trained)
    with pytest.raises(ValueError, match="max_tokens=41"):
        train(target, too_long, tmp_path / "none", config=config, settings=settings, progress=False)
