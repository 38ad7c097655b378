"""Training data for drafters: target-regenerated responses and plain texts.

A drafter learns to predict what the *target* model would say, so the best
training responses are the target's own greedy outputs.  ``regenerate``
produces them into a jsonl file, one record per prompt::

    {"prompt_index": 7, "prompt_ids": [...], "response_ids": [...]}

Sampled answers (for breadth: several different answers to one prompt) carry
their sample number and temperature too, ``{"prompt_index": 7, "sample": 1,
"temperature": 0.8, ...}``; one file holds answers of one temperature.
The file is appended batch by batch, so a long run can be killed and resumed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from collections.abc import Sequence

import torch
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from ..errors import InputError
from ..prompts import render_prompt
from ..options import sampling_kwargs
from .processes import process_state

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
def _generate_batch(
    target, prompt_ids: list[list[int]], *, max_new_tokens, stop_ids, pad_id, sampling
) -> list[list[int]]:
    """Continuations of left-padded prompts (greedy, or as `sampling` says), cut after the first stop token."""
    width = max(len(ids) for ids in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        attention_mask[row, width - len(ids):] = 1
    output = target.generate(
        input_ids=input_ids.to(target.device),
        attention_mask=attention_mask.to(target.device),
        max_new_tokens=max_new_tokens,
        eos_token_id=stop_ids,
        pad_token_id=pad_id,
        **sampling,
    )
    responses = []
    for generated in output[:, width:].tolist():
        stop_at = next((pos for pos, token in enumerate(generated) if token in stop_ids), None)
        responses.append(generated if stop_at is None else generated[: stop_at + 1])
    return responses


@dataclasses.dataclass
class Regenerated:
    """What one `regenerate` call did."""

    answers: int  # written by this call
    skipped: int  # prompts over the length limit, not written
    seconds: float

    @property
    def answers_per_hour(self) -> float:
        return self.answers * 3600 / max(self.seconds, 1e-9)


def regenerate(
    target,
    tokenizer,
    prompts: Sequence[str],
    out_path: str | os.PathLike,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 256,
    max_prompt_tokens: int = 512,
    min_prompt_tokens: int = 0,
    temperature: float = 0.0,
    samples_per_prompt: int = 1,
) -> Regenerated:
    """Append the target's answers to every prompt to ``out_path``: greedy, or sampled at `temperature`.

    Resumable: answers already in ``out_path`` are skipped, so the same ``prompts``
    list must be passed again.  Prompts longer than ``max_prompt_tokens`` tokens, or shorter
    than ``min_prompt_tokens`` (to add a length band to an earlier file), are skipped and not
    written.  Under `accelerate launch` each process answers its share of every batch of
    `batch_size` prompts and the main process writes them all.
    """
    if temperature == 0 and samples_per_prompt != 1:
        raise InputError(f"{samples_per_prompt} greedy answers per prompt would all be the same; "
                         "give a temperature above 0 to sample several.")
    state = process_state(target.device)
    out_path = pathlib.Path(out_path)
    records, needs_repair = _read_records(out_path)
    for record in records:
        if record.get("temperature", 0.0) != temperature:
            raise InputError(f"{out_path} holds answers at temperature {record.get('temperature', 0.0):g}, not "
                             f"{temperature:g}; write these to another file.")
    if needs_repair and state.is_main_process:
        _rewrite_records(out_path, records)
    done = {(record["prompt_index"], record.get("sample", 0)) for record in records}
    pending = [(index, sample) for index in range(len(prompts)) for sample in range(samples_per_prompt)
               if (index, sample) not in done]

    stop_ids = _stop_token_ids(target, tokenizer)
    if not stop_ids:
        raise ValueError("Neither the target's generation config nor the tokenizer defines an EOS token")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    sampling = sampling_kwargs(temperature)

    started, written, skipped = time.perf_counter(), 0, 0
    whole_batch = batch_size * state.num_processes
    window_size = whole_batch * SORT_WINDOW_BATCHES
    total = len(prompts) * samples_per_prompt
    with tqdm(total=total, initial=total - len(pending), unit="answer", desc="regenerate",
              disable=not state.is_main_process) as bar:
        for window_start in range(0, len(pending), window_size):
            window = []
            for index, sample in pending[window_start:window_start + window_size]:
                prompt_ids = render_prompt(tokenizer, prompts[index])
                if not min_prompt_tokens <= len(prompt_ids) <= max_prompt_tokens:
                    skipped += 1
                    bar.update(1)
                else:
                    window.append((index, sample, prompt_ids))
            window.sort(key=lambda item: len(item[2]))
            for batch_start in range(0, len(window), whole_batch):
                mine = window[batch_start:batch_start + whole_batch][state.process_index::state.num_processes]
                responses = _generate_batch(
                    target,
                    [prompt_ids for _, _, prompt_ids in mine],
                    max_new_tokens=max_new_tokens,
                    stop_ids=stop_ids,
                    pad_id=pad_id,
                    sampling=sampling,
                ) if mine else []
                answered = [
                    {"prompt_index": index, **({"sample": sample, "temperature": temperature} if temperature else {}),
                     "prompt_ids": prompt_ids, "response_ids": response_ids}
                    for (index, sample, prompt_ids), response_ids in zip(mine, responses)
                ]
                if state.num_processes > 1:
                    answered = gather_object(answered)
                if state.is_main_process:
                    out_path.parent.mkdir(parents=True, exist_ok=True)
                    with out_path.open("a", encoding="utf-8") as out:
                        out.writelines(json.dumps(record) + "\n" for record in answered)
                written += len(answered)
                bar.update(len(answered))
                bar.set_postfix(skipped=skipped)
    state.wait_for_everyone()  # every process reads the finished file next
    return Regenerated(written, skipped, time.perf_counter() - started)
