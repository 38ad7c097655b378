"""τ (accepted tokens per round, bonus included) of shipped or local drafters on prompt sets.

Greedy, full block verified (threshold 0), rounds pooled over the prompts of a set as
the paper does. Only τ is measured, so no plain-decoding baseline is run; use
`dspark bench` for speed.

    python examples/tau_table.py --drafters dspark dflash --limit 10 \
        --prompts ../shared/data/prompts/dev/{gsm8k,humaneval,mt-bench}.jsonl --json tau.json
"""

import argparse
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dspark_hf import DSparkDrafter, summarize
from dspark_hf.tools.prompts import read_prompts, render_prompt
from dspark_hf.tools.targets import load_smollm2, shipped_drafter_path

parser = argparse.ArgumentParser()
parser.add_argument("--drafters", nargs="+", default=["dspark", "dflash"], help="'dspark'/'dflash' (shipped) or directories")
parser.add_argument("--prompts", nargs="+", required=True)
parser.add_argument("--limit", type=int, default=10)
parser.add_argument("--max-new-tokens", type=int, default=128)
parser.add_argument("--json", required=True)
args = parser.parse_args()

target, tokenizer = load_smollm2()
results = {}
for kind in args.drafters:
    path = shipped_drafter_path(kind) if kind in ("dspark", "dflash") else kind
    drafter = DSparkDrafter.from_pretrained(path, target)
    for prompt_file in args.prompts:
        rounds = []
        for prompt in tqdm(read_prompts([prompt_file], limit=args.limit), desc=f"{kind} {Path(prompt_file).stem}"):
            ids = torch.tensor([render_prompt(tokenizer, prompt)])
            target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, assistant_model=drafter,
                            dspark_scheduler="threshold", assistant_confidence_threshold=0.0)
            rounds += drafter.last_trace
        summary = summarize(rounds)
        results.setdefault(Path(prompt_file).stem, {})[kind] = {
            "tau": summary.tau,
            "acceptance_per_position": summary.acceptance_per_position,
            "rounds": summary.rounds,
        }
        print(f"{kind} {Path(prompt_file).stem}: tau={summary.tau:.3f} over {summary.rounds} rounds", flush=True)
Path(args.json).write_text(json.dumps(results, indent=2))
