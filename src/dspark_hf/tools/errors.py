"""The errors the tools report as one line (and a traceback only with `--debug`)."""

from __future__ import annotations

from ..core.config import CheckpointError


class InputError(ValueError):
    """A file or value given by the user that cannot be used; the message names it, the field, the value and the fix."""


# What a user can fix from the message alone; anything else is a bug and keeps its traceback.
USER_ERRORS = (CheckpointError, InputError, FileNotFoundError)
