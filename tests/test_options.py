"""The tool plumbing shared by every command: options, dtype, threads, loading, the timed call, errors, Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dspark_hf.tools.bench as bench_command
import dspark_hf.tools.targets as targets
from conftest import tiny_target, write_bigram_deepspec
from dspark_hf.tools.cli import build_parser, main
from dspark_hf.tools.errors import InputError
from dspark_hf.tools.options import (
    add_model_arguments,
    apply_threads,
    load_pair_from_args,
    load_target_from_args,
    timed_generate,
)
from dspark_hf.tools.prompts import prompt_file, read_prompts, shipped_prompt_sets
from dspark_hf.core.machine import busy_cores
from dspark_hf.tools.targets import default_threads, resolve_dtype

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["generate", "train", "regenerate", "synthesize", "export", "bench", "calibrate", "demo"]


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.fixture
def one_thread_after():
    yield
    torch.set_num_threads(1)  # the suite's setting (conftest)


# ------------------------------------------------------------------ options and help
def test_every_command_offers_threads_and_the_loading_commands_a_dtype():
    commands = subparsers()
    for name in COMMANDS:
        options = {o for a in commands[name]._actions for o in a.option_strings}
        assert "--threads" in options, name
        if name in ("generate", "regenerate", "bench", "calibrate", "demo"):
            assert {"--dtype", "--device", "--device-map", "--local-files-only"} <= options, name


@pytest.mark.parametrize("name", ["generate", "regenerate", "export", "bench", "calibrate", "demo"])
def test_every_option_is_described_and_shows_its_default_once(name):
    command = subparsers()[name]
    for action in command._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{name} {action.option_strings[0]} has no help text"
    text = command.format_help()
    assert "(default: None)" not in text and "(default: False)" not in text
    for line in text.split("\n  -")[1:]:  # one option per chunk
        assert line.count("(default:") <= 1, line
    assert "default: the drafter" not in text  # what an unset option means is said once, in words


def test_dtype_and_device_options_parse():
    args = build_parser().parse_args(["generate", "--dtype", "bfloat16", "--device-map", "auto", "--threads", "3"])
    assert (args.dtype, args.device_map, args.device, args.threads) == ("bfloat16", "auto", None, 3)
    assert build_parser().parse_args(["bench", "--prompts", "gsm8k"]).dtype == "auto"
    with pytest.raises(SystemExit):  # one place for the target
        build_parser().parse_args(["generate", "--device", "cpu", "--device-map", "auto"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--temperature", "-1"])


@pytest.mark.parametrize("words, line", [
    (["generate", "--max-new-tokens", "0"], "dspark generate: error: --max-new-tokens must be a positive integer, got 0"),
    (["generate", "--prompt", " "], "dspark generate: error: --prompt must not be empty: give the message to answer"),
    (["generate", "--temperature", "hot"], "dspark generate: error: --temperature must be a number >= 0, got hot"),
    (["bench", "--prompts", "gsm8k", "--seed", "x"], "dspark bench: error: --seed must be an integer, got 'x'"),
    (["generate", "--dtype", "fp8"], "dspark generate: error: --dtype must be one of 'auto', 'float32', 'bfloat16', "
                                     "'float16'; got 'fp8'"),
    (["gen"], "dspark: error: command must be one of 'generate', 'train', 'regenerate', 'synthesize', 'export', "
              "'bench', 'calibrate', 'demo'; got 'gen'"),
])
def test_a_bad_command_line_is_one_plain_line(words, line, capsys):
    with pytest.raises(SystemExit) as exited:
        main(words)
    assert exited.value.code == 2
    assert capsys.readouterr().err == line + "\n"  # no usage block, no argparse internals


def test_a_missing_prompt_file_is_one_line_naming_the_fix_before_the_target_loads(monkeypatch):
    monkeypatch.setattr("dspark_hf.tools.options.load_target_from_args", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(SystemExit) as exited:
        main(["synthesize", "--out", "new.jsonl", "--count", "8", "--exclude", "gone/prompts.jsonl"])
    assert str(exited.value) == ("dspark synthesize: error: gone/prompts.jsonl: no such prompt file; check the path, "
                                 "or name a shipped set (gsm8k, humaneval, mt-bench).")


def test_help_answers_before_torch_loads():
    """`dspark --help` imports neither torch nor transformers: each command's module loads when it runs."""
    check = ("import sys\nfrom dspark_hf.tools.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))")
    finished = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert finished.stdout.splitlines()[-1] == "[]", finished.stderr
    assert "generate" in finished.stdout and "calibrate" in finished.stdout


