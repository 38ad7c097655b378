"""`dspark train` and `dspark regenerate` under `accelerate launch`: two CPU processes (gloo) do what one process
does, and either process count may resume the other's checkpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from conftest import MASK_ID, VOCAB, drafter_config, tiny_target
from dspark_hf.tools.cli import main
from dspark_hf.tools.training import trainer
from dspark_hf.tools.training.data import load_sequences

# The processes sum their gradients in another order than one process accumulates them, so float32 rounding
# differs in the last bits, and Adam's division by sqrt(v) can grow that on tiny gradients. Measured after
# 5 steps: loss terms within 6e-8 (relative), weights within 1.5e-8; the tolerance leaves 100x room. A missing
# gradient sum, a shard that depends on the process count or a rank-dependent seed miss it by orders of magnitude.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
TERMS = ("ce", "l1", "conf", "expected_tau", "heldout_tau")


def launch_two(command: list[str]) -> str:
    """Run `dspark COMMAND` in two CPU processes; its stderr.

    accelerate starts several CPU processes through torchrun when asked for --multi_gpu (its --cpu alone starts
    one, unless MPI is set up); they join over gloo because there is no GPU to use."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launch = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        "-m", "dspark_hf.tools.cli",
    ]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    run = subprocess.run(launch + command, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stderr


def answers(target, count, seed):
    generator = torch.Generator().manual_seed(seed)
    records = []
    for i in range(count):
        prompt = torch.randint(0, MASK_ID, (1, 3 + i % 4), generator=generator)
        out = target.generate(prompt, max_new_tokens=24, do_sample=False)[0].tolist()
        records.append({"prompt_index": i, "prompt_ids": out[: prompt.shape[1]], "response_ids": out[prompt.shape[1]:]})
    return records


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny target with a word-level tokenizer in a directory, its answers, and held-out answers."""
    root = tmp_path_factory.mktemp("distributed")
    target = tiny_target("qwen3", seed=2)
    target.save_pretrained(root / "target")
    words = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, eos_token="w0").save_pretrained(root / "target")
    for name, count, seed in (("train", 12, 0), ("heldout", 4, 1)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in answers(target, count, seed)))
    prompts = [" ".join(f"w{1 + (7 * i + j) % (VOCAB - 2)}" for j in range(1 + i % 5)) for i in range(10)]
    (root / "prompts.jsonl").write_text("".join(json.dumps({"turns": [prompt]}) + "\n" for prompt in prompts))
    return root


def train_args(files, out, steps):
    # Every step stays inside the warmup, whose learning rate does not depend on --max-steps, so a run to step 3
    # resumed to step 5 follows the same schedule as a run straight to step 5.
    return [
        "train", "--target", str(files / "target"), "--data", str(files / "train.jsonl"), "--out", str(out),
        "--eval-data", str(files / "heldout.jsonl"), "--eval-every", "3", "--log-every", "1",
        "--max-steps", str(steps), "--warmup-steps", "10", "--lr", "3e-3", "--batch-size", "4", "--anchors", "8",
        "--block-size", "4", "--target-layer-ids", "0", "2", "--mask-token-id", str(MASK_ID), "--threads", "1",
    ]


def log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_two_processes_train_as_one_and_resume_across_process_counts(files, tmp_path):
    two = tmp_path / "two"
    stderr = launch_two(train_args(files, two, steps=3))
    assert "dspark train: 2 processes, global batch 4" in stderr
    assert stderr.count("dspark train: 2 processes") == 1  # the main process speaks for both

    launch_two(train_args(files, two, steps=4) + ["--resume"])  # two processes continue to step 4
    main(train_args(files, two, steps=5) + ["--resume"])  # one process continues to step 5
    one = tmp_path / "one"
    main(train_args(files, one, steps=5))

    expected, got = log(one), log(two)
    assert [entry["step"] for entry in got] == [1, 2, 3, 4, 5] == [entry["step"] for entry in expected]
    assert "heldout_tau" in got[2] and "heldout_tau" in got[4]
    for want, have in zip(expected, got):
        for name in TERMS:
            if name in want:
                torch.testing.assert_close(have[name], want[name], **TOLERANCE, msg=f"step {want['step']}, {name}")
    weights_one, weights_two = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert weights_one.keys() == weights_two.keys()
    for name, value in weights_one.items():
        torch.testing.assert_close(weights_two[name], value, **TOLERANCE, msg=name)


def test_two_processes_regenerate_what_one_does(files, tmp_path, capsys):
    """Each process answers half of every batch; the main process writes the shards, and one process resumes them."""
    command = ["regenerate", "--target", str(files / "target"), "--prompts", str(files / "prompts.jsonl"),
               "--max-new-tokens", "12", "--dtype", "float32", "--threads", "1", "--shard-size", "4"]
    launch_two(command + ["--out", str(tmp_path / "two"), "--batch-size", "2"])
    main(command + ["--out", str(tmp_path / "one"), "--batch-size", "4"])

    def by_index(name):
        return sorted(load_sequences(tmp_path / name), key=lambda record: record["prompt_index"])

    assert [record["prompt_index"] for record in by_index("two")] == list(range(10))
    assert by_index("two") == by_index("one")
    capsys.readouterr()
    main(command + ["--out", str(tmp_path / "two"), "--batch-size", "4", "--shards", "0", "1"])
    assert json.loads(capsys.readouterr().out)["answers"] == 0


def test_each_process_trains_its_own_share_and_only_the_main_one_writes(tmp_path, monkeypatch):
    """Both processes of a 2-process run, one after the other in this process (the collectives stubbed out): every
    (step, slot) of the global batch is trained exactly once between them, and the second writes nothing at all.

    The two-process run above cannot see a process training every slot: the summed gradient is then doubled,
    and clipping at norm 1 hides that when every step's norm is above 1."""
    target = tiny_target("qwen3", seed=2)
    records = answers(target, 6, seed=0)
    trained = []

    def noted(step, slot, settings, num_sequences):
        trained.append((step, slot))
        return order(step, slot, settings, num_sequences)

    order = trainer.sequence_order
    monkeypatch.setattr(trainer, "sequence_order", noted)
    monkeypatch.setattr(trainer, "sum_gradients", lambda params, state: None)
    monkeypatch.setattr(trainer, "sum_across", lambda values, state: values)
    settings = trainer.TrainSettings(max_steps=3, sequences_per_step=4, anchors_per_sequence=4, log_every=1,
                                     save_every=2, eval_every=2)
    config = drafter_config(target, block_size=4, target_layer_ids=[0, 2])
    for rank in (0, 1):
        state = types.SimpleNamespace(num_processes=2, process_index=rank, is_main_process=rank == 0,
                                      device=torch.device("cpu"))
        monkeypatch.setattr(trainer, "process_state", lambda device=None, state=state: state)
        trainer.train(target, records, tmp_path / f"rank{rank}", config=config, settings=settings, progress=False,
                      eval_sequences=records[:3])
    assert sorted(trained) == [(step, slot) for step in range(3) for slot in range(4)]
    assert (tmp_path / "rank0" / "model.safetensors").is_file() and (tmp_path / "rank0" / "checkpoint").is_dir()
    assert not (tmp_path / "rank1").exists()


def test_a_process_of_several_leaves_after_the_others_without_interpreter_shutdown(monkeypatch, capsys):
    """gloo's threads outlive the process group, and one that wakes during interpreter shutdown aborts the process
    (about 1 in 25 two-process runs). A process of several meets the others, drops the group, flushes what it
    printed and exits at once; a process on its own returns as usual."""
    from dspark_hf.tools.training import processes

    calls = []
    state = types.SimpleNamespace(num_processes=2, wait_for_everyone=lambda: calls.append("barrier"),
                                  destroy_process_group=lambda: calls.append("destroy"))
    monkeypatch.setattr(processes.sys.stdout, "flush", lambda: calls.append("flush stdout"))

    def exit_now(code):
        calls.append(("exit", code))
        raise SystemExit(code)

    monkeypatch.setattr(processes.os, "_exit", exit_now)
    with pytest.raises(SystemExit):
        processes.leave(state)
    assert calls == ["barrier", "destroy", "flush stdout", ("exit", 0)]

    calls.clear()
    processes.leave(types.SimpleNamespace(num_processes=1))
    assert calls == []
