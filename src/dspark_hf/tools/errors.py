"""The errors the tools report as one line (and a traceback only with `--debug`)."""

from __future__ import annotations

import argparse

from ..core.config import CheckpointError


class InputError(ValueError):
    """A file or value given by the user that cannot be used; the message names it, the field, the value and the fix."""


# What a user can fix from the message alone; anything else is a bug and keeps its traceback.
USER_ERRORS = (CheckpointError, InputError, FileNotFoundError)


# argparse types: a bad value is one line naming the option ("--x must be ..., got ..."), before any model loads.
def checked(text: str, kind, words: str, holds) -> int | float:
    """`text` read as a `kind` for which `holds(value)`; else the plain words of what it must be."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not holds(value):
        raise argparse.ArgumentTypeError(f"must be {words}, got {text}")
    return value


def probability(text: str) -> float:
    """argparse type for confidence thresholds."""
    return checked(text, float, "a number in [0, 1]", lambda value: 0.0 <= value <= 1.0)


def positive_int(text: str) -> int:
    return checked(text, int, "a positive integer", lambda value: value >= 1)


def port_number(text: str) -> int:
    return checked(text, int, "a TCP port (1-65535)", lambda value: 1 <= value <= 65535)


def non_negative_float(text: str) -> float:
    return checked(text, float, "a number >= 0", lambda value: value >= 0.0)


def non_empty(text: str) -> str:
    """argparse type for a prompt: an empty one is refused, as the demo refuses it."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty: give the message to answer")
    return text
