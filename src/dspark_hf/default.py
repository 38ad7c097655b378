"""The offline default pair: SmolLM2-135M-Instruct and the DSpark drafter shipped with this package."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from .modeling import DSparkDrafter
from .smollm2 import load_smollm2

SHIPPED_DRAFTERS = {"dspark": "smollm2_dspark", "dflash": "smollm2_dflash"}


def shipped_drafter_path(kind: str = "dspark") -> Path:
    """Directory of a drafter trained for SmolLM2 and shipped inside the package ('dspark' or 'dflash')."""
    if kind not in SHIPPED_DRAFTERS:
        raise ValueError(f"kind is {kind!r}; expected one of {sorted(SHIPPED_DRAFTERS)}.")
    return Path(str(resources.files("dspark_hf") / "assets" / SHIPPED_DRAFTERS[kind]))


def load_default(dtype: torch.dtype = torch.float32, kind: str = "dspark"):
    """(target, tokenizer, drafter), offline, ready for `target.generate(..., assistant_model=drafter)`.

    fp32 is the default because bf16 matmuls are slower than fp32 on CPUs without AVX-512.
    """
    target, tokenizer = load_smollm2(dtype=dtype)
    drafter = DSparkDrafter.from_pretrained(shipped_drafter_path(kind), target)
    return target, tokenizer, drafter
