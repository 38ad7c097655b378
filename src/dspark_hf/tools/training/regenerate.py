"""`dspark regenerate`: the target's own answers to prompts, written as compressed shards that accumulate.

A drafter learns what the *target* says, so its training answers are the target's own.
Answers live in a folder of shards, each holding the answers to one fixed range of prompt
indices (`shard-00003.jsonl.gz`: prompts 3*S to 4*S-1 for S prompts per shard), so a later
run adds shards instead of starting over, and `--shards 3` rewrites exactly one. A shard in
progress is a plain `shard-00003.partial.jsonl` appended batch by batch; a killed run resumes
from it, and the last shard stays partial until the prompt file grows to fill its range. `recipe.json` keeps what the answers depend on (target, dtype, temperature, lengths),
and a run with another recipe is refused rather than mixed in.

Decoding is a loop of our own rather than `generate()`: a row leaves the batch (and its KV
cache) as soon as it writes a stop token, where `generate()` keeps decoding finished rows as
padding until the longest answer ends. Prompts are sorted by length within a shard, so rows
of a batch need little left padding. The KV cache is allocated once per batch at its final
length: growing it by concatenation copied the whole cache every step, a third of a step's time
for 64 rows at 300 positions (SmolLM2, one CPU thread).
"""

from __future__ import annotations

import dataclasses
import gzip
import inspect
import json
import os
import pathlib
import time
from collections.abc import Callable, Sequence

import torch
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import DynamicCache, TemperatureLogitsWarper, TopPLogitsWarper
from transformers.cache_utils import DynamicLayer

from ...core.sampling import draw
from ..errors import InputError, non_negative_float, positive_int
from ..prompts import read_prompts, render_prompt
from .data import read_jsonl
from .processes import leave, process_state

RECIPE_FIELDS = ("target", "dtype", "temperature", "top_p", "samples_per_prompt", "max_new_tokens",
                 "min_prompt_tokens", "max_prompt_tokens", "shard_size")


