"""The errors the tools report as one line (and a traceback only with `--debug`)."""

from __future__ import annotations

import argparse

from ..core.config import CheckpointError


class InputError(ValueError):
    """A file or value given by the user that cannot be used; the message names it, the field, the value and the fix."""


# What a user can fix from the message alone; anything else is a bug and keeps its traceback.
USER_ERRORS = (CheckpointError, InputError, FileNotFoundError)


# argparse types: a bad value is one line naming the option, before any model loads.
def probability(text: str) -> float:
    """argparse type for confidence thresholds."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value:g} is not in [0, 1]")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"{value:g} is not a number >= 0")
    return value
