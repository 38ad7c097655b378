"""`dspark bench`: tau, acceptance and tokens/s of DSpark against plain decoding and other drafters.

All methods run in one process on the same prompts, interleaved prompt by prompt in a
rotating order, so drifts of a shared machine (heat, other jobs) hit every method alike
and each per-prompt speed-up compares two runs made seconds apart. The metrics are pure
functions of the recorded rounds and timings, kept apart from the measuring loop.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import torch

from ..core.machine import cpu_model
from ..core.scheduling import COST_SCHEDULER, FULL_BLOCK, SCHEDULER_PRESETS, THRESHOLD_SCHEDULER
from ..core.trace import CallTrace, RoundRecord, summarize
from ..formats.loader import DSparkDrafter
from .errors import InputError, positive_int, probability
from .exactness import find_divergence
from .options import (
    add_model_arguments,
    add_sampling_arguments,
    compiled_target_kwargs,
    load_target_from_args,
    sampling_kwargs,
    timed_generate,
)
from .prompts import prompt_file, read_prompts, render_prompt, shipped_prompt_sets
from .targets import DEFAULT_TARGET, dflash_drafter_path, fast_drafter_dtype, load_target, shipped_drafter_path

DEFAULT_METHODS = "plain,dspark,dspark-only,dspark-full,prompt-lookup"  # dflash: an ablation, in a checkout only
DEFAULT_PROMPT_LOOKUP_TOKENS = 7
# What may follow each method name: nothing, an optional "=VALUE", or a required one.
METHOD_VALUES = {
    "plain": "none",
    "plain-compiled": "none",
    "dspark": "none",
    "dspark-only": "none",
    "dspark-compiled": "none",
    "dspark-full": "none",
    "dspark-cost": "none",
    "dflash": "optional",
    "prompt-lookup": "optional",
    "assistant": "required",
}
METHOD_HELP = (
    "plain, plain-compiled (transformers' static cache under torch.compile; its first call compiles), "
    "dspark (the drafter's own defaults, as generate() runs it), dspark-only (the defaults without hybrid "
    "n-gram drafting), dspark-compiled (the defaults over plain-compiled's compiled target), dspark-full (whole "
    "blocks), dspark@T "
    "(threshold T), dspark-cost, dflash[=DIR] (whole blocks), prompt-lookup[=N], assistant=MODEL"
)
TRACE_FIELDS = (
    "rounds", "rounds_by_source", "tau", "acceptance_per_position", "verify_rate", "draft_seconds", "verify_seconds",
    "draft_share",
)


# ------------------------------------------------------------------ metrics


@dataclasses.dataclass(frozen=True)
class Timing:
    """One timed generate() call."""

    new_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds


def median(values: Iterable[float]) -> Optional[float]:
    values = list(values)
    return statistics.median(values) if values else None


def speedups(method: Sequence[Timing], plain: Sequence[Timing]) -> list[float]:
    """Per-prompt throughput ratio to plain decoding of the same prompt.

    With identical outputs (greedy) this is plain time / method time; with sampling the
    two runs may stop at different lengths, and tokens per second stays comparable.
    """
    return [m.tokens_per_second / p.tokens_per_second for m, p in zip(method, plain, strict=True)]


def trace_metrics(traces: Sequence[Sequence[RoundRecord]]) -> dict:
    """Round statistics pooled over all rounds of all prompts, as the paper averages tau over rounds."""
    rounds = list(itertools.chain.from_iterable(traces))
    if not rounds:
        return dict.fromkeys(TRACE_FIELDS)
    summary = summarize(rounds)
    anything_verified = any(r.num_verified for r in rounds)
    busy_seconds = summary.draft_seconds + summary.verify_seconds
    return {
        "rounds": summary.rounds,
        "rounds_by_source": dict(collections.Counter(r.source for r in rounds)),  # dspark, ngram, none
        "tau": summary.tau,
        "acceptance_per_position": summary.acceptance_per_position,
        "verify_rate": summary.verify_rate if anything_verified else None,
        "draft_seconds": summary.draft_seconds,
        "verify_seconds": summary.verify_seconds,
        "draft_share": summary.draft_seconds / busy_seconds if busy_seconds else None,
    }


def method_metrics(
    timings: Sequence[Timing], plain_timings: Sequence[Timing], traces: Optional[Sequence[Sequence[RoundRecord]]]
) -> dict:
    """One result row: medians over prompts of speed, plus pooled round statistics when there are traces."""
    ratios = speedups(timings, plain_timings)
    return {
        "prompts": len(timings),
        "new_tokens": sum(t.new_tokens for t in timings),
        "wall_seconds": sum(t.seconds for t in timings),
        "tokens_per_second": median(t.tokens_per_second for t in timings),
        "speedup": median(ratios),
        "per_prompt_tokens_per_second": [t.tokens_per_second for t in timings],
        "per_prompt_speedup": ratios,
        **(trace_metrics(traces) if traces is not None else dict.fromkeys(TRACE_FIELDS)),
    }


def rotated(items: Sequence, shift: int) -> list:
    """`items` started at index `shift` (mod len): each method takes every slot of the order in turn."""
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


# ------------------------------------------------------------------ methods


def parse_methods(text: str, threshold: Optional[float] = None) -> list[str]:
    """Method labels in order, validated; 'plain' always included since speed-up and losslessness refer to it."""
    labels = [label.strip() for label in text.split(",") if label.strip()]
    if threshold is not None:
        labels.append(f"dspark@{threshold:g}")
    labels = list(dict.fromkeys(["plain", *labels]))
    for label in labels:
        parse_method(label)
    return labels


def parse_method(label: str) -> tuple[str, Optional[str]]:
    """('dspark', '0.7') for 'dspark@0.7', ('dflash', DIR) for 'dflash=DIR', ('plain', None) for 'plain'."""
    if label.startswith("dspark@"):
        threshold = label.removeprefix("dspark@")
        try:
            probability(threshold)  # the rule --threshold follows
        except argparse.ArgumentTypeError:
            raise ValueError(f"method {label!r}: the threshold after '@' must be a number in [0, 1]") from None
        return "dspark", threshold
    kind, _, value = label.partition("=")
    rule = METHOD_VALUES.get(kind)
    if rule is None or (rule == "none" and value) or (rule == "required" and not value):
        raise ValueError(f"unknown method {label!r}; expected one of: {METHOD_HELP}")
    if kind == "prompt-lookup" and value and (not value.isdigit() or int(value) == 0):
        raise ValueError(f"method {label!r}: the number of lookup tokens must be a positive integer")
    return kind, value or None


@dataclasses.dataclass
class Method:
    """A method ready to run: the extra generate() arguments, and the drafter whose trace to read."""

    label: str
    generate_kwargs: dict
    drafter: Optional[object] = None  # a DSparkDrafter; its last_call records the latest call
    first_call_seconds: Optional[float] = None  # the warm-up call: what compiling costs a compiled method


def missing_drafter(kind: str) -> str:
    if kind == "dspark":
        return "method 'dspark' has no default drafter for this target: pass --drafter DIR."
    return (
        "method 'dflash' has no drafter here: pass dflash=DIR (for smollm2, a checkout of the repository has one "
        "in drafters/smollm2_dflash; the package does not carry it)."
    )


def check_drafters(labels: list[str], drafter_paths: dict[str, Optional[str | os.PathLike]]) -> None:
    """Before any model loads: every method that takes a default drafter has one."""
    for label in labels:
        kind, value = parse_method(label)
        needed = "dspark" if kind.startswith("dspark") else "dflash" if kind == "dflash" and value is None else None
        if needed and drafter_paths.get(needed) is None:
            raise InputError(f"--methods: {missing_drafter(needed)}")


class DrafterLoader:
    """Loads each drafter directory once, bound to the target, so 'dspark' and 'dspark@T' share one."""

    def __init__(
        self, target, default_paths: dict[str, Optional[str | os.PathLike]], dtype=None, local_files_only=False
    ):
        self.target = target
        self.default_paths = default_paths
        self.dtype = dtype  # None: the target's
        self.local_files_only = local_files_only
        self.loaded: dict[str, object] = {}

    def __call__(self, kind: str, path: Optional[str | os.PathLike] = None):
        path = path or self.default_paths.get(kind)
        if path is None:
            raise ValueError(missing_drafter(kind))
        key = str(path)
        if key not in self.loaded:
            self.loaded[key] = DSparkDrafter.from_pretrained(
                path, self.target, dtype=self.dtype, local_files_only=self.local_files_only
            )
        return self.loaded[key]


def assistant_kwargs(name: str, target, tokenizer) -> dict:
    """generate() arguments for a small assistant model; different vocabularies use universal assisted decoding."""
    assistant, assistant_tokenizer = load_target(name, dtype=target.dtype, device=str(target.device))
    kwargs = {"assistant_model": assistant}
    if tokenizer is not None and assistant_tokenizer.get_vocab() != tokenizer.get_vocab():
        kwargs.update(tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer)
    return kwargs


def prepare_method(label: str, load_drafter: Callable, target, tokenizer=None) -> Method:
    kind, value = parse_method(label)
    if kind == "plain":
        return Method(label, {})
    if kind == "plain-compiled":
        return Method(label, compiled_target_kwargs())
    if kind == "prompt-lookup":
        return Method(label, {"prompt_lookup_num_tokens": int(value or DEFAULT_PROMPT_LOOKUP_TOKENS)})
    if kind == "assistant":
        return Method(label, assistant_kwargs(value, target, tokenizer))
    if kind == "dflash":
        drafter = load_drafter("dflash", value)
        return Method(label, {"assistant_model": drafter, **SCHEDULER_PRESETS[FULL_BLOCK]}, drafter)
    drafter = load_drafter("dspark")
    if kind == "dspark" and value is None:  # nothing set: what generate() does with this drafter
        return Method(label, {"assistant_model": drafter}, drafter)
    if kind == "dspark-only":  # the same, the drafter alone: no n-gram rounds
        return Method(label, {"assistant_model": drafter, "dspark_ngram": False}, drafter)
    if kind == "dspark-compiled":  # the defaults, verifying with the target as plain-compiled compiles it
        return Method(label, {"assistant_model": drafter, **compiled_target_kwargs()}, drafter)
    if kind == "dspark":
        settings = {**SCHEDULER_PRESETS[THRESHOLD_SCHEDULER], "assistant_confidence_threshold": float(value)}
    elif kind == "dspark-full":
        settings = SCHEDULER_PRESETS[FULL_BLOCK]
    else:  # dspark-cost: the hardware-aware scheduler, profiled for this device on first use
        settings = SCHEDULER_PRESETS[COST_SCHEDULER]
    return Method(label, {"assistant_model": drafter, **settings}, drafter)


# ------------------------------------------------------------------ measuring


@dataclasses.dataclass
class Runs:
    """Everything one method produced on one prompt set, prompt by prompt."""

    timings: list[Timing] = dataclasses.field(default_factory=list)
    outputs: list[list[int]] = dataclasses.field(default_factory=list)
    calls: list[CallTrace] = dataclasses.field(default_factory=list)  # a drafter method's own record of each call


def describe_mode(temperature: float) -> str:
    return f"sampling (temperature {temperature:g})" if temperature > 0 else "greedy"


def generate_once(
    target, prompt_ids: list[int], method: Method, generation: dict
) -> tuple[list[int], Timing, Optional[CallTrace]]:
    """New tokens, wall time and, with a drafter, the call's record (its scheduler and rounds) of one generate()."""
    new_tokens, seconds = timed_generate(target, prompt_ids, **generation, **method.generate_kwargs)
    call = method.drafter.last_call if method.drafter is not None else None
    return new_tokens, Timing(len(new_tokens), seconds), call


