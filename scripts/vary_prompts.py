"""Variants of the gsm8k training prompts, each number drawn again, for answers in the style the gsm8k dev set asks for.

    python scripts/vary_prompts.py --per-prompt 4 --out data/smollm2/gsm8k_variants_prompts.jsonl.gz

Why: the target's own "math" prompts (`dspark synthesize`) are rarely word problems (a 135M model asked for one
writes about resumes and coffee shops), so the drafter had read about 1,060 answers in the gsm8k style, and its
dev gsm8k τ stayed level while every other set rose with the data. A variant keeps a training problem's words and
its instruction line and redraws every number with the same count of digits (no leading zero); the target then
answers it greedily like any prompt (`dspark regenerate`). Only training prompts are varied: a prompt held out
(`prompt_index % 20 == 19` in `scripts/smollm2_splits.py`'s order) has no variant, and a variant whose problem
shares more than 30% of its word trigrams with a dev problem (the instruction line left out on both sides) is
dropped. Deterministic: the variants of prompt i are drawn from seed i. The file is cut to whole shards of
`--shard-size`, since `dspark regenerate` finishes a short last shard only once more prompts fill it.
"""

import argparse
import gzip
import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_splits import PROMPTS, prompt_lines  # noqa: E402  (a sibling script: the held-out rule and prompt order)

from dspark_hf.tools.prompts import read_prompts, shipped_prompt_sets
from dspark_hf.tools.training.synthesize import PromptFilter

NUMBER = re.compile(r"\d+")


def redraw(problem: str, rng: random.Random) -> str:
    """`problem` with every run of digits replaced by a random one as long (no leading zero: 1,000 may become 4,382)."""
    def draw(match):
        digits = len(match.group())
        return str(rng.randint(10 ** (digits - 1) if digits > 1 else 1, 10 ** digits - 1))
    return NUMBER.sub(draw, problem)


def split(prompt: str) -> tuple[str, str]:
    """(the problem, its last line: gsm8k's instruction to reason step by step); no line break: (prompt, "")."""
    problem, _, instruction = prompt.rpartition("\n")
    return (problem, instruction) if problem else (prompt, "")


def write_whole_shards(path: Path, records: list[dict], shard_size: int) -> int:
    """Write the prompt records that fill whole answer shards, gzipped; returns how many."""
    records = records[:len(records) // shard_size * shard_size]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as sink:
        sink.writelines(json.dumps(record) + "\n" for record in records)
    return len(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-prompt", type=int, default=4, help="variants of each training prompt")
    parser.add_argument("--train-prompts", type=Path, default=PROMPTS,
                        help="folder of aime24.jsonl, gsm8k.jsonl, ... (default: %(default)s)")
    parser.add_argument("--shard-size", type=int, default=256, help="the answer shards' size (keep whole shards)")
    parser.add_argument("--out", type=Path, required=True, help="jsonl(.gz) of {turns, kind, source, origin}")
    args = parser.parse_args()
    dev = [split(prompt)[0] for prompt in read_prompts([shipped_prompt_sets()["gsm8k"]])]
    keep = PromptFilter(dev, kept=[])
    records, dropped = [], 0
    for index, (kind, line) in enumerate(prompt_lines(args.train_prompts)):
        if kind != "gsm8k" or index % 20 == 19:
            continue
        problem, instruction = split(json.loads(line)["turns"][0])
        rng = random.Random(index)
        for _ in range(args.per_prompt):
            variant = redraw(problem, rng)
            if keep.reason(variant, complete=True):
                dropped += 1
                continue
            records.append({"turns": ["\n".join(filter(None, (variant, instruction)))], "kind": "math", "source": "gsm8k-variant",
                            "origin": index})
    kept = write_whole_shards(args.out, records, args.shard_size)
    print(json.dumps({"out": str(args.out), "variants": kept, "dropped": dropped}))


if __name__ == "__main__":
    main()
