"""Training data for drafters: target-regenerated responses and plain texts.

A drafter learns to predict what the *target* model would say, so the best
training responses are the target's own greedy outputs.  ``regenerate``
produces them into a jsonl file, one record per prompt::

    {"prompt_index": 7, "prompt_ids": [...], "response_ids": [...]}

The file is appended batch by batch, so a long run can be killed and resumed.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from ..errors import InputError
from ..prompts import render_prompt

RECORD_FIELDS = ("prompt_ids", "response_ids")

# Prompts are length-sorted within windows of this many batches: neighbours in
# a batch then need little padding, while the order of work stays close to the
# (balanced, round-robin) prompt order, so a partial run is still a fair mix.
SORT_WINDOW_BATCHES = 8


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


def load_sequences(path: str | os.PathLike) -> list[dict]:
    """Records of a ``regenerate`` output file, checked; a truncated last line is ignored."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such training-data file.")
    records, _ = _read_records(path)
    for number, record in enumerate(records, start=1):
        for field in RECORD_FIELDS:
            value = record.get(field) if isinstance(record, dict) else None
            if not isinstance(value, list) or not all(isinstance(token, int) for token in value):
                raise InputError(
                    f"{path}, record {number}: field '{field}' is {value!r:.60}; a training record is "
                    '{"prompt_ids": [...], "response_ids": [...]} as `dspark train --prompts` writes it.'
                )
    return records


def _read_records(path: pathlib.Path) -> tuple[list[dict], bool]:
    """Parse a jsonl record file; also say whether its tail needs repair.

    Only the last line may be damaged (a run killed mid-write); it is dropped.
    A tail needs repair when that happened or the file lacks a final newline,
    since appending to it would then corrupt the next record.
    """
    if not path.exists():
        return [], False
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    records = []
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if line_number == len(lines):
                return records, True
            raise InputError(f"{path}, line {line_number}: not JSON ({error.msg}); only the last line may be cut.") from None
    return records, bool(text) and not text.endswith("\n")


def _rewrite_records(path: pathlib.Path, records: list[dict]) -> None:
    staging_path = path.with_name(path.name + ".tmp")
    with staging_path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    os.replace(staging_path, path)


def _stop_token_ids(target, tokenizer) -> list[int]:
    """EOS ids from the target's generation config plus the tokenizer's EOS."""
    configured = target.generation_config.eos_token_id
    if configured is None:
        configured = []
    elif isinstance(configured, int):
        configured = [configured]
    candidates = [*configured, tokenizer.eos_token_id]
    return list(dict.fromkeys(token for token in candidates if token is not None))


@torch.inference_mode()
def _generate_batch(target, prompt_ids: list[list[int]], *, max_new_tokens, stop_ids, pad_id) -> list[list[int]]:
    """Greedy continuations of left-padded prompts, cut after the first stop token."""
    width = max(len(ids) for ids in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        attention_mask[row, width - len(ids):] = 1
    output = target.generate(
        input_ids=input_ids.to(target.device),
        attention_mask=attention_mask.to(target.device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=stop_ids,
        pad_token_id=pad_id,
    )
    responses = []
    for generated in output[:, width:].tolist():
        stop_at = next((pos for pos, token in enumerate(generated) if token in stop_ids), None)
        responses.append(generated if stop_at is None else generated[: stop_at + 1])
    return responses


def regenerate(
    target,
    tokenizer,
    prompts: Sequence[str],
    out_path: str | os.PathLike,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 256,
    max_prompt_tokens: int = 512,
) -> None:
    """Append the target's greedy response to every prompt to ``out_path``.

    Resumable: prompt indices already in ``out_path`` are skipped, so the
    same ``prompts`` list must be passed again.  Prompts longer than
    ``max_prompt_tokens`` tokens are skipped and not written.
    """
    out_path = pathlib.Path(out_path)
    records, needs_repair = _read_records(out_path)
    if needs_repair:
        _rewrite_records(out_path, records)
    done = {record["prompt_index"] for record in records}
    pending = [index for index in range(len(prompts)) if index not in done]

    stop_ids = _stop_token_ids(target, tokenizer)
    if not stop_ids:
        raise ValueError("Neither the target's generation config nor the tokenizer defines an EOS token")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]

    skipped = 0
    window_size = batch_size * SORT_WINDOW_BATCHES
    with tqdm(total=len(prompts), initial=len(prompts) - len(pending), unit="prompt", desc="regenerate") as bar, \
            out_path.open("a", encoding="utf-8") as out:
        for window_start in range(0, len(pending), window_size):
            window = []
            for index in pending[window_start:window_start + window_size]:
                prompt_ids = render_prompt(tokenizer, prompts[index])
                if len(prompt_ids) > max_prompt_tokens:
                    skipped += 1
                    bar.update(1)
                else:
                    window.append((index, prompt_ids))
            window.sort(key=lambda item: len(item[1]))
            for batch_start in range(0, len(window), batch_size):
                batch = window[batch_start:batch_start + batch_size]
                responses = _generate_batch(
                    target,
                    [prompt_ids for _, prompt_ids in batch],
                    max_new_tokens=max_new_tokens,
                    stop_ids=stop_ids,
                    pad_id=pad_id,
                )
                for (index, prompt_ids), response_ids in zip(batch, responses):
                    record = {"prompt_index": index, "prompt_ids": prompt_ids, "response_ids": response_ids}
                    out.write(json.dumps(record) + "\n")
                out.flush()
                bar.update(len(batch))
                bar.set_postfix(skipped=skipped)
