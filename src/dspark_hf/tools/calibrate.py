"""`dspark calibrate`: collect greedy rounds on held-out prompts, fit STS, write the file and its report.

The fit is in `sts.py` and the file format in `dspark_hf.core.calibration`; this module runs
generation to observe survival, and draws the per-position table and diagram.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from ..core.calibration import CALIBRATION_FILE, DEFAULT_BINS, Calibration
from ..core.costs import cost_table_path, profile_costs
from ..core.scheduling import FULL_BLOCK, SCHEDULER_PRESETS
from .errors import InputError, positive_int
from .options import add_model_arguments, load_pair_from_args
from .prompts import read_prompts, render_prompt
from .sts import RoundOutcomes, calibrate, prefix_survival, reliability_curve
from .targets import shipped_drafter_path

REPORT_FILE = "dspark_calibration.md"
DIAGRAM_FILE = "dspark_calibration.png"


# ------------------------------------------------------------ the report
def _number(value: Optional[float], digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report_table(calibration: Calibration) -> str:
    """A markdown table: one row per draft position, before and after STS."""
    lines = [
        "| position | rounds | survival | T_k | fit | ECE before | ECE after | AUC before | AUC after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k, temperature in enumerate(calibration.temperatures):
        cells = [
            str(k + 1),
            str(calibration.rounds_per_position[k]),
            _number(calibration.survival_rate[k]),
            f"{temperature:.3f}",
            calibration.decisions[k] if k < len(calibration.decisions) else "-",
            _number(calibration.ece_before[k], 4),
            _number(calibration.ece_after[k], 4),
            _number(calibration.auc_before[k]),
            _number(calibration.auc[k]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_reliability(outcomes: RoundOutcomes, calibration: Calibration, path: Path) -> None:
    """One reliability diagram per draft position: prefix survival predicted vs observed, before and after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {
        "raw": prefix_survival(outcomes.confidences),
        "STS": prefix_survival(calibration.apply(outcomes.confidences)),
    }
    count = len(calibration.temperatures)
    columns = min(count, 4)
    rows = -(-count // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.2 * rows), squeeze=False)
    for k, axis in enumerate(axes.flat):
        if k >= count:
            axis.axis("off")
            continue
        axis.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle=":")
        for label, survival in curves.items():
            predicted, observed = outcomes.position(survival, k)
            if len(observed):
                mean_predicted, rate, _ = reliability_curve(predicted, observed, calibration.num_bins)
                axis.plot(mean_predicted, rate, marker="o", markersize=3, label=label)
        axis.set_title(
            f"k={k + 1}  ECE {_number(calibration.ece_before[k])} -> {_number(calibration.ece_after[k])}", fontsize=9
        )
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
        if k == 0:
            axis.legend(fontsize=8)
    figure.supxlabel("predicted prefix survival  prod c_i")
    figure.supylabel("observed prefix survival")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ------------------------------------------------------------ the command
def collect_rounds(target, drafter, prompts_ids: list[list[int]], max_new_tokens: int) -> list[list]:
    """Greedy generation verifying the whole block: the rounds of each prompt, its last round dropped.

    The last round can be cut by EOS or max_length, and then transformers counts
    an accepted draft token as the target's own, so its outcome is not a clean
    observation.
    """
    settings = GenerationConfig(  # the drafter's own rounds only: n-gram rounds carry no confidences
        do_sample=False,
        max_new_tokens=max_new_tokens,
        num_assistant_tokens=drafter.config.num_draft_tokens,
        **SCHEDULER_PRESETS[FULL_BLOCK],
    )
    per_prompt = []
    for ids in tqdm(prompts_ids, desc="calibration rounds", file=sys.stderr):
        prompt = torch.tensor([ids], device=target.device)
        mask = torch.ones_like(prompt)
        target.generate(prompt, attention_mask=mask, generation_config=settings, assistant_model=drafter)
        per_prompt.append(drafter.last_trace[:-1])
    return per_prompt


def run(args) -> None:
    if not args.prompts and not args.profile_costs:
        raise InputError("give --prompts to calibrate, --profile-costs to re-profile, or both.")
    target, tokenizer, drafter = load_pair_from_args(args)
    drafter_directory = shipped_drafter_path() if args.drafter is None else (
        Path(args.drafter) if os.path.isdir(args.drafter) else None
    )
    if args.profile_costs:
        table = profile_costs(drafter, refresh=True)
        print(json.dumps({"cost_table": str(cost_table_path(drafter)), **table.to_dict()}))
    if not args.prompts:
        return
    out = Path(args.out) if args.out else drafter_directory
    if out is None:
        raise InputError("the drafter is not a local directory; pass --out DIR.")
    if drafter.confidence_head is None:
        raise InputError("this drafter has no confidence head, so there is nothing to calibrate.")

    prompts = read_prompts(args.prompts)[args.skip :][: args.limit]
    per_prompt = collect_rounds(target, drafter, [render_prompt(tokenizer, p) for p in prompts], args.max_new_tokens)
    # Even prompts fit the temperatures; odd ones check them, and the report is measured on those.
    positions = drafter.config.num_draft_tokens
    fit = RoundOutcomes.from_trace([r for rounds in per_prompt[0::2] for r in rounds], positions)
    outcomes = RoundOutcomes.from_trace([r for rounds in per_prompt[1::2] for r in rounds], positions)
    if fit.num_rounds == 0 or outcomes.num_rounds == 0:
        raise InputError("generation produced no usable rounds; use more prompts (at least two) or longer answers.")
    source = {
        "target": args.target,
        "drafter": args.drafter or str(drafter_directory),
        "prompts": list(args.prompts),
        "skip": args.skip,
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "decoding": "greedy, whole block verified",
        "split": "even prompts fit, odd prompts check and report",
    }
    calibration = calibrate(fit, outcomes, num_bins=args.bins, source=source)

    out.mkdir(parents=True, exist_ok=True)
    calibration.save(out / CALIBRATION_FILE)
    table = report_table(calibration)
    summary = (
        f"Fitted on {fit.num_rounds} rounds from {len(per_prompt[0::2])} prompts; checked and reported on "
        f"{outcomes.num_rounds} rounds from {len(per_prompt[1::2])} other prompts. A temperature is kept only when "
        "it is off the grid's edges and lowers the held-out ECE without lowering the AUC."
    )
    (out / REPORT_FILE).write_text(f"# STS calibration\n\n{summary}\n\n{table}")
    print(table)
    try:
        plot_reliability(outcomes, calibration, out / DIAGRAM_FILE)
    except ImportError:
        print("[dspark] no reliability diagram without matplotlib: pip install 'dspark_hf[calibrate]'", file=sys.stderr)
    print(f"[dspark] wrote {out / CALIBRATION_FILE}", file=sys.stderr)


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--prompts", nargs="+",
                        help='held-out prompts: jsonl files of {"turns": [...]}, or shipped set names')
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N prompts (e.g. those trained on)")
    parser.add_argument("--limit", type=positive_int, default=100, help="prompts to generate from")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256, help="most tokens per greedy answer")
    parser.add_argument("--bins", type=positive_int, default=DEFAULT_BINS, help="equal-width ECE bins")
    parser.add_argument("--out", default=None, help="directory for the results; unset: the drafter's own")
    parser.add_argument(
        "--profile-costs", action="store_true", help="measure the cost table for the 'cost' scheduler again"
    )
    parser.set_defaults(func=run)