# ------------------------------------------------------------------ dtype
def test_resolve_dtype(monkeypatch):
    assert resolve_dtype("float32") == torch.float32 and resolve_dtype("float16", "cuda") == torch.float16
    assert resolve_dtype(torch.bfloat16) == torch.bfloat16
    monkeypatch.setattr(targets, "cpu_has_native_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    monkeypatch.setattr(targets, "cpu_has_native_bf16", lambda: False)
    assert resolve_dtype("auto", "cpu") == torch.float32  # emulated bf16 is slower than float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve_dtype("auto", "cuda:1") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert resolve_dtype("auto", "cuda") == torch.float32
    assert resolve_dtype("auto", "mps") == torch.float32


def test_compute_device_follows_device_then_device_map():
    assert targets.compute_device() == "cpu"
    assert targets.compute_device("cuda:1", None) == "cuda:1"
    assert targets.compute_device(None, "cuda:0") == "cuda:0"
    assert targets.compute_device(None, "auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_auto_dtype_on_this_machine_is_bf16_exactly_where_bf16_is_native():
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert resolve_dtype("auto", "cpu") == (torch.bfloat16 if native else torch.float32)


# ------------------------------------------------------------------ threads
def test_default_threads_respects_omp_and_leaves_busy_cores_alone():
    assert default_threads({"OMP_NUM_THREADS": "3"}, cores=8, load=7.0, torch_default=8)[0] == 3
    # the machine: 2 cores, another process busy on one of them -> one thread
    threads, why = default_threads({}, cores=2, load=1.1, torch_default=2)
    assert threads == 1 and "load 1.1" in why
    assert default_threads({}, cores=2, load=5.0, torch_default=2)[0] == 1  # never fewer than one
    assert default_threads({}, cores=16, load=0.2, torch_default=8)[0] == 8  # an idle machine: torch's own choice
    assert default_threads({}, cores=16, load=10.4, torch_default=8)[0] == 6
    assert default_threads({"OMP_NUM_THREADS": ""}, cores=4, load=0.0, torch_default=4)[0] == 4


def test_apply_threads(monkeypatch, one_thread_after):
    assert apply_threads(argparse.Namespace(threads=2)) == "set by --threads"
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert apply_threads(argparse.Namespace(threads=None)).startswith("OMP_NUM_THREADS")
    assert torch.get_num_threads() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")  # no choice made: the cores busy right now decide
    monkeypatch.setattr("dspark_hf.tools.targets.busy_cores", lambda: 1.2)
    monkeypatch.setattr("dspark_hf.tools.targets.os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert "load 1.2" in apply_threads(argparse.Namespace(threads=None)) and torch.get_num_threads() == 1


# ------------------------------------------------------------------ loading and the timed call
def test_load_target_from_args_places_the_target_and_says_so(tmp_path, capsys, one_thread_after):
    tiny_target("llama").save_pretrained(tmp_path / "t")
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args(["--target", str(tmp_path / "t"), "--dtype", "bfloat16", "--device", "cpu",
                              "--threads", "1"])
    target, tokenizer = load_target_from_args(args, tokenizer=False)
    assert target.dtype == torch.bfloat16 and tokenizer is None and not target.training
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == "dspark: target in bfloat16 (--dtype bfloat16) on cpu, 1 torch thread (set by --threads)"
    args = parser.parse_args(["--target", str(tmp_path / "t"), "--dtype", "float32", "--device-map", "cpu",
                              "--threads", "1"])
    assert load_target_from_args(args, tokenizer=False)[0].dtype == torch.float32


def test_timed_generate_returns_the_new_tokens_of_generate():
    target = tiny_target("qwen3")
    prompt = [3, 1, 4, 1, 5]
    tokens, seconds = timed_generate(target, prompt, max_new_tokens=6, do_sample=False)
    expected = target.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt):]
    assert tokens == expected.tolist() and len(tokens) == 6 and seconds > 0


# ------------------------------------------------------------------ errors and Ctrl-C
def test_the_offline_hub_error_names_the_flag_on_the_command_line(tmp_path, capsys, one_thread_after):
    tiny_target("llama").save_pretrained(tmp_path / "t")
    with pytest.raises(SystemExit) as exited:
        main(["export", "acme/not-cached", str(tmp_path / "out"), "--target", str(tmp_path / "t"),
              "--local-files-only", "--threads", "1"])
    message = str(exited.value.code)
    assert message.startswith("dspark export: error: Could not fetch draft checkpoint 'acme/not-cached'")
    assert message.endswith("pass --local-files-only.") and "local_files_only=True" not in message


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_command, "run", interrupted)
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--prompts", "gsm8k"])
    assert exited.value.code == 130
    assert capsys.readouterr().err == "dspark bench: interrupted\n"
    with pytest.raises(KeyboardInterrupt):  # --debug keeps the traceback
        main(["--debug", "bench", "--prompts", "gsm8k"])


