"""How a draft token is chosen, and what distribution q it was drawn from.

Lossless speculative sampling needs q to be *exactly* the distribution each draft
token was sampled from. The drafter therefore pushes its logits (base logits plus
the Markov bias) through the same logits processors the target uses -- temperature,
top-k, top-p, repetition penalty... -- with the same running prefix, samples from
softmax of the result, and hands that processed row back as the candidate logits.
transformers' assisted-decoding loop then accepts x_k with probability
min(1, p(x_k)/q(x_k)) and resamples a rejection from normalize(max(p - q, 0)),
where p is the processed target distribution; greedy decoding accepts while the
draft equals the target's argmax, and needs no q at all.

A pruned draft vocabulary keeps this exact. Its logits are placed in a full-vocabulary
row that is -inf elsewhere, so q is a distribution over the target's vocabulary that
is zero outside the draft vocabulary. Such tokens are never proposed, so p/q is only
ever read where q > 0; a rejection resamples from max(p - q, 0), which keeps all of
p's mass outside the draft vocabulary. Summed over both paths, each token is output
with probability exactly p(x), whatever q is, as long as q is the law x_k was drawn from.
"""

from __future__ import annotations

from typing import Optional

import torch


class DraftTokenChooser:
    """Chooses draft tokens one at a time, keeping the prefix the logits processors see and each q.

    `draft_token_ids` maps indices of a pruned draft vocabulary to target ids (None: no pruning).
    q is kept when sampling, or when `keep_q` asks for it (greedy ensemble verification).
    """

    def __init__(
        self,
        prefix_ids: torch.Tensor,
        logits_processor=None,
        do_sample: bool = False,
        vocab_size: Optional[int] = None,
        draft_token_ids: Optional[torch.Tensor] = None,
        keep_q: bool = False,
    ):
        self.prefix_ids = prefix_ids
        self.logits_processor = logits_processor if logits_processor else None
        self.do_sample = do_sample
        self.keep_q = keep_q or do_sample
        self.vocab_size = vocab_size
        self.draft_token_ids = draft_token_ids
        self.q_rows: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor) -> int:
        """Raw logits over the scored vocabulary -> the chosen target token id."""
        if not self.keep_q and self.logits_processor is None:
            index = int(logits.argmax())  # plain greedy: no processors, no prefix, no q
            return index if self.draft_token_ids is None else int(self.draft_token_ids[index])
        processed = self.full_vocabulary(logits.float())[None]
        if self.logits_processor is not None:
            processed = self.logits_processor(self.prefix_ids.to(processed.device), processed)
        processed = processed[0]
        if self.do_sample:
            token = int(torch.multinomial(processed.softmax(dim=-1), num_samples=1))
        else:
            token = int(processed.argmax())
        if self.keep_q:
            self.q_rows.append(processed)
        next_id = torch.tensor([[token]], dtype=self.prefix_ids.dtype, device=self.prefix_ids.device)
        self.prefix_ids = torch.cat((self.prefix_ids, next_id), dim=-1)
        return token

    def full_vocabulary(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits placed in a target-vocabulary row that is -inf elsewhere."""
        if self.draft_token_ids is None:
            return logits
        row = logits.new_full((self.vocab_size,), float("-inf"))
        row[self.draft_token_ids.to(logits.device)] = logits
        return row

    def q_logits(self) -> Optional[torch.Tensor]:
        """[n, vocab] processed logits whose softmax is the q of each draft token; None when not kept."""
        return torch.stack(self.q_rows) if self.q_rows else None


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
