"""The README's commands are the ones that work, run as a new user runs them after the set-up: every command is
one this test knows how to run, every `dspark` line parses and answers --help, and the commands that need no
network run at a toy size in the environment `source .venv/bin/activate` gives."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from dspark_hf.tools.cli import build_parser
from dspark_hf.tools.targets import ensure_smollm2, shipped_drafter_path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The README's programs, and how this test runs them; any other program is a README change this test must learn.
PROGRAMS = {"bash", "source", "dspark", ".venv/bin/dspark", ".venv/bin/python", "python"}


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


def command_words() -> list[list[str]]:
    """Each command as its words, leading environment assignments (`OMP_NUM_THREADS=1 ...`) dropped."""
    commands = []
    for command in shell_commands():
        words = shlex.split(command)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        commands.append(words)
    return commands


def dspark_invocations() -> list[list[str]]:
    return [words[1:] for words in command_words() if Path(words[0]).name == "dspark"]


def in_the_environment(command: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`command` in a shell that has run the README's `source .venv/bin/activate`, from the checkout."""
    if not (ROOT / ".venv" / "bin" / "activate").is_file():
        pytest.skip("no .venv in the checkout: run bash scripts/setup.sh first, as the README says")
    return subprocess.run(["bash", "-c", f"source .venv/bin/activate && {command}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def with_option(words: list[str], option: str, value: str) -> list[str]:
    """`words` with `option`'s value replaced by `value` (added when absent): the README's command at a toy size."""
    if option not in words:
        return [*words, option, value]
    at = words.index(option) + 1
    return [*words[:at], value, *words[at + 1 :]]


def test_the_readme_runs_only_programs_this_test_knows():
    assert {words[0] for words in command_words()} <= PROGRAMS


def test_ci_runs_the_readme_test_command_verbatim_then_the_studies():
    test_command = next(block.strip() for block in code_blocks("bash") if "pytest" in block)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    studies = ".venv/bin/python -m pytest -q -m slow"
    assert ci.index(studies) > ci.index(test_command) and f"`{studies}`" in README


def test_the_readme_fits_in_250_lines():
    assert len(README.splitlines()) <= 250


def test_the_readme_has_dspark_commands_for_every_tool():
    used = {words[0] for words in dspark_invocations()}
    assert {"demo", "generate", "train", "export", "bench", "calibrate"} <= used


@pytest.mark.parametrize("words", dspark_invocations(), ids=lambda words: " ".join(words)[:60])
def test_every_dspark_command_in_the_readme_parses_and_answers_help(words, capsys):
    build_parser().parse_args(words)  # a stale flag or a missing required one exits here
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([words[0], "--help"])
    assert exit_.value.code == 0 and "usage: dspark " in capsys.readouterr().out


def test_after_activating_dspark_is_on_the_path_and_the_scripts_parse():
    result = in_the_environment("command -v dspark python && dspark --help")
    assert result.returncode == 0, result.stderr
    dspark, python = result.stdout.splitlines()[:2]
    assert Path(dspark) == ROOT / ".venv" / "bin" / "dspark" and Path(python).parent == ROOT / ".venv" / "bin"
    for words in command_words():
        if words[0] == "bash":
            assert subprocess.run(["bash", "-n", ROOT / words[1]]).returncode == 0, words


def test_the_readme_generate_command_runs_at_a_toy_size():
    words = next(words for words in command_words() if words[:2] == ["dspark", "generate"])
    result = in_the_environment(shlex.join(with_option(words, "--max-new-tokens", "4")))
    assert result.returncode == 0, result.stderr
    assert "[dspark] 4 tokens in" in result.stderr


def test_the_readme_example_script_runs_at_a_toy_size_and_names_a_missing_folder():
    words = next(words for words in command_words() if words[:2] == ["python", "examples/qwen3_quickstart.py"])
    local = with_option(with_option(words, "--target", str(ensure_smollm2())), "--drafter", str(shipped_drafter_path()))
    result = in_the_environment(shlex.join(with_option(local, "--max-new-tokens", "8")))
    assert result.returncode == 0, result.stderr
    assert "speed-up" in result.stdout and re.search(r"identical to plain generate|differs from plain", result.stdout)
    missing = in_the_environment(shlex.join(with_option(words, "--target", "/nonexistent")))
    assert missing.returncode == 1 and missing.stderr.strip() == "/nonexistent: no such directory (--target)."


def test_the_readme_commands_need_nothing_outside_a_clone():
    # prompt sets ship with the package: `--prompts gsm8k`, not a path into another checkout
    assert not [words for words in dspark_invocations() if any(word.startswith("../") for word in words)]


def test_files_the_readme_runs_exist():
    for words in command_words():
        if words[0] in ("bash", "python", "source") and words[1].endswith((".sh", ".py", "activate")):
            assert (ROOT / words[1]).is_file(), words[1]


def test_the_offline_quick_start_runs_as_written_and_answers_right(capsys):
    quick_start = next(block for block in code_blocks("python") if "load_default" in block)
    exec(compile(quick_start, "README quick start", "exec"), {})  # load_default takes OMP_NUM_THREADS (conftest)
    printed = capsys.readouterr().out
    assert "TraceSummary(" in printed
    answer = printed.split("TraceSummary(")[0]
    assert "def reverse_string(" in answer and "[::-1]" in answer, answer  # the showcase is a right answer
