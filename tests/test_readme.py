"""The README's commands are the ones that work: every `dspark` line parses, the offline quick start runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from dspark_hf.tools.cli import build_parser

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def shell_commands() -> list[str]:
    """Every command line of the bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in code_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                commands += [part.strip() for part in line.split("&&")]
    return commands


def dspark_invocations() -> list[list[str]]:
    invocations = []
    for command in shell_commands():
        words = shlex.split(command)
        if words and Path(words[0]).name == "dspark":
            invocations.append(words[1:])
    return invocations


def test_the_readme_has_dspark_commands_for_every_tool():
    used = {words[0] for words in dspark_invocations()}
    assert {"demo", "generate", "train", "export", "bench", "calibrate"} <= used


@pytest.mark.parametrize("words", dspark_invocations(), ids=lambda words: " ".join(words)[:60])
def test_every_dspark_command_in_the_readme_parses(words):
    build_parser().parse_args(words)  # a stale flag or a missing required one exits here


def test_the_readme_commands_need_nothing_outside_a_clone():
    # prompt sets ship with the package: `--prompts gsm8k`, not a path into another checkout
    assert not [words for words in dspark_invocations() if any(word.startswith("../") for word in words)]


def test_files_the_readme_runs_exist():
    root = Path(__file__).resolve().parents[1]
    for command in shell_commands():
        words = shlex.split(command)
        if words[:1] in (["bash"], ["python"]) and words[1].endswith((".sh", ".py")) and "/" in words[1]:
            if not words[1].startswith(("../", "convert_hf_to_gguf")):
                assert (root / words[1]).is_file(), words[1]


def test_the_offline_quick_start_runs_as_written(capsys):
    quick_start = next(block for block in code_blocks("python") if "load_default" in block)
    exec(compile(quick_start, "README quick start", "exec"), {})
    printed = capsys.readouterr().out
    assert "TraceSummary(" in printed and len(printed.splitlines()[0]) > 0
    torch.set_num_threads(1)  # load_default leaves torch's threads as they were; keep the suite's setting