# ------------------------------------------------------------------ shipped prompt sets and drafters
def test_shipped_prompt_sets_are_named_by_a_bare_name(tmp_path, monkeypatch):
    assert list(shipped_prompt_sets()) == ["gsm8k", "humaneval", "mt-bench"]
    assert prompt_file("gsm8k") == shipped_prompt_sets()["gsm8k"]
    assert len(read_prompts(["gsm8k", "mt-bench"], limit=4)) == 4
    assert len(read_prompts(["humaneval"])) == 164
    own = tmp_path / "mine.jsonl"
    own.write_text(json.dumps({"turns": ["hello"]}) + "\n")
    assert read_prompts([str(own)]) == ["hello"]  # a path still works
    monkeypatch.chdir(tmp_path)
    assert read_prompts(["mine.jsonl"]) == ["hello"]
    (tmp_path / "gsm8k").write_text(json.dumps({"turns": ["a file of that name wins"]}) + "\n")
    assert read_prompts(["gsm8k"]) == ["a file of that name wins"]
    with pytest.raises(InputError, match=r"^'gsm8' is not a shipped prompt set \(gsm8k, humaneval, mt-bench\)"):
        read_prompts(["gsm8"])


def test_the_package_carries_only_the_dspark_drafter_and_the_prompts():
    assets = targets.shipped_drafter_path().parent
    assert sorted(path.name for path in assets.iterdir()) == ["prompts", "smollm2_dspark"]
    assert sum(path.stat().st_size for path in assets.rglob("*")) < 40e6
    dflash = targets.dflash_drafter_path()  # the ablation, in this checkout
    assert dflash is not None and dflash.parts[-2:] == ("drafters", "smollm2_dflash")
    assert (dflash / "model.safetensors").is_file()


def test_dflash_outside_a_checkout_asks_for_a_directory():
    with pytest.raises(InputError, match=r"method 'dflash' has no drafter here: pass dflash=DIR"):
        bench_command.check_drafters(["plain", "dflash"], {"dspark": "x", "dflash": None})
    bench_command.check_drafters(["plain", "dflash=/some/dir"], {"dspark": "x", "dflash": None})
    with pytest.raises(InputError, match="pass --drafter DIR"):
        bench_command.check_drafters(["plain", "dspark@0.5"], {"dspark": None, "dflash": None})


def test_bench_reads_shipped_sets_by_name():
    sets = bench_command.read_prompt_sets(["gsm8k", "mt-bench"], limit=2)
    assert list(sets) == ["gsm8k", "mt-bench"] and all(len(prompts) == 2 for prompts in sets.values())