# ------------------------------------------------------------------ decoding
def token_chooser(temperature: float, top_p: float = 1.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """Next tokens from [rows, vocab] logits: the argmax at temperature 0, else a draw after temperature and top-p."""
    if temperature == 0:
        return lambda logits: logits.argmax(dim=-1)
    warpers = [TemperatureLogitsWarper(temperature), *([TopPLogitsWarper(top_p)] if top_p < 1 else [])]

    def choose(logits: torch.Tensor) -> torch.Tensor:
        scores = logits.float()
        for warper in warpers:
            scores = warper(None, scores)
        return draw(scores.softmax(dim=-1))

    return choose


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` that writes into buffers of a fixed capacity instead of concatenating each step."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        (rows, key_heads, _, key_width), (_, value_heads, _, value_width) = key_states.shape, value_states.shape
        self.device = key_states.device
        self.key_buffer = key_states.new_empty(rows, key_heads, self.capacity, key_width)
        self.value_buffer = value_states.new_empty(rows, value_heads, self.capacity, value_width)
        self.keys, self.values = self.key_buffer[:, :, :0], self.value_buffer[:, :, :0]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"the preallocated cache holds {self.capacity} positions; this step needs {end}")
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the `indices` rows, moved to the front of the same buffers."""
        if not self.is_initialized:
            return
        length, rows = self.keys.shape[-2], len(indices)
        self.key_buffer[:rows, :, :length] = self.keys[indices]
        self.value_buffer[:rows, :, :length] = self.values[indices]
        self.key_buffer, self.value_buffer = self.key_buffer[:rows], self.value_buffer[:rows]
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]


def preallocated_cache(config, capacity: int) -> DynamicCache:
    """A `DynamicCache` whose full-attention layers hold `capacity` positions from the start."""
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@torch.inference_mode()
def decode(
    target, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, stop_ids: Sequence[int], pad_id: int,
    choose: Callable[[torch.Tensor], torch.Tensor],
) -> list[list[int]]:
    """Answers to left-padded prompts, each ending at its first stop token; finished rows leave the batch."""
    device = target.device
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(list(ids))
        attention_mask[row, width - len(ids):] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    positions = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    # transformers renamed `past_key_values` to `cache` (5.2x); older releases know only the first
    cache = {("cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"):
             preallocated_cache(target.config, width + max_new_tokens)}
    logits = target(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1, **cache).logits[:, -1]
    next_position = positions[:, -1] + 1
    stops = set(stop_ids)
    answers: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))  # the original row of each row still decoding
    for step in range(max_new_tokens):
        tokens = choose(logits)
        keep = []
        for slot, (row, token) in enumerate(zip(live, tokens.tolist())):
            answers[row].append(token)
            if token not in stops:
                keep.append(slot)
        if not keep or step == max_new_tokens - 1:
            break
        if len(keep) < len(live):
            kept = torch.tensor(keep, device=device)
            next(iter(cache.values())).batch_select_indices(kept)
            tokens, attention_mask, next_position = tokens[kept], attention_mask[kept], next_position[kept]
            live = [live[slot] for slot in keep]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(live), 1)], dim=1)
        logits = target(input_ids=tokens[:, None], attention_mask=attention_mask, position_ids=next_position[:, None],
                        use_cache=True, **cache).logits[:, -1]
        next_position = next_position + 1
    return answers


def stop_token_ids(target, tokenizer) -> list[int]:
    """EOS ids from the target's generation config plus the tokenizer's EOS."""
    configured = target.generation_config.eos_token_id
    configured = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    candidates = [*configured, tokenizer.eos_token_id]
    found = list(dict.fromkeys(token for token in candidates if token is not None))
    if not found:
        raise InputError("neither the target's generation config nor its tokenizer names an EOS token.")
    return found


# ------------------------------------------------------------------ shards
def shard_path(folder: pathlib.Path, shard: int, partial: bool = False) -> pathlib.Path:
    return folder / (f"shard-{shard:05d}.partial.jsonl" if partial else f"shard-{shard:05d}.jsonl.gz")


def check_recipe(folder: pathlib.Path, recipe: dict) -> None:
    """Write `recipe.json`, or refuse a run whose recipe differs from the one the folder's answers came from."""
    path = folder / "recipe.json"
    if path.exists():
        stored = json.loads(path.read_text())
        changed = [f"{key}: {stored.get(key)!r} there, {recipe.get(key)!r} now" for key in RECIPE_FIELDS
                   if stored.get(key) != recipe.get(key)]
        if changed:
            raise InputError(f"{folder} holds answers made another way ({'; '.join(changed)}); "
                             "write these to another --out folder.")
        return
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recipe, indent=1) + "\n")


@dataclasses.dataclass
class Regenerated:
    """What one `regenerate` call did."""

    answers: int  # written by this call
    skipped: int  # prompts outside the length band, not written
    seconds: float

    @property
    def answers_per_hour(self) -> float:
        return self.answers * 3600 / max(self.seconds, 1e-9)


def regenerate(
    target,
    tokenizer,
    prompts: Sequence[str],
    out: str | os.PathLike,
    *,
    recipe: dict | None = None,
    batch_size: int = 32,
    shard_size: int = 256,
    shards: Sequence[int] | None = None,
    max_new_tokens: int = 256,
    max_prompt_tokens: int = 512,
    min_prompt_tokens: int = 0,
    temperature: float = 0.0,
    top_p: float = 1.0,
    samples_per_prompt: int = 1,
) -> Regenerated:
    """Answer every prompt (or those of `shards`) into the shard folder `out`; finished shards are skipped.

    Under `accelerate launch` each process answers its share of every batch and the main process writes.
    """
    if temperature == 0 and samples_per_prompt != 1:
        raise InputError(f"{samples_per_prompt} greedy answers per prompt would all be the same; "
                         "give a temperature above 0 to sample several.")
    folder = pathlib.Path(out)
    state = process_state(target.device)
    settings = dict(temperature=temperature, top_p=top_p, samples_per_prompt=samples_per_prompt,
                    max_new_tokens=max_new_tokens, min_prompt_tokens=min_prompt_tokens,
                    max_prompt_tokens=max_prompt_tokens, shard_size=shard_size)
    if state.is_main_process:
        check_recipe(folder, {**(recipe or {}), **settings})
    state.wait_for_everyone()
    stop_ids = stop_token_ids(target, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    choose = token_chooser(temperature, top_p)
    every_shard = range((len(prompts) + shard_size - 1) // shard_size)
    todo = [shard for shard in (every_shard if shards is None else shards) if not shard_path(folder, shard).exists()]
    started, written, skipped = time.perf_counter(), 0, 0
    whole_batch = batch_size * state.num_processes

    def shard_prompts(shard: int) -> range:  # the last shard may hold fewer prompts than shard_size
        return range(shard * shard_size, min(len(prompts), (shard + 1) * shard_size))

    total = sum(len(shard_prompts(shard)) for shard in todo) * samples_per_prompt
    with tqdm(total=total, unit="answer", desc="regenerate", disable=not state.is_main_process) as bar:
        for shard in todo:
            partial = shard_path(folder, shard, partial=True)
            records = read_jsonl(partial) if partial.exists() else []
            done = {(record["prompt_index"], record.get("sample", 0)) for record in records}
            pending = []
            for index in shard_prompts(shard):
                prompt_ids = render_prompt(tokenizer, prompts[index])
                if not min_prompt_tokens <= len(prompt_ids) <= max_prompt_tokens:
                    skipped += samples_per_prompt
                    continue
                pending += [(index, sample, prompt_ids) for sample in range(samples_per_prompt)
                            if (index, sample) not in done]
            bar.update(len(shard_prompts(shard)) * samples_per_prompt - len(pending))
            pending.sort(key=lambda item: len(item[2]))
            if state.is_main_process:  # rewrite the partial file whole: its last line may have been cut
                partial.write_text("".join(json.dumps(record) + "\n" for record in records))
            for start in range(0, len(pending), whole_batch):
                mine = pending[start:start + whole_batch][state.process_index::state.num_processes]
                answers = decode(target, [ids for _, _, ids in mine], max_new_tokens=max_new_tokens,
                                 stop_ids=stop_ids, pad_id=pad_id, choose=choose) if mine else []
                answered = [
                    {"prompt_index": index, **({"sample": sample} if samples_per_prompt > 1 else {}),
                     "prompt_ids": prompt_ids, "response_ids": response}
                    for (index, sample, prompt_ids), response in zip(mine, answers)
                ]
                if state.num_processes > 1:
                    answered = gather_object(answered)
                if state.is_main_process:
                    with partial.open("a", encoding="utf-8") as sink:
                        sink.writelines(json.dumps(record) + "\n" for record in answered)
                written += len(answered)
                bar.update(len(answered))
            if state.is_main_process and (shard + 1) * shard_size <= len(prompts):  # a short tail waits for prompts
                finished = sorted(read_jsonl(partial), key=lambda r: (r["prompt_index"], r.get("sample", 0)))
                staging = shard_path(folder, shard).with_suffix(".tmp")
                text = "".join(json.dumps(record, separators=(",", ":")) + "\n" for record in finished)
                # no name or time in the gzip header, so the documented command rewrites a shard byte for byte
                with staging.open("wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as sink:
                    sink.write(text.encode("utf-8"))
                os.replace(staging, shard_path(folder, shard))
                partial.unlink()
            state.wait_for_everyone()
    return Regenerated(written, skipped, time.perf_counter() - started)


# ------------------------------------------------------------------ the command
def add_arguments(parser) -> None:
    from ..options import add_model_arguments

    add_model_arguments(parser, drafter=False)
    parser.add_argument("--prompts", nargs="+", required=True,
                        help='jsonl files of {"turns": [...]} (read round-robin), or shipped set names')
    parser.add_argument("--out", required=True,
                        help="folder of answer shards; a rerun continues it and adds the shards still missing")
    parser.add_argument("--shards", type=int, nargs="+", default=None,
                        help="only these shards (shard k holds prompts k*S to (k+1)*S-1); unset: all")
    parser.add_argument("--shard-size", type=positive_int, default=256, help="prompts per shard (S)")
    parser.add_argument("--max-prompts", type=positive_int, default=None, help="only the first N prompts (round-robin)")
    parser.add_argument("--max-prompt-tokens", type=positive_int, default=512, help="skip longer prompts")
    parser.add_argument("--min-prompt-tokens", type=int, default=0,
                        help="skip shorter prompts (answers for a band of lengths an earlier run skipped)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256, help="most tokens per answer")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="prompts decoded at once, per process")
    parser.add_argument("--temperature", type=non_negative_float, default=0.0,
                        help="0: the greedy answer; above 0: sampled answers, for breadth (write them to their own folder)")
    parser.add_argument("--top-p", type=non_negative_float, default=1.0, help="nucleus of sampled answers")
    parser.add_argument("--samples-per-prompt", type=positive_int, default=1, help="sampled answers per prompt")
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampling")
    parser.set_defaults(func=run)


def run(args) -> None:
    from ..options import load_target_from_args

    prompts = read_prompts(args.prompts, limit=args.max_prompts)
    state = process_state(args.device)
    if args.device is None and args.device_map is None:
        args.device = str(state.device)  # the GPU when there is one; under accelerate launch, this process's own
    target, tokenizer = load_target_from_args(args)
    torch.manual_seed(args.seed)
    done = regenerate(
        target, tokenizer, prompts, args.out,
        recipe={"target": args.target, "dtype": str(target.dtype).removeprefix("torch."),
                "prompts": [str(path) for path in args.prompts]},
        batch_size=args.batch_size, shard_size=args.shard_size, shards=args.shards,
        max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
        min_prompt_tokens=args.min_prompt_tokens, temperature=args.temperature, top_p=args.top_p,
        samples_per_prompt=args.samples_per_prompt,
    )
    if state.is_main_process:
        print(json.dumps({"out": str(args.out), "answers": done.answers, "skipped": done.skipped,
                          "hours": round(done.seconds / 3600, 3), "answers_per_hour": round(done.answers_per_hour)}))
    leave(state)
