"""The SmolLM2 drafter's training mix, held-out sets and lever-study splits, from data/*.jsonl.

    python scripts/smollm2_splits.py --out runs [--shards 48] [--train-prompts DIR]

writes runs/grown/train.jsonl (every training answer, the target's own prompts, the gsm8k variants, the stubs and
the writing answers included), runs/writing/train.jsonl and runs/final/heldout_writing.jsonl (the writing answers
to train on and the held-out ones), with `--focus N` also runs/focus/train.jsonl (the ninth, eleventh and twelfth
runs' mix), with
`--new-from K --replay N` also runs/grown/continue.jsonl (every training answer of shards K and up, plus N
earlier ones drawn at random: the sixth run of docs/studies.md), runs/final/{train,heldout,heldout_prompts}.jsonl
(the previous drafter's data and the held-out sets) and runs/levers/{train_base,train_no_lbpp,train_half,eval_in,eval_lbpp,eval_aime}.jsonl plus
text_prompts.txt and text_python.txt (the `--text` lever). Held out everywhere: answers with
`prompt_index % 20 == 19`. Deterministic (fixed seeds); no dev prompt is read.
"""

import argparse
import collections
import glob
import itertools
import json
import random
import sysconfig
from pathlib import Path
from typing import Optional

from dspark_hf.tools.training.data import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT.parent / "shared" / "data" / "prompts" / "train"  # the task's training prompts, beside the checkout
MAGPIE = (ROOT / "data/smollm2/magpie", ROOT / "data/smollm2/magpie_fp32")  # bf16 and fp32 answers, disjoint shards
MAGPIE_PROMPTS = ROOT / "data/smollm2/magpie_prompts.jsonl.gz"
VARIANTS = ROOT / "data/smollm2/gsm8k_variants"  # answers to scripts/vary_prompts.py's prompts: all training answers
STUBS = ROOT / "data/smollm2/stubs"  # answers to scripts/stub_prompts.py's prompts: all training answers
WRITING = ROOT / "data/smollm2/writing"  # answers to `dspark synthesize --kinds writing` prompts, 1 in 20 held out
KINDS = ("aime24", "arena-hard-v2", "gsm8k", "lbpp", "livecodebench")  # sorted: `regenerate`'s round-robin order


def prompt_lines(folder: Path = PROMPTS) -> list[tuple[str, str]]:
    """(kind, jsonl line) per prompt index, in the order `dspark regenerate` read them."""
    missing = [kind for kind in KINDS if not (folder / f"{kind}.jsonl").is_file()]
    if missing:
        raise SystemExit(f"smollm2_splits.py: no {missing[0]}.jsonl in {folder}; pass --train-prompts DIR, "
                         "the folder of the training prompts the answers were regenerated from")
    per_kind = [[(kind, line) for line in open(folder / f"{kind}.jsonl")] for kind in KINDS]
    return [x for round_ in itertools.zip_longest(*per_kind) for x in round_ if x is not None]


def answers(path: Path, kinds: list[tuple[str, str]]) -> list[dict]:
    records = read_jsonl(path)
    for record in records:
        record["kind"] = kinds[record["prompt_index"]][0]
    return records


def magpie_answers(shards: Optional[int] = None) -> list[dict]:
    """The answers to the target's own prompts (`dspark synthesize`), kind `magpie-math|code|chat`.

    `shards`: only the first so many shards (by shard number, over both folders), so a split made before later
    shards landed can be made again."""
    kinds = [record.get("kind", "chat") for record in read_jsonl(MAGPIE_PROMPTS)]
    paths = sorted((path for folder in MAGPIE for path in folder.glob("shard-*.jsonl.gz")), key=lambda p: p.name)
    paths = paths[:shards]
    return [dict(r, kind="magpie-" + kinds[r["prompt_index"]], source="magpie")
            for path in paths for r in read_jsonl(path)]


def folder_answers(folder: Path, kind: str) -> list[dict]:
    """Every answer in a folder of shards, tagged with `kind` as kind and source. The gsm8k variants and the stubs are
    built from training prompts or answers only, so none is held out; the writing prompts hold out 1 in 20."""
    return [dict(r, kind=kind, source=kind) for path in sorted(folder.glob("shard-*.jsonl.gz")) for r in read_jsonl(path)]


