"""Where a run leaves plain greedy decoding, and how close plain decoding's own choice was there.

In bf16 a verify pass over several tokens rounds differently from one-token decoding, so a
speculative run can take the other side of a near-tie. A divergence is told plainly: the first
differing token and the plain run's top-2 logit margin there, also counted in bf16 steps of its
top logit (the spacing of bf16 numbers at that value). In float32 any divergence is a bug.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import torch

BF16_MANTISSA_BITS = 7


def first_difference(left: Sequence[int], right: Sequence[int]) -> Optional[int]:
    """Index of the first token that differs (the shorter length if one is a prefix); None if identical."""
    for index, (a, b) in enumerate(zip(left, right)):
        if a != b:
            return index
    return None if len(left) == len(right) else min(len(left), len(right))


def ulp_bf16(value: float) -> float:
    """The gap between bf16 numbers at `value`: 2**(floor(log2|value|) - 7)."""
    exponent = math.frexp(abs(value) or torch.finfo(torch.bfloat16).tiny)[1] - 1  # floor(log2|value|)
    return 2.0 ** (exponent - BF16_MANTISSA_BITS)


def bf16_steps(margin: float, logit: float) -> float:
    """A logit margin in bf16 steps of `logit` (the larger of the two logits)."""
    return margin / ulp_bf16(logit)


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first token where a run left plain decoding, and plain decoding's margin there."""

    index: int  # position among the new tokens
    plain_token: int
    token: Optional[int]  # the other run's token there (None: it had stopped)
    margin: float  # the plain run's logit of its token minus the best other logit (its top-2 margin)
    steps: float  # `margin` in bf16 steps of the plain token's logit

    @classmethod
    def from_logits(cls, index: int, plain: Sequence[int], other: Sequence[int], logits: torch.Tensor) -> "Divergence":
        """From the plain run's logits at step `index` (one vocabulary row)."""
        values = logits.detach().float().flatten()
        plain_token = plain[index]
        chosen = values[plain_token].item()
        runner_up = torch.cat([values[:plain_token], values[plain_token + 1 :]]).max().item()
        return cls(
            index=index,
            plain_token=plain_token,
            token=other[index] if index < len(other) else None,
            margin=chosen - runner_up,
            steps=bf16_steps(chosen - runner_up, chosen),
        )


def find_divergence(
    target, prompt_ids: Sequence[int], plain: Sequence[int], other: Sequence[int]
) -> Optional[Divergence]:
    """None when `other` equals the greedy `plain` output; else the Divergence, with plain decoding replayed.

    The replay is plain greedy generate() again, up to the first difference, with its logits kept. Greedy
    decoding is deterministic, so these are the timed plain run's own logits, while that run stayed
    untouched by the cost of returning them.
    """
    index = first_difference(plain, other)
    if index is None:
        return None
    ids = torch.tensor([list(prompt_ids)], device=target.device)
    replay = target.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=index + 1,
        output_logits=True, return_dict_in_generate=True,
    )
    return Divergence.from_logits(index, plain, other, replay.logits[index][0])
