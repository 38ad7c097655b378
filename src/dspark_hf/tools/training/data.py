"""Training data for drafters: the target's own answers (see `regenerate`) and plain texts.

A record is one prompt and its answer, as token ids::

    {"prompt_index": 7, "prompt_ids": [...], "response_ids": [...]}

Records live in .jsonl files, gzip-compressed .jsonl.gz shards, or folders of shards as
`dspark regenerate` writes them.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Sequence

from ..errors import InputError
from ..prompts import open_text

RECORD_FIELDS = ("prompt_ids", "response_ids")


def tokenize_texts(tokenizer, texts: Sequence[str], chunk_tokens: int = 512) -> list[dict]:
    """Records for plain texts the target only reads: each chunk of `chunk_tokens` tokens is a response.

    The target still labels every position with its own distribution, so this is distillation
    without generation: far cheaper per token than regenerated answers, though not the target's
    own continuations.
    """
    records = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids), chunk_tokens):
            chunk = ids[start : start + chunk_tokens]
            if len(chunk) >= 2:
                records.append({"prompt_index": len(records), "prompt_ids": [], "response_ids": chunk})
    return records


def record_files(path: pathlib.Path) -> list[pathlib.Path]:
    """The record files at `path`: the file itself, or a shard folder's finished and partial shards."""
    if path.is_dir():
        return sorted([*path.glob("*.jsonl.gz"), *path.glob("*.jsonl")])
    if path.is_file():
        return [path]
    raise InputError(f"{path}: no such training-data file or folder.")


def read_jsonl(path: pathlib.Path) -> list[dict]:
    """Records of a .jsonl or .jsonl.gz file; a cut last line (a run killed mid-write) is dropped."""
    with open_text(path) as lines:
        text = lines.read().splitlines()
    records = []
    for number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number < len(text):
                raise InputError(f"{path}, line {number}: not JSON ({error.msg}); only the last line may be cut.") from None
    return records


def load_sequences(path: str | os.PathLike) -> list[dict]:
    """Records of a training-data file or shard folder, checked."""
    records = []
    for file in record_files(pathlib.Path(path)):
        for number, record in enumerate(read_jsonl(file), start=1):
            for field in RECORD_FIELDS:
                value = record.get(field) if isinstance(record, dict) else None
                if not isinstance(value, list) or not all(isinstance(token, int) for token in value):
                    raise InputError(
                        f"{file}, record {number}: field '{field}' is {value!r:.60}; a training record is "
                        '{"prompt_ids": [...], "response_ids": [...]} as `dspark regenerate` writes it.'
                    )
            records.append(record)
    return records