def write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    mix = collections.Counter(r["kind"] for r in records)
    print(path, len(records), dict(sorted(mix.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs")
    parser.add_argument("--shards", type=int,
                        help="read only the first N answer shards of the target's own prompts, and no gsm8k "
                             "variants or stubs (default: all; the fifth drafter: 92, the one before: 84)")
    parser.add_argument("--train-prompts", type=Path, default=PROMPTS,
                        help="folder of aime24.jsonl, gsm8k.jsonl, ... (default: %(default)s)")
    parser.add_argument("--new-from", type=int, metavar="K",
                        help="write runs/grown/continue.jsonl: the training answers of shards K and up ...")
    parser.add_argument("--replay", type=int, default=0, metavar="N",
                        help="... plus N earlier training answers drawn at random (seeded)")
    parser.add_argument("--focus", type=int, metavar="N",
                        help="write runs/focus/train.jsonl: every gsm8k-variant and stub answer and every training "
                             "answer to the training prompts, plus N answers to the target's own prompts drawn at "
                             "random (the ninth and eleventh runs of docs/studies.md)")
    args = parser.parse_args()
    if args.new_from is not None and args.shards is not None and not 0 <= args.new_from < args.shards:
        parser.error(f"--new-from {args.new_from}: give a shard below --shards {args.shards}")
    out = Path(args.out)
    kinds = prompt_lines(args.train_prompts)
    short = answers(ROOT / "data/smollm2_answers.jsonl.gz", kinds)
    long_ = answers(ROOT / "data/smollm2_answers_long_bf16.jsonl.gz", kinds)
    train = [r for r in short + long_ if r["prompt_index"] % 20 != 19]
    held = [r for r in short + long_ if r["prompt_index"] % 20 == 19]

    # The shipped drafter: every training answer once (the target's own prompts give chat and code their share).
    magpie = [r for r in magpie_answers(args.shards) if r["prompt_index"] % 20 != 19]
    variants = folder_answers(VARIANTS, "gsm8k-variant")
    stubs = folder_answers(STUBS, "stub")
    writing = folder_answers(WRITING, "writing")
    writing_train = [r for r in writing if r["prompt_index"] % 20 != 19]
    grown = train + magpie + (variants + stubs + writing_train if args.shards is None else [])  # --shards: before them
    write(out / "grown/train.jsonl", grown)
    write(out / "writing/train.jsonl", writing_train)
    write(out / "final/heldout_writing.jsonl", [r for r in writing if r["prompt_index"] % 20 == 19])
    if args.focus is not None:
        focus = variants + train + random.Random(9).sample(magpie, args.focus)
        # The ninth run's file, then the stubs (the trainer draws its own order; the eleventh read stub shards 0-15)
        write(out / "focus/train.jsonl", random.Random(10).sample(focus, len(focus)) + stubs)
    if args.new_from is not None:
        seen = len(train) + sum(r["prompt_index"] % 20 != 19 for r in magpie_answers(args.new_from))
        older = train + magpie
        write(out / "grown/continue.jsonl", older[seen:] + random.Random(5).sample(older[:seen], args.replay))

    # The previous drafter: chat and code listed twice, so chat, code and math weigh about the same.
    write(out / "final/train.jsonl", train + [r for r in train if r["kind"] in ("arena-hard-v2", "lbpp", "livecodebench")])
    write(out / "final/heldout.jsonl", held)
    (out / "final/heldout_prompts.jsonl").write_text("".join(kinds[i][1] for i in sorted(r["prompt_index"] for r in held)))

    # Lever study: 150 short-prompt answers each of gsm8k, arena-hard and livecodebench, 100 of lbpp; aime never.
    rng = random.Random(0)
    short_train = [r for r in short if r["prompt_index"] % 20 != 19]
    pick = lambda kind, n: rng.sample([r for r in short_train if r["kind"] == kind], n)  # noqa: E731
    base = pick("gsm8k", 150) + pick("arena-hard-v2", 150) + pick("livecodebench", 150)
    lbpp = pick("lbpp", 100)
    in_base = {r["prompt_index"] for r in base}
    extra = [r for r in pick("gsm8k", 34) + pick("arena-hard-v2", 33) + pick("livecodebench", 33)
             if r["prompt_index"] not in in_base]  # about the same size without lbpp
    write(out / "levers/train_base.jsonl", base + lbpp)
    write(out / "levers/train_no_lbpp.jsonl", base + extra)
    write(out / "levers/train_half.jsonl", (base + lbpp)[::2])
    eval_in = [r for r in short if r["prompt_index"] % 20 == 19 and r["kind"] != "lbpp"]
    in_lbpp = {r["prompt_index"] for r in lbpp}
    eval_lbpp = [r for r in short if r["kind"] == "lbpp" and r["prompt_index"] not in in_lbpp][:50]
    eval_aime = [r for r in short if r["kind"] == "aime24"]
    for name, records in (("eval_in", eval_in), ("eval_lbpp", eval_lbpp), ("eval_aime", eval_aime)):
        write(out / f"levers/{name}.jsonl", records)

    # The --text lever: training prompts (none held out, evaluated or aime) and Python standard-library source.
    excluded = {r["prompt_index"] for r in eval_in + eval_lbpp + eval_aime}
    texts = [json.loads(line)["turns"][0] for i, (kind, line) in enumerate(kinds)
             if i % 20 != 19 and i not in excluded and kind != "aime24"]
    random.Random(0).shuffle(texts)
    sources = sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))
    random.Random(1).shuffle(sources)
    for name, pieces, limit in (("text_prompts.txt", texts, 600_000),
                                ("text_python.txt", (open(p, errors="replace").read() for p in sources), 420_000)):
        kept, size = [], 0
        for piece in pieces:
            if size > limit:
                break
            kept.append(piece)
            size += len(piece)
        (out / "levers" / name).write_text("\n\n".join(kept))


if __name__ == "__main__":
    main()
