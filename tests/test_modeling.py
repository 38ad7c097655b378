"""The drafter's attention masks, worked out by hand: context before the anchor, windows, in-block causality;
and drafting over the static context cache, against the independent reference loop."""

from __future__ import annotations

import pytest
import torch

from conftest import MASK_ID, VOCAB, tiny_target, write_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.core import modeling
from dspark_hf.core.modeling import ContextCache, block_attention_mask
from dspark_hf.core.sampling import DraftTokenChooser
from reference_drafting import reference_block

mask_of = block_attention_mask


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


@pytest.mark.parametrize("layout", ["exact-span", "whole-storage"])
def test_drafting_over_the_cache_equals_the_reference_and_shares_one_mask_per_window(layout, tmp_path, monkeypatch):
    """Sliding, full and sliding layers: the block's keys/values written into the cache's free slots give the
    independent reference loop's block. "whole-storage" is the layout compiled passes use (attention over
    all the storage, masked), run eagerly here. One mask per window size, built once per round."""
    target = tiny_target("qwen3")
    path = write_deepspec(target, tmp_path / "d", num_hidden_layers=3, sliding_window=6,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    drafter = DSparkDrafter.from_pretrained(path, target)
    if layout == "whole-storage":
        drafter.compiled_pass = drafter.draft_pass
    built = []
    monkeypatch.setattr(modeling, "block_attention_mask", lambda *args: built.append(args) or mask_of(*args))
    sequence = torch.randint(0, MASK_ID, (1, 40), generator=torch.Generator().manual_seed(0))
    cache, length = ContextCache(64), 0
    for end in (12, 13, 20, 29):
        hidden = target(sequence[:, :end], output_hidden_states=True).hidden_states
        layers = [hidden[i][:, length:end] for i in drafter.config.hidden_state_indices]
        cache.append(drafter.context_kv(layers, torch.arange(length, end)[None]))
        length, built = end, []
        chooser = DraftTokenChooser(sequence[:, : end + 1], None, False, VOCAB, drafter.draft_token_ids())
        block = drafter.draft(sequence[0, end : end + 1], end, cache, chooser)
        assert len(built) == (2 if layout == "whole-storage" else 1)  # the full-attention mask only when masked
        tokens, confidences = reference_block(drafter, sequence[:, : end + 1], torch.ones(1, end + 1))
        assert block.draft_ids.tolist() == tokens
        torch.testing.assert_close(block.confidences, torch.tensor(confidences), atol=1e-5, rtol=0)
