"""Facts about this machine that the cost tables and the tools both key on: where dspark_hf keeps what it
measures or converts, and the CPU's name. Standard library only."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CACHE_ENV_VAR = "DSPARK_HF_CACHE"


def cache_root() -> Path:
    """Where dspark_hf keeps what it measures or converts: `$DSPARK_HF_CACHE`, else `~/.cache/dspark_hf`."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "dspark_hf"


def cpu_model() -> str:
    """The CPU's marketing name where Linux tells it; platform.processor() is often empty."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"
