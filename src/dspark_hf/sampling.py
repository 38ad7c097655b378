"""How a draft token is chosen, and what distribution q it was drawn from.

Lossless speculative sampling needs q to be *exactly* the distribution each draft
token was sampled from. The drafter therefore pushes its logits (base logits plus
the Markov bias) through the same logits processors the target uses -- temperature,
top-k, top-p, repetition penalty... -- with the same running prefix, samples from
softmax of the result, and hands that processed row back as the candidate logits.
transformers' assisted-decoding loop then accepts x_k with probability
min(1, p(x_k)/q(x_k)) and resamples a rejection from normalize(max(p - q, 0)),
where p is the processed target distribution; greedy decoding accepts while the
draft equals the target's argmax.
"""

from __future__ import annotations

from typing import Optional

import torch


class DraftTokenChooser:
    """Chooses draft tokens one at a time, keeping the prefix the logits processors see."""

    def __init__(self, prefix_ids: torch.Tensor, logits_processor=None, do_sample: bool = False):
        self.prefix_ids = prefix_ids
        self.logits_processor = logits_processor
        self.do_sample = do_sample

    def __call__(self, step: int, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Step `step`'s raw logits [V] -> (token, processed float32 logits whose softmax is q)."""
        processed = logits.float()[None]
        if self.logits_processor:
            processed = self.logits_processor(self.prefix_ids.to(processed.device), processed)
        processed = processed[0]
        if self.do_sample:
            token = int(torch.multinomial(processed.softmax(dim=-1), num_samples=1))
        else:
            token = int(processed.argmax())
        next_id = torch.tensor([[token]], dtype=self.prefix_ids.dtype, device=self.prefix_ids.device)
        self.prefix_ids = torch.cat((self.prefix_ids, next_id), dim=-1)
        return token, processed


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """0.5 * ||p - q||_1 over the last axis: 1 - TV is the chance a token drawn from q survives against p."""
    return 0.5 * (p - q).abs().sum(dim=-1)


def expected_accepted_length(survival: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Expected tokens per round, bonus included, from per-position survival chances [..., n].

    A draft token counts only if every earlier one survived, so the expectation is
    1 + sum_k prod_{i<=k} survival_i. Masked-out positions end the block.
    """
    if mask is not None:
        survival = survival * mask
    return 1 + torch.cumprod(survival, dim=-1).sum(dim=-1)
