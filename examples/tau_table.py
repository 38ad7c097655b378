"""τ (accepted tokens per round, bonus included) of shipped or local drafters on prompt sets.

Greedy, full block verified (threshold 0, no n-gram rounds), rounds pooled over the prompts
of a set as the paper does. Only τ is measured, so no plain-decoding baseline is run; use
`dspark bench` for speed.

    python examples/tau_table.py --drafters dspark dflash --limit 10 --prompts gsm8k humaneval mt-bench --json tau.json
"""

import argparse
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dspark_hf import DSparkDrafter, summarize
from dspark_hf.tools.prompts import prompt_file, read_prompts, render_prompt
from dspark_hf.tools.targets import dflash_drafter_path, load_smollm2, shipped_drafter_path

parser = argparse.ArgumentParser()
parser.add_argument("--drafters", nargs="+", default=["dspark", "dflash"],
                    help="'dspark' (shipped), 'dflash' (drafters/ in this checkout) or directories")
parser.add_argument("--prompts", nargs="+", required=True, help="shipped set names or jsonl files")
parser.add_argument("--limit", type=int, default=10)
parser.add_argument("--max-new-tokens", type=int, default=128)
parser.add_argument("--json", required=True)
args = parser.parse_args()

target, tokenizer = load_smollm2()
results = {}
for kind in args.drafters:
    path = {"dspark": shipped_drafter_path(), "dflash": dflash_drafter_path()}.get(kind, kind)
    drafter = DSparkDrafter.from_pretrained(path, target)
    for prompts in args.prompts:
        rounds = []
        name = prompt_file(prompts).stem
        for prompt in tqdm(read_prompts([prompts], limit=args.limit), desc=f"{kind} {name}"):
            ids = torch.tensor([render_prompt(tokenizer, prompt)])
            target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, assistant_model=drafter,
                            dspark_scheduler="threshold", assistant_confidence_threshold=0.0, dspark_ngram=False)
            rounds += drafter.last_trace
        summary = summarize(rounds)
        results.setdefault(name, {})[kind] = {
            "tau": summary.tau,
            "acceptance_per_position": summary.acceptance_per_position,
            "rounds": summary.rounds,
        }
        print(f"{kind} {name}: tau={summary.tau:.3f} over {summary.rounds} rounds", flush=True)
Path(args.json).write_text(json.dumps(results, indent=2))
