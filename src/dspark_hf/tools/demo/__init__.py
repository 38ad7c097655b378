"""Gradio demo: a DSpark answer that reads as text, with every drafting round one hover or click away.

`dspark demo` (or `python demo/app.py`) serves it on 127.0.0.1 only, with analytics off, so
nothing leaves the machine.

The answer holds the committed tokens only, coloured by origin (a DSpark draft the target
kept, an n-gram draft it kept, or the target's own token). Drafts the target rejected or the
scheduler pruned stay out of the text: they live in hover notes, in a marker at the end of
their round and in the rounds table. The target alone runs right after on the same prompt,
which checks the answer (greedy decoding matches token for token, or parts only where the
target's top two tokens were tied) and measures the speed-up.

state.py holds one run's data, worker.py the generation thread that feeds it, render.py the
HTML made from it, app.py the Gradio page and the command.
"""

from .app import (
    DEFAULT_MAX_NEW_TOKENS,
    MAX_PROMPT_TOKENS,
    DemoSession,
    add_arguments,
    build_demo,
    run,
    serve_in_background,
)
from .render import OUTPUT_LABELS
from .worker import WORKER_THREAD_NAME

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "MAX_PROMPT_TOKENS",
    "OUTPUT_LABELS",
    "WORKER_THREAD_NAME",
    "DemoSession",
    "add_arguments",
    "build_demo",
    "run",
    "serve_in_background",
]
