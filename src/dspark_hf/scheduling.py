"""Which prefix of a draft block is worth sending to the target.

A schedule may depend on c_1..c_k (computed from x_{<k}) when it decides about
x_k, never on x_k itself or later tokens; otherwise the output distribution shifts
(the paper's Appendix A). Cutting at the first low confidence obeys that rule.
"""

from __future__ import annotations

from typing import Optional

import torch

# Verify the whole block unless told otherwise: it maximises tau, it is the paper's
# "scheduler off" setting, and on a GPU verifying 8 tokens costs about as much as 1.
DEFAULT_CONFIDENCE_THRESHOLD = 0.0


def threshold_length(confidences: Optional[torch.Tensor], threshold: float, num_drafted: int, cap: int) -> int:
    """Number of leading draft tokens to verify: stop before the first c_k < threshold, at most `cap`."""
    limit = max(0, min(num_drafted, cap))
    if confidences is None or threshold <= 0:
        return limit
    below = (confidences[:limit] < threshold).nonzero()
    return int(below[0]) if len(below) else limit
