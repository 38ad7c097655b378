"""Prompt files and chat rendering, shared by every tool.

A prompt file is JSONL, one `{"turns": [...]}` record per line; the first turn is the
user message. Files are interleaved round-robin, so any prefix is a balanced mix. A bare
name such as `gsm8k` names a dev set shipped with the package.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import pathlib
from collections.abc import Iterable
from importlib import resources

from .errors import InputError

RECORD_HINT = 'each line must be a JSON object like {"turns": ["the user message"]}'


def shipped_prompt_sets() -> dict[str, pathlib.Path]:
    """The dev prompt sets in the package, by name: gsm8k (math), humaneval (Python), mt-bench (chat)."""
    folder = pathlib.Path(str(resources.files("dspark_hf") / "assets" / "prompts"))
    return {path.stem: path for path in sorted(folder.glob("*.jsonl"))}


def prompt_file(name_or_path: str | os.PathLike) -> pathlib.Path:
    """A path as is; a bare name (no directory, no .jsonl, no such file here) is a shipped set."""
    text = str(name_or_path)
    if os.sep in text or "/" in text or text.endswith(".jsonl") or os.path.isfile(text):
        return pathlib.Path(text)
    sets = shipped_prompt_sets()
    if text not in sets:
        raise InputError(f"{text!r} is not a shipped prompt set ({', '.join(sets)}) nor a .jsonl file.")
    return sets[text]


def read_prompts(paths: Iterable[str | os.PathLike], limit: int | None = None) -> list[str]:
    """First turns of the ``{"turns": [...]}`` lines of several jsonl files (or shipped set names).

    The files are interleaved round-robin, so every prefix of the result (and
    hence ``limit``) is a balanced mix of the sources.
    """
    per_file = [_read_first_turns(prompt_file(path)) for path in paths]
    interleaved = [
        prompt
        for round_of_prompts in itertools.zip_longest(*per_file)
        for prompt in round_of_prompts
        if prompt is not None
    ]
    return interleaved if limit is None else interleaved[:limit]


def open_text(path: pathlib.Path, mode: str = "r"):
    """A text file, gzip-compressed when its name ends in .gz (how large prompt and answer files are kept)."""
    return gzip.open(path, mode + "t", encoding="utf-8") if path.suffix == ".gz" else path.open(mode, encoding="utf-8")


def _read_first_turns(path: pathlib.Path) -> list[str]:
    if not path.is_file():
        raise InputError(f"{path}: no such prompt file; check the path, or name a shipped set "
                         f"({', '.join(shipped_prompt_sets())}).")
    first_turns = []
    with open_text(path) as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"{where}: not JSON ({error.msg}); {RECORD_HINT}.") from None
            if not isinstance(record, dict) or "turns" not in record:
                raise InputError(f"{where}: field 'turns' is missing; {RECORD_HINT}.")
            turns = record["turns"]
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise InputError(f"{where}: field 'turns' is {turns!r:.60}; {RECORD_HINT}.")
            first_turns.append(turns[0])
    return first_turns


def render_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of ``prompt`` as a user turn, ready for the assistant's reply.

    ``enable_thinking=False`` selects Qwen3's non-thinking mode; other
    templates ignore it.  Without a chat template the text is tokenized as is.
    """
    if tokenizer.chat_template is None:
        return tokenizer(prompt)["input_ids"]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]
