"""The target's LM head on a few rows at once, in the orientation this machine multiplies faster.

A verify pass scores 2-16 positions against the whole vocabulary: [rows, hidden] x [hidden, vocab].
Some BLAS builds run that product far slower than the same numbers taken as
[vocab, hidden] x [hidden, rows]: MKL in fp32 on an AVX2-only EPYC spends 50 ms on 8 rows of
SmolLM2's 49,152-word head against 27 ms the other way round (one thread; one row, 12 ms, is a
matrix-vector product either way). So `attach_to_target` times both once per head shape, dtype and
thread count, and where the column orientation clearly wins, the head takes it for 2-16 rows. One row
(plain decoding) and prefills keep the usual product; the logits are the same dot products, summed
in another order, so fp32 output still equals plain decoding's wherever it did before.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

FEW_ROWS = (2, 16)  # rows, inclusive
MIN_WEIGHTS = 1 << 22  # smaller heads stay in cache, where both orientations cost the same
CLEAR_WIN = 0.8  # the column product must take at most this share of the usual one's time
_column_wins: dict[tuple, bool] = {}  # (shape, dtype, threads) -> measured answer, for this process


def column_product(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(hidden, weight, bias)` computed as weight @ hidden^T."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    logits = (weight @ rows.T).T.reshape(*hidden.shape[:-1], weight.shape[0])
    return logits if bias is None else logits + bias


def columns_win(weight: torch.Tensor, rows: int = 8, repeats: int = 3) -> bool:
    """Whether the column product of `rows` rows clearly beats F.linear on this CPU (timed once per process)."""
    key = (tuple(weight.shape), weight.dtype, torch.get_num_threads())
    if key not in _column_wins:
        hidden = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
        best = {"usual": float("inf"), "column": float("inf")}
        with torch.no_grad():
            for attempt in range(repeats + 1):  # the first attempt warms both up
                for name, product in (("usual", F.linear), ("column", column_product)):
                    started = time.perf_counter()
                    product(hidden, weight, None)
                    if attempt:
                        best[name] = min(best[name], time.perf_counter() - started)
        _column_wins[key] = best["column"] < CLEAR_WIN * best["usual"]
    return _column_wins[key]


def speed_up_few_rows(head: nn.Module) -> None:
    """Let a CPU fp32 `nn.Linear` head take the column product for 2-16 rows where that measures faster."""
    weight = getattr(head, "weight", None)
    if (
        type(head) is not nn.Linear
        or "forward" in vars(head)  # already replaced (by us, or by an offloading hook)
        or weight.device.type != "cpu"
        or weight.dtype != torch.float32  # bf16 goes through oneDNN, which handles few rows well
        or weight.numel() < MIN_WEIGHTS
        or not columns_win(weight)
    ):
        return

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if FEW_ROWS[0] <= hidden.numel() // hidden.shape[-1] <= FEW_ROWS[1]:
            return column_product(hidden, head.weight, head.bias)
        return F.linear(hidden, head.weight, head.bias)

    forward.column_rows = FEW_ROWS
    head.forward = forward


def column_rows(head: nn.Module) -> tuple[int, int] | None:
    """The row counts `head` takes the column product for, or None where it computes as usual."""
    return getattr(vars(head).get("forward"), "column_rows", None)
