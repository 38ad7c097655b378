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

A pruned draft vocabulary keeps this exact. q is a distribution over the target's
vocabulary that is zero outside the draft vocabulary (its logits are -inf there).
Such tokens are never proposed, so p/q is only ever read where q > 0; a rejection
resamples from max(p - q, 0), which keeps all of p's mass outside the draft
vocabulary. Summed over both paths, each token is output with probability exactly
p(x), whatever q is, as long as q is the law x_k was drawn from.

Everything here stays on the device: choosing a token never waits for it.
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

# Processors that read neither the prefix nor tokens outside the row they are given. With only these,
# a row can be processed over the pruned draft vocabulary alone (top-k keeps min(k, row width) tokens,
# the same ones it keeps in a target-vocabulary row that is -inf elsewhere), and the rows of a block
# whose tokens do not depend on one another can be processed and chosen together.
PREFIX_FREE_PROCESSORS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)


def draw(probabilities: torch.Tensor) -> torch.Tensor:
    """One token per row of [n, V] probabilities (normalised or not), without a host sync.

    The exponential race: with E_i ~ Exp(1), argmax_i p_i / E_i is i with probability
    p_i / sum(p). torch.multinomial draws the same law but first checks its input on the host.
    """
    race = torch.empty_like(probabilities).exponential_().clamp_min_(torch.finfo(probabilities.dtype).tiny)
    return (probabilities / race).argmax(dim=-1)


class DraftTokenChooser:
    """Chooses draft tokens on the device, keeping what q each was drawn from.

    With no processors, or only PREFIX_FREE_PROCESSORS, rows are processed over the scored
    vocabulary (pruned or not) and may be chosen many at once; q rows are placed in the
    target vocabulary once, when asked for. Any other processor (repetition penalty,
    no-repeat-ngram, one we do not know) reads the running prefix and the whole
    vocabulary: rows then go one at a time through a target-vocabulary row.
    `draft_token_ids` maps indices of a pruned draft vocabulary to target ids (None: no
    pruning). q is kept when sampling, or when `keep_q` asks for it (greedy ensemble verification).
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
        self.prefix_ids = prefix_ids  # the committed sequence; draft tokens are kept apart, in `chosen`
        self.logits_processor = logits_processor if logits_processor else None
        self.do_sample = do_sample
        self.keep_q = keep_q or do_sample
        self.vocab_size = vocab_size
        self.draft_token_ids = draft_token_ids
        self.prefix_free = all(type(p) in PREFIX_FREE_PROCESSORS for p in self.logits_processor or ())
        self.chosen: list[torch.Tensor] = []  # target ids chosen so far, one tensor per call
        self.q_rows: list[torch.Tensor] = []  # the processed rows they were drawn from

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Raw logits [k, scored vocabulary] -> the chosen target ids [k], on the logits' device.

        k > 1 only when `prefix_free`, for rows that do not depend on the tokens chosen before them."""
        logits = logits.float()
        if self.prefix_free:
            processed = logits
            for processor in self.logits_processor or ():
                processed = processor(None, processed)  # prefix-free: input_ids is never read
            index = self.pick(processed)
            ids = index if self.draft_token_ids is None else self.draft_token_ids.to(index.device)[index]
        else:
            processed = self.logits_processor(self.running_prefix(logits.device), self.full_vocabulary(logits))
            ids = self.pick(processed)
        if self.keep_q:
            self.q_rows.append(processed)
        self.chosen.append(ids)
        return ids

    def pick(self, processed: torch.Tensor) -> torch.Tensor:
        """Each row's argmax, or a draw from its softmax."""
        return draw(processed.softmax(dim=-1)) if self.do_sample else processed.argmax(dim=-1)

    def running_prefix(self, device: torch.device) -> torch.Tensor:
        """The committed sequence followed by the draft tokens chosen so far, as the processors read it."""
        drafted = [ids[None].to(device, self.prefix_ids.dtype) for ids in self.chosen]
        return torch.cat([self.prefix_ids.to(device), *drafted], dim=-1)

    def full_vocabulary(self, logits: torch.Tensor) -> torch.Tensor:
        """Rows over the scored vocabulary [k, scored] -> target-vocabulary rows [k, vocab], -inf elsewhere."""
        if self.draft_token_ids is None:
            return logits
        rows = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
        return rows.scatter_(1, self.draft_token_ids.to(logits.device).expand(logits.shape[0], -1), logits)

    def q_logits(self) -> Optional[torch.Tensor]:
        """[n, vocab] processed logits whose softmax is the q of each draft token; None when not kept."""
        if not self.q_rows:
            return None
        rows = torch.cat(self.q_rows)
        return self.full_vocabulary(rows) if self.prefix_free else rows

