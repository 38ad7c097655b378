"""The tool plumbing every `dspark` command shares, written once: model and sampling options, dtype and
thread choice, loading from parsed arguments, and the timed `generate()` call."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from .errors import non_negative_float, positive_int, probability
from .targets import DEFAULT_TARGET, DTYPES, load_pair, load_target
from .targets import resolve_dtype  # noqa: F401  (the tools' dtype rule; it lives in targets for load_default)

THRESHOLD_HELP = (
    "assistant_confidence_threshold: draft tokens are verified while their calibrated confidence stays above it; "
    "unset: the drafter's generation_config"
)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where it says something: an unset option's help says what unset means instead."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


# ------------------------------------------------------------------ options
def add_model_arguments(parser, drafter: bool = True, placement: bool = True) -> None:
    """--target, --drafter, --local-files-only, --threads, and (with `placement`) --dtype, --device, --device-map."""
    parser.add_argument("--target", default=DEFAULT_TARGET, help="Hub id or directory ('smollm2': the offline default)")
    if drafter:
        parser.add_argument("--drafter", default=None,
                            help="Hub id or directory; unset: the drafter shipped for smollm2")
    parser.add_argument("--local-files-only", action="store_true", help="never reach the Hub; use its cache only")
    if placement:
        parser.add_argument(
            "--dtype", choices=["auto", *DTYPES], default="auto",
            help="the target's dtype; auto: bfloat16 on CPUs with native bf16 matmuls and on CUDA GPUs with bf16, "
            "float32 elsewhere",
        )
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--device", default=None, help="put the target on this device (cpu, cuda, cuda:1, ...)")
        where.add_argument("--device-map", default=None,
                           help="spread the target with accelerate (e.g. auto); the drafter follows its LM head")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads; unset: OMP_NUM_THREADS, else the cores not already busy")


def add_sampling_arguments(parser, max_new_tokens: int = 128, threshold_help: str = THRESHOLD_HELP) -> None:
    parser.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens,
                        help="most tokens to generate per answer")
    parser.add_argument("--temperature", type=non_negative_float, default=0.0,
                        help="0: greedy decoding; above 0: sampling at this temperature")
    parser.add_argument("--threshold", type=probability, default=None, help=threshold_help)


# ------------------------------------------------------------------ threads
def default_threads(environ, cores: int, load: float, torch_default: int) -> tuple[int, str]:
    """(threads, why) when --threads is not given; `load`: cores busy with other work right now.

    OMP_NUM_THREADS, when set, is the user's own choice. Otherwise the cores other processes leave idle,
    never more than torch's default (the physical cores). OpenMP threads that share a core with a busy process
    wait for it at every barrier (two threads ran 13x slower than one next to a busy process), while on an
    idle machine every core counts (a second thread made SmolLM2's bf16 verify 1.45x faster on a 2-core Xeon)."""
    if environ.get("OMP_NUM_THREADS", "").isdigit() and int(environ["OMP_NUM_THREADS"]) > 0:
        return int(environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS; --threads N to change"
    return min(torch_default, max(1, cores - round(load))), f"{cores} cores, load {load:.1f}; --threads N to change"


def busy_cores(seconds: float = 0.2) -> float:
    """CPUs in use now, from two /proc/stat samples; the 1-minute load average where there is no /proc/stat.

    A live sample, not the load average: that one still counts, for a minute, a job that has ended."""
    def ticks() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    try:
        total, idle = ticks()
        time.sleep(seconds)
        total_after, idle_after = ticks()
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0]
    elapsed = max(1, total_after - total)
    return (1 - (idle_after - idle) / elapsed) * (os.cpu_count() or 1)


def apply_threads(args) -> str:
    """Sets torch's CPU threads from --threads, else `default_threads`; returns how the count was chosen."""
    if args.threads:
        torch.set_num_threads(args.threads)
        return "set by --threads"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads, why = default_threads(os.environ, cores, busy_cores(), torch.get_num_threads())
    torch.set_num_threads(threads)
    return why


def announce(args, target, threads_why: str, drafter=None) -> None:
    """One stderr line: the dtype, device and threads a command runs with, and the options that change them."""
    def name(dtype):
        return str(dtype).removeprefix("torch.")

    chosen = f" (--dtype {args.dtype})" if hasattr(args, "dtype") else ""
    drafting = "" if drafter is None or drafter.dtype == target.dtype else f", drafter in {name(drafter.dtype)}"
    threads = torch.get_num_threads()
    command = " ".join(["dspark", *([args.command] if hasattr(args, "command") else [])])
    print(
        f"{command}: target in {name(target.dtype)}{chosen}{drafting} on "
        f"{target.device}, {threads} torch thread{'s' * (threads != 1)} ({threads_why})",
        file=sys.stderr,
        flush=True,
    )


# ------------------------------------------------------------------ loading
def load_keywords(args) -> dict:
    """load_target / load_pair keywords from the options (float32 for commands without --dtype)."""
    if not hasattr(args, "dtype"):
        return {"dtype": torch.float32, "local_files_only": args.local_files_only}
    return dict(
        dtype=args.dtype, device=args.device, device_map=args.device_map, local_files_only=args.local_files_only
    )


def load_target_from_args(args, tokenizer: bool = True):
    """(target, tokenizer) as the options say, after setting the threads; announced on stderr."""
    threads_why = apply_threads(args)
    target, loaded_tokenizer = load_target(args.target, tokenizer=tokenizer, **load_keywords(args))
    announce(args, target, threads_why)
    return target, loaded_tokenizer


def load_pair_from_args(args):
    """(target, tokenizer, drafter) as the options say (see `load_pair`), after setting the threads; announced."""
    threads_why = apply_threads(args)
    target, tokenizer, drafter = load_pair(args.target, args.drafter, **load_keywords(args))
    announce(args, target, threads_why, drafter)
    return target, tokenizer, drafter


# ------------------------------------------------------------------ generating
def sampling_kwargs(temperature: float) -> dict:
    return {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_generate(target, prompt_ids, **generate_kwargs) -> tuple[list[int], float]:
    """(new token ids, seconds) of one `target.generate()` on one prompt; GPU work is finished inside the timing."""
    ids = torch.tensor([list(prompt_ids)], device=target.device)
    _synchronize(target.device)
    started = time.perf_counter()
    output = target.generate(ids, attention_mask=torch.ones_like(ids), **generate_kwargs)
    _synchronize(target.device)
    seconds = time.perf_counter() - started
    return output[0, ids.shape[1]:].tolist(), seconds
