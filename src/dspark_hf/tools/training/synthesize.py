"""`dspark synthesize`: user prompts the target writes itself, for training data without downloads.

Magpie-style self-synthesis: the target is given its chat template up to the user header and
nothing after it, and samples what a user would ask. A system prompt per kind (math, code,
chat, writing) steers the mix, so each kind keeps a real share; a writing request also gets its
first words. A small model writes many unusable
prompts, so each is filtered: length, English, no refusals or self-talk, no loops, no
duplicates, and nothing close to a dev prompt (shared word trigrams), since dev prompts must
never be trained on. The file is appended batch by batch, so a run resumes, and it stops at
exactly `--count` prompts, so the answer shards over it (`dspark regenerate`) stay full.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import os
import pathlib
import re
import time

import torch
from tqdm.auto import tqdm

from ..errors import InputError, non_negative_float, positive_int
from ..prompts import read_prompts, shipped_prompt_sets
from .data import read_jsonl
from .regenerate import decode, stop_token_ids, token_chooser

# What the system turn says for each kind; None keeps the template's own default system turn.
KIND_SYSTEM_PROMPTS = {
    "math": "You are a patient math tutor. Users bring you arithmetic and algebra word problems to solve step by step.",
    "code": "You are an expert Python programmer. Users ask you to write, explain or fix Python functions.",
    "chat": None,
    "writing": "You are a skilled writer. Users ask you to compose emails, blog posts, stories, descriptive "
               "paragraphs, letters, speeches and headlines, or to edit and rewrite their text.",
}
# Words the user's message starts with, one drawn per batch: what the target then writes is a request in
# the imperative form users give a writer ("Compose a ..."), where from the header alone it asks for advice instead.
KIND_OPENERS = {"writing": ("Write a", "Compose a", "Draft a", "Describe a", "Craft a", "Write a short", "Create a")}
DEFAULT_KINDS = ("math", "code", "chat")
SENTINEL = "\x00USER\x00"
REFUSAL = re.compile(r"\b(i'?m sorry|i cannot|i can'?t|as an ai|language model|smollm|hugging ?face|"
                     r"assistant|how can i help|i am an ai)\b", re.IGNORECASE)
COMMON_WORDS = {"the", "a", "is", "of", "to", "and", "in", "what", "how", "can", "you", "i", "for", "write", "if"}


def user_header(tokenizer, kind: str, opener: str = "") -> list[int]:
    """Token ids of the chat template up to where the user's message would start, and `opener` after it."""
    system = KIND_SYSTEM_PROMPTS[kind]
    turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": SENTINEL}]
    text = tokenizer.apply_chat_template(turns, tokenize=False)
    if SENTINEL not in text:
        raise InputError("the target's chat template drops the user message; it cannot write its own prompts.")
    return tokenizer(text[: text.index(SENTINEL)] + opener, add_special_tokens=False)["input_ids"]


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def trigrams(text: str) -> set[tuple[str, ...]]:
    tokens = words(text)
    return {tuple(tokens[i:i + 3]) for i in range(len(tokens) - 2)}


class PromptFilter:
    """Says why a written prompt is unusable ('' when it is kept); remembers what it kept, for duplicates."""

    def __init__(self, dev_prompts: list[str], kept: list[str], max_dev_overlap: float = 0.3):
        self.dev_index: dict[tuple[str, ...], set[int]] = collections.defaultdict(set)
        self.dev_sizes = []
        for number, prompt in enumerate(dev_prompts):
            grams = trigrams(prompt)
            self.dev_sizes.append(len(grams))
            for gram in grams:
                self.dev_index[gram].add(number)
        self.max_dev_overlap = max_dev_overlap
        self.seen = {" ".join(words(prompt)) for prompt in kept}

    def reason(self, text: str, complete: bool) -> str:
        tokens = words(text)
        letters = [ch for ch in text if ch.isalpha()]
        if not complete:
            return "unfinished"
        if not 24 <= len(text) <= 1500 or len(tokens) < 5:
            return "length"
        if sum(ch.isascii() for ch in letters) < 0.95 * len(letters) or not COMMON_WORDS & set(tokens):
            return "language"
        if REFUSAL.search(text):
            return "refusal"
        grams = [tuple(tokens[i:i + 3]) for i in range(len(tokens) - 2)]
        if grams and len(set(grams)) < 0.6 * len(grams):
            return "loop"
        key = " ".join(tokens)
        if key in self.seen:
            return "duplicate"
        shared = collections.Counter(number for gram in set(grams) for number in self.dev_index.get(gram, ()))
        if any(count / max(1, min(len(set(grams)), self.dev_sizes[number])) > self.max_dev_overlap
               for number, count in shared.items()):
            return "near-dev"
        self.seen.add(key)
        return ""


