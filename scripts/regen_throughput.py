"""Answers per hour of `dspark regenerate` at several batch sizes, and how far batched answers stray from batch 1's.

Every batch size answers the same prompts (the first N training prompts, sorted by length as regenerate
sorts them) with the same decoding loop, interleaved chunk by chunk; `generate()` at one batch size is the old way, for comparison.
A greedy answer that differs from batch 1's is reported with batch 1's top-2 logit margin at the first
differing token (left padding changes the arithmetic a little, so only near-ties may flip).

    python scripts/regen_throughput.py --prompts ../shared/data/prompts/train/*.jsonl --count 64 \
        --batch-sizes 1 8 32 64 --generate-batch 32 --threads 1
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dspark_hf.tools.bench import cpu_identity
from dspark_hf.tools.exactness import find_divergence
from dspark_hf.tools.prompts import read_prompts, render_prompt
from dspark_hf.tools.targets import cpu_has_native_bf16, load_target
from dspark_hf.tools.training.regenerate import decode, stop_token_ids, token_chooser


def answer_all(answer_batch, prompts, batch_size):
    started = time.perf_counter()
    answers = []
    for start in range(0, len(prompts), batch_size):
        answers += answer_batch(prompts[start:start + batch_size])
    return answers, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--generate-batch", type=int, default=32, help="also time generate() at this batch size")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    target, tokenizer = load_target("smollm2", dtype=args.dtype)
    prompts = sorted((render_prompt(tokenizer, p) for p in read_prompts(args.prompts)[:args.count]), key=len)
    stop_ids = stop_token_ids(target, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]

    def ours(batch):
        return decode(target, batch, max_new_tokens=args.max_new_tokens, stop_ids=stop_ids, pad_id=pad_id,
                      choose=token_chooser(0.0))

    def transformers_generate(batch):
        width = max(map(len, batch))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        output = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=args.max_new_tokens,
                                 eos_token_id=stop_ids, pad_token_id=pad_id)[:, width:].tolist()
        return [row[: next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))] for row in output]

    ours([prompts[0]])  # warm-up
    runs = [(f"ours B={b}", ours, b) for b in args.batch_sizes]
    runs += [(f"generate() B={args.generate_batch}", transformers_generate, args.generate_batch)]
    # interleaved: every run answers one chunk of the largest batch, then the next chunk, so load drifts hit all alike
    chunk = max(batch for _, _, batch in runs)
    answers = {name: [] for name, _, _ in runs}
    seconds = dict.fromkeys(answers, 0.0)
    for start in range(0, len(prompts), chunk):
        for name, answer_batch, batch_size in runs:
            chunk_answers, chunk_seconds = answer_all(answer_batch, prompts[start:start + chunk], batch_size)
            answers[name] += chunk_answers
            seconds[name] += chunk_seconds
    reference = answers[runs[0][0]]
    rows = []
    for name, _, _ in runs:
        divergences = [find_divergence(target, p, plain, other)
                       for p, plain, other in zip(prompts, reference, answers[name]) if plain != other]
        rows.append({"run": name, "answers_per_hour": round(len(prompts) * 3600 / seconds[name]),
                     "tokens_per_second": round(sum(map(len, answers[name])) / seconds[name], 1),
                     "differ_from_batch_1": len(divergences),
                     "max_margin_at_difference": max((d.margin for d in divergences), default=None),
                     "max_bf16_steps": max((d.steps for d in divergences), default=None)})
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["answers_per_hour"]
    print(f"\nCPU: {cpu_identity()} (bf16 matmuls: {cpu_has_native_bf16()}), {args.threads} thread(s), {target.dtype}, "
          f"{len(prompts)} prompts, up to {args.max_new_tokens} tokens")
    print("| run | answers/h | tok/s | x batch 1 | differ from batch 1 | largest margin (bf16 steps) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        margin = "" if row["max_margin_at_difference"] is None else \
            f"{row['max_margin_at_difference']:.3f} ({row['max_bf16_steps']:.1f})"
        print(f"| {row['run']} | {row['answers_per_hour']} | {row['tokens_per_second']} | "
              f"{row['answers_per_hour'] / base:.2f} | {row['differ_from_batch_1']} | {margin} |")


if __name__ == "__main__":
    main()
