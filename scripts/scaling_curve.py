"""What more answers buy: fresh SmolLM2 drafters trained on 1x, 2x, 4x and 8x a base set, and their held-out tau.

    python scripts/scaling_curve.py --out runs/scaling --base 384 --epochs 2 --workers 2

One rule for steps: `epochs` passes over each run's answers (batch 4), so a run on twice the answers also
trains twice as long, as a bigger dataset would in practice. Every run is fresh (random init, its own
8,192-token draft vocabulary, the shipped drafter's shape: 2 layers, block 7), and the smallest size runs
with two seeds to show the noise. Sets are nested random draws (1x within 2x within 4x within 8x) from the
training answers of `data/` whose `prompt_index % 20 != 19`, lbpp excluded. Held out, never trained on:
  - answers: the `prompt_index % 20 == 19` answers (old training prompts and the target's own prompts);
  - a kind: every lbpp answer (Python problems of a source no run sees).
Tau is greedy whole-block tau (bonus included) replayed from teacher-forced passes (`trainer.greedy_tau`),
bf16 target features as in training. Every stage resumes: features are cached, a run continues from its
checkpoint, and finished evaluations are kept in OUT/results.json. The last stage fits tau = a + b ln(N)
and writes OUT/curve.md. Two processes of one thread each; the features are computed once, up front.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from smollm2_splits import magpie_answers, prompt_lines  # noqa: E402

from dspark_hf.tools.training.data import load_sequences, read_jsonl  # noqa: E402

OLD = [ROOT / "data/smollm2_answers.jsonl.gz", ROOT / "data/smollm2_answers_long_bf16.jsonl.gz"]
SIZES = (1, 2, 4, 8)
MAX_TOKENS = 768


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def make_splits(out: Path, base: int, eval_limit: int, shards: int) -> dict:
    """The nested training sets and the two held-out sets, written once (a rerun reads them back)."""
    plan_file = out / "plan.json"
    if plan_file.exists():
        return json.loads(plan_file.read_text())
    kinds = [kind for kind, _ in prompt_lines()]
    old = [dict(r, kind=kinds[r["prompt_index"]], source="train-prompts") for path in OLD for r in read_jsonl(path)]
    magpie = magpie_answers(shards)
    answers = old + magpie
    pool = [r for r in answers if r["prompt_index"] % 20 != 19 and r["kind"] != "lbpp"]
    held = [r for r in answers if r["prompt_index"] % 20 == 19 and r["kind"] != "lbpp"]
    lbpp = [r for r in answers if r["kind"] == "lbpp"]
    if base * SIZES[-1] > len(pool):
        sys.exit(f"--base {base}: {SIZES[-1]}x needs {base * SIZES[-1]} answers, the pool has {len(pool)}")
    random.Random(0).shuffle(pool)
    for shuffled in (held, lbpp):
        random.Random(1).shuffle(shuffled)
    out.mkdir(parents=True, exist_ok=True)
    plan = {"base": base, "pool": len(pool), "magpie_shards": shards, "magpie_answers": len(magpie), "sets": {}}
    for size in SIZES:
        chosen = pool[: base * size]
        write_jsonl(out / f"train_{size}x.jsonl", chosen)
        mix: dict[str, int] = {}
        for record in chosen:
            mix[record["kind"]] = mix.get(record["kind"], 0) + 1
        plan["sets"][f"{size}x"] = {"answers": len(chosen), "answer_tokens": sum(len(r["response_ids"]) for r in chosen),
                                    "mix": dict(sorted(mix.items()))}
    write_jsonl(out / "heldout_answers.jsonl", held[:eval_limit])
    write_jsonl(out / "heldout_lbpp.jsonl", lbpp[:eval_limit])
    plan["heldout"] = {"answers": min(len(held), eval_limit), "lbpp": min(len(lbpp), eval_limit)}
    plan_file.write_text(json.dumps(plan, indent=1))
    return plan


def runs(plan: dict, epochs: float) -> list[dict]:
    """Every training run, longest first so the workers finish together."""
    todo = [{"name": f"{size}x_seed{seed}", "size": size, "seed": seed,
             "steps": max(1, round(plan["sets"][f"{size}x"]["answers"] * epochs / 4))}
            for size in SIZES for seed in ((0, 1) if size == SIZES[0] else (0,))]
    return sorted(todo, key=lambda run: -run["steps"])


def dspark(*arguments: str) -> list[str]:
    """The `dspark` command of this interpreter (PYTHONPATH, if set, picks the checkout)."""
    return [sys.executable, "-c", "import sys; from dspark_hf.tools.cli import main; sys.exit(main())", *arguments]


def in_parallel(commands: list[list[str]], workers: int, log: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(command: list[str]) -> None:
        with log.open("a") as sink:
            subprocess.run(command, check=True, env=env, stdout=sink, stderr=subprocess.STDOUT)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(run, command) for command in commands]:
            future.result()


def features(out: Path, worker: int, workers: int) -> None:
    """This worker's share of every sequence's bf16 target features, into the shared cache."""
    import torch

    from dspark_hf.tools.targets import load_smollm2
    from dspark_hf.tools.training.trainer import FeatureStore

    torch.set_num_threads(1)
    target, _ = load_smollm2(dtype=torch.bfloat16)
    store = FeatureStore(target, json.loads((out / "layers.json").read_text()), out / "features")
    records = [r for name in (f"train_{SIZES[-1]}x", "heldout_answers", "heldout_lbpp")
               for r in load_sequences(out / f"{name}.jsonl")]
    for record in records[worker::workers]:
        store.get(torch.tensor(record["prompt_ids"] + record["response_ids"])[:MAX_TOKENS])


def evaluate(out: Path, name: str) -> None:
    """Held-out tau of one finished run, printed as one JSON line."""
    import torch

    from dspark_hf.formats.loader import DSparkDrafter
    from dspark_hf.tools.targets import load_smollm2
    from dspark_hf.tools.training.trainer import FeatureStore, greedy_tau

    torch.set_num_threads(1)
    target, _ = load_smollm2(dtype=torch.bfloat16)
    drafter = DSparkDrafter.from_pretrained(out / name, target, dtype=torch.float32)
    store = FeatureStore(target, drafter.config.target_layer_ids, out / "features")
    taus = {held: greedy_tau(drafter, load_sequences(out / f"heldout_{held}.jsonl"), store, MAX_TOKENS)
            for held in ("answers", "lbpp")}
    print(json.dumps({"run": name, **{f"tau_{k}": round(v, 4) for k, v in taus.items()}}))


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares tau = a + b ln N."""
    xs, ys = [math.log(n) for n, _ in points], [tau for _, tau in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def report(out: Path, plan: dict, todo: list[dict], results: dict) -> str:
    lines = ["| run | answers | answer tokens | steps | held-out answers tau | held-out kind (lbpp) tau |",
             "| --- | --- | --- | --- | --- | --- |"]
    for run in sorted(todo, key=lambda r: (r["size"], r["seed"])):
        result, data = results.get(run["name"], {}), plan["sets"][f"{run['size']}x"]
        lines.append(f"| {run['name']} | {data['answers']:,} | {data['answer_tokens']:,} | {run['steps']:,} | "
                     f"{result.get('tau_answers', float('nan')):.3f} | {result.get('tau_lbpp', float('nan')):.3f} |")
    for held in ("answers", "lbpp"):
        points = [(plan["sets"][f"{r['size']}x"]["answers"], results[r["name"]][f"tau_{held}"])
                  for r in todo if r["name"] in results]
        if len({n for n, _ in points}) < 2:
            continue
        a, b = fit(points)
        lines.append("")
        lines.append(f"Held-out {held}: tau = {a:.3f} + {b:.4f} ln N ({b * math.log(2):+.3f} per doubling); "
                     + ", ".join(f"N = {n:,}: {a + b * math.log(n):.2f}" for n in (2_427, 24_270, 242_700)))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs/scaling")
    parser.add_argument("--base", type=int, default=384, help="answers in the 1x set")
    parser.add_argument("--epochs", type=float, default=2.0, help="passes over each run's answers")
    parser.add_argument("--workers", type=int, default=2, help="single-thread processes at once")
    parser.add_argument("--eval-limit", type=int, default=120, help="answers per held-out set")
    parser.add_argument("--shards", type=int, default=9, help="answer shards of the target's own prompts in the pool "
                        "(the measured curve: the first 9; later shards would change every set)")
    parser.add_argument("--features-worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = args.out.resolve()
    if args.features_worker is not None:
        return features(out, args.features_worker, args.workers)
    if args.evaluate is not None:
        return evaluate(out, args.evaluate)
    plan = make_splits(out, args.base, args.eval_limit, args.shards)
    print(json.dumps(plan), flush=True)
    (out / "layers.json").write_text(json.dumps([1, 10, 18, 27]))  # the shipped drafter's target layers
    log = out / "log.txt"
    me = [sys.executable, __file__, "--out", str(out), "--workers", str(args.workers)]
    in_parallel([me + ["--features-worker", str(k)] for k in range(args.workers)], args.workers, log)
    todo = runs(plan, args.epochs)
    commands = []
    for run in todo:
        run_dir = out / run["name"]
        if (run_dir / "model.safetensors").exists():
            continue
        commands.append(dspark(
            "train", "--target", "smollm2", "--dtype", "bfloat16", "--threads", "1",
            "--data", str(out / f"train_{run['size']}x.jsonl"), "--out", str(run_dir), "--layers", "2",
            "--target-layer-ids", "1", "10", "18", "27", "--draft-vocab", "8192", "--max-steps", str(run["steps"]),
            "--batch-size", "4", "--anchors", "32", "--max-tokens", str(MAX_TOKENS), "--lr", "6e-4",
            "--warmup-steps", "20", "--autocast", "bf16", "--seed", str(run["seed"]), "--save-every", "50",
            "--feature-cache", str(out / "features"), *(["--resume"] if (run_dir / "checkpoint").exists() else [])))
    in_parallel(commands, args.workers, log)
    results_file = out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    missing = [run["name"] for run in todo if run["name"] not in results]
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        outputs = pool.map(lambda name: subprocess.run(me + ["--evaluate", name], check=True, capture_output=True,
                                                       text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout,
                           missing)
        for output in outputs:
            result = json.loads(output.strip().splitlines()[-1])
            results[result.pop("run")] = result
            results_file.write_text(json.dumps(results, indent=1))
    table = report(out, plan, todo, results)
    (out / "curve.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
