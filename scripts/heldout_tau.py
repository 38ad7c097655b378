"""Greedy whole-block tau of drafters on held-out answers, one column per answer file (fp32 target unless told, CPU).

Replayed from teacher-forced passes (`trainer.greedy_tau`), which is exact for greedy
decoding and far cheaper than generating. The lever table of the model card comes from:

    python scripts/heldout_tau.py --drafters runs/levers/*/ --eval runs/levers/eval_*.jsonl \
        --feature-cache runs/features
"""

import argparse
import json
from pathlib import Path

import torch

from dspark_hf.formats.loader import DSparkDrafter
from dspark_hf.tools.targets import load_smollm2
from dspark_hf.tools.training.data import load_sequences
from dspark_hf.tools.training.trainer import FeatureStore, greedy_tau


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafters", nargs="+", required=True, help="drafter directories")
    parser.add_argument("--eval", nargs="+", required=True, help="regenerated answer files, one column each")
    parser.add_argument("--feature-cache", default=None, help="the training runs' target-feature cache, if any")
    parser.add_argument("--max-tokens", type=int, default=1280, help="tokens per replayed sequence")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the target's dtype for the features (bfloat16: as scripts/scaling_curve.py trains)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, _ = load_smollm2(dtype=getattr(torch, args.dtype))
    columns = {Path(path).stem: load_sequences(path) for path in args.eval}
    print("| drafter | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for directory in args.drafters:
        drafter = DSparkDrafter.from_pretrained(directory, target, dtype=torch.float32)
        store = FeatureStore(target, drafter.config.target_layer_ids, Path(args.feature_cache) if args.feature_cache else None)
        taus = [greedy_tau(drafter, records, store, args.max_tokens) for records in columns.values()]
        print(f"| {directory} | " + " | ".join(f"{tau:.3f}" for tau in taus) + " |", flush=True)
        print(json.dumps({"drafter": directory, **{name: round(tau, 4) for name, tau in zip(columns, taus)}}), flush=True)


if __name__ == "__main__":
    main()