def test_load_pair_from_args_puts_the_drafter_in_the_fast_dtype(tmp_path, capsys, one_thread_after):
    target = tiny_target("qwen3")
    target.save_pretrained(tmp_path / "t")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # any tokenizer will do: only loading is tested
        shutil.copy(targets.ensure_smollm2() / name, tmp_path / "t" / name)
    drafter_dir = write_bigram_deepspec(target, tmp_path / "d")
    args = build_parser().parse_args(["generate", "--target", str(tmp_path / "t"), "--drafter", str(drafter_dir),
                                      "--dtype", "float32", "--threads", "1"])
    with pytest.raises(InputError, match="--drafter is needed with --target"):
        load_pair_from_args(argparse.Namespace(**{**vars(args), "drafter": None}))
    target, tokenizer, drafter = load_pair_from_args(args)
    assert target.dtype == torch.float32 and tokenizer is not None
    assert drafter.dtype == targets.fast_drafter_dtype(target)  # bf16 on CPUs with native bf16 matmuls
    assert drafter.target is target
    expected = "dspark generate: target in float32 (--dtype float32)"
    if drafter.dtype != target.dtype:
        expected += f", drafter in {str(drafter.dtype).removeprefix('torch.')}"
    assert capsys.readouterr().err.strip().splitlines()[-1] == expected + " on cpu, 1 torch thread (set by --threads)"


@pytest.mark.parametrize("offline", [True, False])
def test_the_qwen3_example_fails_fast_and_in_one_line_without_the_hub(tmp_path, offline):
    environment = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1" if offline else ""}
    environment["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there: the Hub is unreachable
    started = time.perf_counter()
    finished = subprocess.run([sys.executable, str(ROOT / "examples" / "qwen3_quickstart.py")], env=environment,
                              capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - started < 30  # not a minute of retries
    assert finished.returncode == 1 and finished.stdout == ""
    lines = finished.stderr.strip().splitlines()
    assert len(lines) == 1 and "HF_HUB_OFFLINE" in lines[0] and "--target DIR --drafter DIR" in lines[0], lines
    assert ("is unreachable" in lines[0]) != offline


def test_busy_cores_sees_a_busy_process_now_and_nothing_on_a_quiet_machine():
    quiet = busy_cores(0.3)
    room = min(1.0, (os.cpu_count() or 1) - quiet)  # a machine busy already has less core left to fill
    if room < 0.5:  # every core already busy (a session's background job): one more process cannot show
        pytest.skip(f"{quiet:.1f} of {os.cpu_count()} cores are busy already; nothing left to fill")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        loaded = busy_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert loaded - quiet > 0.6 * room  # one spinning process is about one more busy core, seen at once


def test_generate_compile_warms_up_untimed_with_exactly_the_timed_calls_fields(monkeypatch, capsys):
    """--compile: one untimed call with the same fields compiles the lengths the timed call verifies."""
    import dspark_hf.core.costs as costs
    import dspark_hf.tools.options as options

    target = tiny_target("qwen3")
    calls = []

    class Drafter:
        last_trace = []

    monkeypatch.setattr(options, "load_pair_from_args", lambda args: (target, None, Drafter()))
    monkeypatch.setattr(costs, "profile_costs", lambda drafter: None)
    monkeypatch.setattr("dspark_hf.tools.prompts.render_prompt", lambda tokenizer, prompt: [1, 2, 3])
    monkeypatch.setattr("transformers.TextStreamer", lambda *a, **k: "streamer")
    monkeypatch.setattr(options, "timed_generate", lambda t, ids, **kw: calls.append(kw) or ([5, 6], 0.5))
    main(["generate", "--compile", "--max-new-tokens", "4"])
    warm_up, timed = calls
    assert "streamer" not in warm_up and timed.pop("streamer") == "streamer"
    assert warm_up.keys() == timed.keys() and warm_up["compile_config"] is timed["compile_config"]
    assert timed["cache_implementation"] == "static" and timed["max_new_tokens"] == 4
    assert "compiled in 0.5 s; not counted" in capsys.readouterr().err
    calls.clear()
    main(["generate", "--max-new-tokens", "4"])
    assert len(calls) == 1 and "compile_config" not in calls[0]