def append_lines(path: pathlib.Path, lines: list[str]) -> None:
    """Add one batch's lines. A .gz file gains one gzip member, written beside it and moved into place, so a
    killed run never leaves a cut stream; a plain file is appended to."""
    if path.suffix != ".gz":
        with path.open("a", encoding="utf-8") as sink:
            sink.writelines(lines)
        return
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as raw:
        raw.write(path.read_bytes() if path.exists() else b"")
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as member:
            member.write("".join(lines).encode("utf-8"))
    os.replace(temporary, path)


def batch_seed(seed: int, start: int, batch: int) -> int:
    """The seed of a run's `batch`-th batch when the file held `start` prompts. A run resumed at the same count draws
    the same prompts again; any other run draws its own (counting samples instead would replay the batches the run
    before drew past the file's end, since dropped prompts move that count on)."""
    return int.from_bytes(hashlib.sha256(f"{seed} {start} {batch}".encode()).digest()[:8], "little")


def synthesize(target, tokenizer, out, *, count: int, kinds=DEFAULT_KINDS, batch_size: int = 64,
               temperature: float = 1.0, top_p: float = 0.95, max_prompt_tokens: int = 192, seed: int = 0,
               exclude: tuple[str, ...] = ()) -> dict:
    """Append prompts to `out` until it holds `count`; returns the run's report (kept by kind, dropped by reason).

    `exclude`: prompts written elsewhere (answered, or held out there); they count as duplicates here."""
    out = pathlib.Path(out)
    existing = read_jsonl(out) if out.exists() else []
    dev = [prompt for path in shipped_prompt_sets().values() for prompt in read_prompts([path])]
    keep = PromptFilter(dev, [record["turns"][0] for record in existing] + list(exclude))
    openers = {kind: KIND_OPENERS.get(kind, ("",)) for kind in kinds}
    stop_ids = stop_token_ids(target, tokenizer)
    choose = token_chooser(temperature, top_p)
    kept = collections.Counter(record.get("kind") for record in existing)
    dropped: collections.Counter = collections.Counter()
    started, written, batches = time.perf_counter(), 0, 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with tqdm(total=count, initial=min(count, len(existing)), unit="prompt", desc="synthesize") as bar:
        while len(existing) + written < count:
            kind = min(kinds, key=lambda k: kept[k])  # the scarcest kind goes next
            draw = batch_seed(seed, len(existing), batches)
            opener = openers[kind][draw % len(openers[kind])]
            torch.manual_seed(draw)
            batches += 1
            header = user_header(tokenizer, kind, opener)
            texts = decode(target, [header] * batch_size, max_new_tokens=max_prompt_tokens,
                           stop_ids=stop_ids, pad_id=stop_ids[0], choose=choose)
            lines = []
            for ids in texts:
                complete = bool(ids) and ids[-1] in stop_ids
                text = (opener + tokenizer.decode(ids, skip_special_tokens=True)).strip()
                why = keep.reason(text, complete)
                if why:
                    dropped[why] += 1
                elif len(existing) + written < count:
                    lines.append(json.dumps({"turns": [text], "kind": kind, "source": "magpie"}) + "\n")
                    kept[kind] += 1
                    written += 1
                    bar.update(1)
            append_lines(out, lines)
    return {"out": str(out), "prompts": len(existing) + written, "written": written, "excluded": len(exclude),
            "by_kind": dict(kept), "dropped": dict(dropped), "hours": round((time.perf_counter() - started) / 3600, 3)}


def add_arguments(parser) -> None:
    from ..options import add_model_arguments

    add_model_arguments(parser, drafter=False)
    parser.add_argument("--out", required=True, help='jsonl of {"turns": [...], "kind": ...}; a rerun continues it')
    parser.add_argument("--count", type=positive_int, required=True, help="prompts the file holds when done")
    parser.add_argument("--kinds", nargs="+", choices=list(KIND_SYSTEM_PROMPTS), default=list(DEFAULT_KINDS),
                        help="kinds of prompt, kept in equal shares (writing: requests to compose a text, opened "
                             "with one of a few imperative words)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="prompts sampled at once")
    parser.add_argument("--temperature", type=non_negative_float, default=1.0, help="sampling temperature")
    parser.add_argument("--top-p", type=non_negative_float, default=0.95, help="sampling nucleus")
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampling")
    parser.add_argument("--exclude", nargs="+", default=[], metavar="PROMPTS",
                        help="prompt files (jsonl, .gz too) whose prompts are not written again: ones another "
                             "machine answered, or holds out")
    parser.set_defaults(func=run)


def run(args) -> None:
    from ..options import load_target_from_args

    if args.temperature == 0:
        raise InputError("--temperature 0 would write one prompt over and over; give a temperature above 0.")
    exclude = tuple(read_prompts(args.exclude))  # before the target loads: a wrong path fails at once
    target, tokenizer = load_target_from_args(args)
    report = synthesize(target, tokenizer, args.out, count=args.count, kinds=tuple(args.kinds),
                        batch_size=args.batch_size, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                        exclude=exclude)
    print(json.dumps(report))
