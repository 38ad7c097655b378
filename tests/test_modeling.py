"""The drafter's attention masks, worked out by hand: context before the anchor, windows, in-block causality."""

from __future__ import annotations

import torch

from dspark_hf.core.modeling import block_attention_mask


def test_blocks_see_context_before_their_anchor_and_their_own_block():
    mask = block_attention_mask(torch.tensor([2, 4]), 2, torch.arange(5))[0, 0]
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 1, 1],
            [1, 1, 1, 1, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def test_sliding_window_counts_back_from_the_anchor_and_causal_blocks():
    # anchor 5, window 3: context positions 2, 3, 4 for every slot; slots see themselves and earlier slots
    mask = block_attention_mask(torch.tensor([5]), 3, torch.arange(6), window=3, causal=True)[0, 0]
    expected = torch.tensor(
        [
            [0, 0, 1, 1, 1, 0, 1, 0, 0],
            [0, 0, 1, 1, 1, 0, 1, 1, 0],
            [0, 0, 1, 1, 1, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    # context positions need not start at 0 or be the sequence's own (left padding removed, say)
    shifted = block_attention_mask(torch.tensor([5]), 3, torch.arange(1, 6), window=3)[0, 0]
    assert shifted[:, :5].tolist() == [[False, True, True, True, False]] * 3 and shifted[:, 5:].all()