def measure(
    target, prompt_sets: dict[str, list[list[int]]], methods: list[Method], generation: dict, seed: int, progress: bool
) -> dict[str, dict[str, Runs]]:
    """Warm every method up once, then run each prompt with every method in a rotating order."""
    from tqdm.auto import tqdm

    all_prompts = [prompt for prompts in prompt_sets.values() for prompt in prompts]
    if not all_prompts:
        raise ValueError("no prompts to benchmark.")
    first_prompt = all_prompts[0]
    for number, method in enumerate(methods, start=1):
        if progress:
            print(f"dspark bench: warming up {method.label} ({number}/{len(methods)})", file=sys.stderr, flush=True)
        method.first_call_seconds = generate_once(target, first_prompt, method, generation)[1].seconds
    runs = {name: {method.label: Runs() for method in methods} for name in prompt_sets}
    prompt_number = itertools.count()
    with tqdm(total=len(all_prompts), desc="bench", unit="prompt", disable=not progress) as bar:
        for name, prompts in prompt_sets.items():
            bar.set_postfix_str(name)
            for prompt_ids in prompts:
                number = next(prompt_number)
                for method in rotated(methods, number):
                    torch.manual_seed(seed + number)  # with sampling, every method draws from the same seed
                    tokens, timing, call = generate_once(target, prompt_ids, method, generation)
                    record = runs[name][method.label]
                    record.timings.append(timing)
                    record.outputs.append(tokens)
                    if call is not None:
                        record.calls.append(call)
                bar.update()
    return runs


