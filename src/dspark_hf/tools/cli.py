"""`dspark`: the console command (generate, train, regenerate, synthesize, export, bench, calibrate, demo).

A bad input ends with one line naming what is wrong and how to fix it, and a non-zero
exit; `dspark --debug ...` shows the traceback instead. `dspark --help` answers before
torch loads: a command's module is imported only when that command is on the command line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys

from .errors import USER_ERRORS, non_empty


# ------------------------------------------------------------------ generate
def add_generate_arguments(parser) -> None:
    from .options import add_compile_argument, add_model_arguments, add_sampling_arguments

    add_model_arguments(parser)
    parser.add_argument("--prompt", type=non_empty, default="Write a Python function that reverses a string. Reply with the code only.",
                        help="the user message, put in the target's chat template")
    add_sampling_arguments(parser)
    add_compile_argument(parser)
    parser.set_defaults(func=generate)


def generate(args) -> None:
    from transformers import TextStreamer

    from ..core.costs import profile_costs
    from ..core.trace import summarize
    from .options import (compile_before_the_clock, compiled_target_kwargs, load_pair_from_args, sampling_kwargs,
                          timed_generate)
    from .prompts import render_prompt

    target, tokenizer, drafter = load_pair_from_args(args)
    prompt_ids = render_prompt(tokenizer, args.prompt)
    settings = {
        "max_new_tokens": args.max_new_tokens,
        "assistant_model": drafter,
        **({} if args.threshold is None else {"assistant_confidence_threshold": args.threshold}),
        **(compiled_target_kwargs() if args.compile else {}),
        **sampling_kwargs(args.temperature),
    }
    profile_costs(drafter)  # measured (once per machine) before the clock starts, so tok/s is generation alone
    if args.compile:
        compile_before_the_clock(target, prompt_ids, "dspark", **settings)
    tokens, seconds = timed_generate(
        target, prompt_ids, streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True), **settings)
    summary = summarize(drafter.last_trace)
    new_tokens = len(tokens)
    print(
        f"\n[dspark] {new_tokens} tokens in {seconds:.2f} s ({new_tokens / seconds:.1f} tok/s), "
        f"{summary.rounds} rounds, tau {summary.tau:.2f}, verify rate {summary.verify_rate:.2f}, "
        f"draft {summary.draft_seconds:.2f} s / verify {summary.verify_seconds:.2f} s",
        file=sys.stderr,
    )


# ------------------------------------------------------------------ export
def add_export_arguments(parser) -> None:
    from ..formats.loader import WRITABLE
    from .options import add_model_arguments

    parser.add_argument("src", help="drafter: Hub id or directory, any supported layout")
    parser.add_argument("out", help="output directory")
    parser.add_argument("--format", choices=WRITABLE, default="deepspec", help="the layout to write")
    add_model_arguments(parser, drafter=False, placement=False)
    parser.set_defaults(func=export)


def export(args) -> None:
    from ..formats.loader import DSparkDrafter
    from .options import load_target_from_args

    target, _ = load_target_from_args(args, tokenizer=False)  # float32: the drafter is written as it is stored
    drafter = DSparkDrafter.from_pretrained(args.src, target, local_files_only=args.local_files_only)
    drafter.save_pretrained(args.out, format=args.format)
    print(json.dumps({"src": str(args.src), "out": str(args.out), "format": args.format}))


# ------------------------------------------------------------------ the parser
# Each command: its one line of help, and what adds its options -- a function here, or a module's add_arguments.
COMMANDS = {
    "generate": ("answer one prompt with a drafter and print the round statistics", add_generate_arguments),
    "train": ("train a DSpark or DFlash drafter for a target (also under accelerate launch)", ".training.trainer"),
    "regenerate": ("write the target's own answers to prompts as shards, for training (resumable)",
                   ".training.regenerate"),
    "synthesize": ("let the target write its own user prompts (Magpie-style), for training", ".training.synthesize"),
    "export": ("write a drafter in another checkpoint layout", add_export_arguments),
    "bench": ("tau and tokens/s against the baselines", ".bench"),
    "calibrate": ("fit STS confidence temperatures (and re-profile the cost table)", ".calibrate"),
    "demo": ("Gradio demo: watch every drafting round", ".demo"),
}
TYPE_WORDS = {"int": "an integer", "float": "a number"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where it says something: an unset option's help says what unset means instead."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """A bad command line is one line in plain words (`--help` shows the usage), not argparse's usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {plain_words(message)}\n")


def plain_words(message: str) -> str:
    """'argument --x: invalid int value: 'y'' -> '--x must be an integer, got 'y''; the other messages alike."""
    message = re.sub(r"^argument ([^:]+): ", r"\1 ", message)
    message = re.sub(r"invalid (\w+) value: (.*)", lambda m: f"must be {TYPE_WORDS.get(m[1], m[1])}, got {m[2]}", message)
    message = re.sub(r"invalid choice: (.*) \(choose from (.*)\)", r"must be one of \2; got \1", message)
    return message.replace("expected one argument", "needs a value").replace("not allowed with argument", "cannot go with")


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The `dspark` parser. Only the `commands` named get their options (None: all), so only their modules load."""
    parser = Parser(prog="dspark", description="DSpark speculative decoding for transformers")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    subparsers = parser.add_subparsers(dest="command", metavar="command", required=True, parser_class=Parser)
    for name, (summary, options) in COMMANDS.items():
        command = subparsers.add_parser(name, help=summary, description=summary, formatter_class=HelpFormatter)
        if commands is None or name in commands:
            add = options if callable(options) else importlib.import_module(options, __package__).add_arguments
            add(command)
    return parser


def error_line(error: Exception) -> str:
    """A user error in command-line terms."""
    from ..formats.loader import HubFetchError

    if isinstance(error, HubFetchError):
        return error.message(offline_switch="--local-files-only")
    return str(error) if not isinstance(error, FileNotFoundError) else f"{error.filename}: no such file."


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((word for word in argv if not word.startswith("-")), None)  # --debug, the one option, takes no value
    args = build_parser([chosen]).parse_args(argv)
    try:
        args.func(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        sys.exit(f"dspark {args.command}: error: {error_line(error)}")
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"dspark {args.command}: interrupted", file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT, as shells report it


if __name__ == "__main__":
    main()
