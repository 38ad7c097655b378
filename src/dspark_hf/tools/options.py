"""The tool plumbing every `dspark` command shares, written once: model and sampling options, dtype and
thread choice, loading from parsed arguments, and the timed `generate()` call."""

from __future__ import annotations

import sys

import torch

from ..core.timing import Stopwatch
from .errors import non_negative_float, positive_int, probability
from .targets import DEFAULT_TARGET, DTYPES, load_pair, load_target, set_threads

THRESHOLD_HELP = (
    "assistant_confidence_threshold: draft tokens are verified while their calibrated confidence stays above it; "
    "unset: the drafter's generation_config"
)


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


def add_compile_argument(parser) -> None:
    parser.add_argument("--compile", action="store_true",
                        help="compile the target as transformers does (static cache under torch.compile): on an "
                        "AVX512-BF16 EPYC plain decoding ran 0.98-1.11x and DSpark 1.2x faster; the first call "
                        "compiles (12-50 s on an idle CPU), before any timing")


# ------------------------------------------------------------------ threads
def apply_threads(args) -> str:
    """Sets torch's CPU threads from --threads, else as `load_default` chooses them; returns how they were chosen."""
    return set_threads(args.threads)


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
def compiled_target_kwargs() -> dict:
    """generate() fields that compile the target as transformers offers it: a static cache, and the forward under
    torch.compile, on any device (transformers compiles on GPUs only unless told). A verify length seen for the
    first time compiles once more."""
    from transformers import CompileConfig

    compile_config = CompileConfig()
    compile_config._compile_all_devices = True  # transformers' own switch for compiling off a GPU
    return {"cache_implementation": "static", "compile_config": compile_config}


def compile_before_the_clock(target, prompt_ids, who: str, **generate_kwargs) -> float:
    """One untimed generate() with the compiled target, so the lengths a timed call verifies are compiled already."""
    print(f"[{who}] compiling the target (--compile: once per process, 15-50 s on an idle CPU) ...", file=sys.stderr,
          flush=True)
    seconds = timed_generate(target, prompt_ids, **generate_kwargs)[1]
    print(f"[{who}] compiled in {seconds:.1f} s; not counted in any time below", file=sys.stderr, flush=True)
    return seconds


def sampling_kwargs(temperature: float) -> dict:
    return {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}


def timed_generate(target, prompt_ids, **generate_kwargs) -> tuple[list[int], float]:
    """(new token ids, seconds) of one `target.generate()` on one prompt; GPU work is finished inside the timing."""
    ids = torch.tensor([list(prompt_ids)], device=target.device)
    clock = Stopwatch(target.device)
    started = clock.mark()
    output = target.generate(ids, attention_mask=torch.ones_like(ids), **generate_kwargs)
    seconds = clock.seconds(started, clock.mark())
    return output[0, ids.shape[1]:].tolist(), seconds