def divergences(
    target, prompts: Sequence[list[int]], outputs: Sequence[list[int]], plain: Sequence[list[int]]
) -> list[dict]:
    """Every greedy output that differs from plain decoding: its prompt number and where and how close it left."""
    found = []
    for number, (prompt_ids, ours, theirs) in enumerate(zip(prompts, outputs, plain, strict=True)):
        divergence = find_divergence(target, prompt_ids, theirs, ours)
        if divergence is not None:
            found.append({"prompt": number, **dataclasses.asdict(divergence)})
    return found


def result_rows(
    runs: dict[str, dict[str, Runs]],
    methods: list[Method],
    target,
    prompt_sets: dict[str, list[list[int]]],
    greedy: bool,
) -> list[dict]:
    """One row per prompt set and method; greedy rows list where outputs left plain decoding."""
    rows = []
    for name, by_method in runs.items():
        plain = by_method["plain"]
        for method in methods:
            measured = by_method[method.label]
            traces = [call.rounds for call in measured.calls] if method.drafter is not None else None
            differing = divergences(target, prompt_sets[name], measured.outputs, plain.outputs) if greedy else None
            rows.append(
                {
                    "prompt_set": name,
                    "method": method.label,
                    "scheduler": "/".join(sorted({call.scheduler for call in measured.calls})) or None,
                    **method_metrics(measured.timings, plain.timings, traces),
                    "speedup_vs_compiled": median(speedups(measured.timings, by_method["plain-compiled"].timings))
                    if "plain-compiled" in by_method else None,
                    "greedy_mismatches": len(differing) if greedy else None,
                    "divergences": differing,
                }
            )
    return rows


# The instruction sets that decide how fast torch's kernels run a small model here (`lscpu` names them alike).
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_identity(cpuinfo: Optional[str] = None) -> str:
    """`cpu_model()`, plus what tells two CPUs of one name apart: the x86 family and model, and which of
    `SPEED_FLAGS` it has. Two speed figures compare only where this reads the same (`cpuinfo`: for tests)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return cpu_model()
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or cpu_model()
    if "cpu family" not in fields:
        return name
    flags = set(fields.get("flags", "").split())
    present = " ".join(flag for flag in SPEED_FLAGS if flag in flags) or "no AVX2"
    return f"{name} (family {fields['cpu family']} model {fields.get('model', '?')}; {present})"


def describe_environment(target) -> dict:
    import transformers

    device = target.device
    if device.type == "cpu":
        hardware = "CPU"
    elif device.type == "cuda":
        hardware = torch.cuda.get_device_name(device)
    else:
        hardware = device.type.upper()
    return {
        "hardware": hardware,
        "processor": cpu_identity(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(target.dtype).removeprefix("torch."),
        "device": str(device),
    }


def benchmark(
    target,
    prompt_sets: dict[str, list[list[int]]],
    method_labels: list[str],
    *,
    drafter_paths: Optional[dict[str, Optional[str | os.PathLike]]] = None,
    tokenizer=None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    settings: Optional[dict] = None,
    progress: bool = True,
    drafter_dtype=None,
    local_files_only: bool = False,
) -> dict:
    """Measure every method on every prompt set (already tokenized); the report as a JSON-ready dict.

    `drafter_paths` gives the drafter used by 'dspark' / 'dspark@T' and by 'dflash' without '=DIR'.
    `settings` adds descriptive entries (model names, files) to the report's settings.
    `drafter_dtype` loads the drafters in that dtype (default: the target's).
    Greedy runs that leave plain decoding are listed with the plain run's margin there (see `exactness`).
    """
    if "plain" not in method_labels:
        raise ValueError("'plain' must be among the methods: speed-ups and the lossless check refer to it.")
    load_drafter = DrafterLoader(target, drafter_paths or {}, drafter_dtype, local_files_only)
    methods = [prepare_method(label, load_drafter, target, tokenizer) for label in method_labels]
    generation = {"max_new_tokens": max_new_tokens, **sampling_kwargs(temperature)}
    runs = measure(target, prompt_sets, methods, generation, seed, progress)
    greedy = temperature <= 0
    rows = result_rows(runs, methods, target, prompt_sets, greedy)
    return {
        "environment": describe_environment(target),
        "settings": {
            **(settings or {}),
            "mode": describe_mode(temperature),
            "methods": method_labels,
            "prompt_sets": {name: len(prompts) for name, prompts in prompt_sets.items()},
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "seed": seed,
            "drafter_dtype": str(drafter_dtype or target.dtype).removeprefix("torch."),
            "protocol": "one warm-up generate per method; methods interleaved per prompt in rotating order; "
            "tokens/s and speed-up are medians over prompts; round statistics pool all rounds of a set",
        },
        "results": rows,
        "first_call_seconds": {method.label: method.first_call_seconds for method in methods},
        "greedy_mismatches": sum(row["greedy_mismatches"] for row in rows) if greedy else None,
    }


# ------------------------------------------------------------------ reporting


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def format_number(value: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def format_split(row: dict) -> str:
    """'0.12 / 0.88 s (12% draft)': where a drafter method spends its rounds."""
    if row["draft_seconds"] is None:
        return "–"
    seconds = f"{row['draft_seconds']:.2f} / {row['verify_seconds']:.2f} s"
    return seconds if row["draft_share"] is None else f"{seconds} ({100 * row['draft_share']:.0f}% draft)"


def markdown_row(row: dict) -> str:
    acceptance = list(row["acceptance_per_position"] or [])
    while acceptance and acceptance[-1] is None:  # sent, but no round got that far
        acceptance.pop()
    cells = [
        row["prompt_set"],
        row["method"] + (f" ({row['scheduler']})" if row.get("scheduler") else ""),
        format_number(row["tau"]),
        " ".join(format_number(a) for a in acceptance) if acceptance else "–",
        format_number(row["verify_rate"]),
        format_number(row["tokens_per_second"], 1),
        format_number(row["speedup"], 2, "×"),
        format_split(row),
    ]
    return "| " + " | ".join(cells) + " |"


def render_markdown(report: dict) -> str:
    environment, settings = report["environment"], report["settings"]
    header = (
        "| prompt set | method | tau | acceptance @1..k | verify rate | tok/s (median) "
        "| speed-up (median) | draft / verify |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [
        f"# dspark bench — {environment['hardware']}",
        "",
        f"{environment['processor']}, {plural(environment['cpu_count'], 'CPU')}, "
        f"{plural(environment['torch_threads'], 'torch thread')}; "
        f"{environment['device']}, {environment['dtype']}; torch {environment['torch']}, "
        f"transformers {environment['transformers']}. {settings['max_new_tokens']} new tokens, "
        "prompts per set: " + ", ".join(f"{name} {count}" for name, count in settings["prompt_sets"].items()) + ".",
        "",
        f"## {settings['mode']} — {environment['hardware']}",
        "",
        header,
        *(markdown_row(row) for row in report["results"]),
    ]
    compiled = [row for row in report["results"] if row.get("speedup_vs_compiled") is not None]
    if compiled:
        lines += ["", "Speed-up against plain-compiled (median): " + ", ".join(
            f"{row['prompt_set']} {row['method']} {format_number(row['speedup_vs_compiled'], 2, '×')}" for row in compiled
        ) + ". First calls, which compile: " + ", ".join(
            f"{label} {seconds:.1f} s" for label, seconds in report["first_call_seconds"].items()
            if label.endswith("-compiled")) + "."]
    if report["greedy_mismatches"] is not None:
        verdict = "identical to plain" if report["greedy_mismatches"] == 0 else "NOT identical to plain"
        lines += ["", f"Greedy outputs {verdict}: {report['greedy_mismatches']} mismatching prompt(s)."]
    if report["greedy_mismatches"]:
        lines += ["", *divergence_lines(report["results"], environment["dtype"])]
    return "\n".join(lines) + "\n"


def divergence_lines(rows: list[dict], dtype: str) -> list[str]:
    """The table of outputs that left plain decoding, and what that means in this dtype."""
    listed = [(row, found) for row in rows for found in row["divergences"] or []]
    most = max(found["steps"] for _, found in listed)
    if dtype == "float32":
        meaning = "In float32 this is a failure: the output must equal plain decoding token for token."
    else:
        meaning = (
            f"In {dtype}, verifying several tokens in one batch rounds differently from one at a time, so a near-tie "
            "can flip, as in transformers' own assisted decoding. At each first difference the plain run's top two "
            f"logits were within {most:.2f} bf16 steps of each other (a step is the bf16 spacing at the top logit)."
        )
    return [
        "| prompt set | method | prompt | first different token | plain token / this token | plain's top-2 margin "
        "| bf16 steps |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {row['prompt_set']} | {row['method']} | {found['prompt']} | {found['index']} | "
            f"{found['plain_token']} / {'end' if found['token'] is None else found['token']} | "
            f"{found['margin']:.4g} | {found['steps']:.2f} |"
            for row, found in listed
        ),
        "",
        meaning,
    ]


def write_report(report: dict, json_path: str | os.PathLike, markdown_path: Optional[str | os.PathLike] = None) -> str:
    """Write the JSON (and markdown) files; returns the markdown text."""
    markdown = render_markdown(report)
    for path, text in ((json_path, json.dumps(report, indent=2) + "\n"), (markdown_path, markdown)):
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text, encoding="utf-8")
    return markdown


# ------------------------------------------------------------------ command line


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument(
        "--prompts", nargs="+", required=True,
        help=f"prompt sets, one per file: shipped names ({', '.join(shipped_prompt_sets())}) or jsonl files of "
        '{"turns": [...]}',
    )
    parser.add_argument("--limit", type=positive_int, default=None, help="prompts per set; unset: all")
    add_sampling_arguments(parser, threshold_help="also run dspark@THRESHOLD")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated: {METHOD_HELP}")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the first prompt (+1 per prompt)")
    parser.add_argument("--json", default=None, help="also write the full report here")
    parser.add_argument("--markdown", default=None, help="also write the tables here")
    parser.set_defaults(func=run)


def read_prompt_sets(names_or_paths: Sequence[str], limit: Optional[int]) -> dict[str, list[str]]:
    """The prompts of each set, named by its file's stem."""
    sets: dict[str, list[str]] = {}
    for name_or_path in names_or_paths:
        name = prompt_file(name_or_path).stem
        if name in sets:
            raise InputError(f"two prompt files are named {name!r}; each set needs its own name.")
        sets[name] = read_prompts([name_or_path], limit=limit)
    return sets


def run(args) -> None:
    try:
        labels = parse_methods(args.methods, args.threshold)
    except ValueError as error:
        raise InputError(f"--methods: {error}") from None
    default_pair = args.target == DEFAULT_TARGET
    drafter_paths = {
        "dspark": args.drafter or (shipped_drafter_path() if default_pair else None),
        "dflash": dflash_drafter_path() if default_pair else None,
    }
    check_drafters(labels, drafter_paths)
    prompt_sets = read_prompt_sets(args.prompts, args.limit)  # bad input fails before any model loads
    target, tokenizer = load_target_from_args(args)
    report = benchmark(
        target,
        {name: [render_prompt(tokenizer, p) for p in prompts] for name, prompts in prompt_sets.items()},
        labels,
        drafter_paths=drafter_paths,
        tokenizer=tokenizer,
        drafter_dtype=fast_drafter_dtype(target),
        local_files_only=args.local_files_only,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        settings={
            "target": args.target,
            "drafter": str(drafter_paths["dspark"]) if drafter_paths["dspark"] else None,
            "dflash_drafter": str(drafter_paths["dflash"]) if drafter_paths["dflash"] else None,
            "prompt_files": [str(prompt_file(name)) for name in args.prompts],
            "limit": args.limit,
        },
    )
    print(write_report(report, args.json, args.markdown))
    if report["greedy_mismatches"] and target.dtype == torch.float32:
        mismatches = report["greedy_mismatches"]
        sys.exit(f"[dspark bench] {mismatches} greedy output(s) differ from plain decoding; see the report.")
