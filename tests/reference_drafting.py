"""An independent greedy drafting loop: what every round of `generate(assistant_model=drafter)` must be.

It shares no cache or generation code with dspark_hf. Each round it recomputes the
target's hidden states for every committed token in one fresh forward pass, at their
positions among the real (unpadded) tokens; drafts a block with the drafter's modules
and its own left-to-right loop; cuts it by its own reading of the scheduler rules; and
accepts against the plain greedy continuation, which the real run must reproduce.
Only the cost-aware walk and the drafting gate, pure functions tested by hand in
test_scheduler.py, are taken from the library.
"""

from __future__ import annotations

import pytest
import torch

from dspark_hf.core.scheduling import DraftingGate, cost_aware_length


@torch.no_grad()
def reference_block(drafter, sequence: torch.Tensor, mask: torch.Tensor):
    """(draft ids, raw confidences or None) for the block anchored at the last token of `sequence` [1, n]."""
    real = mask[0].bool()
    features = drafter.target(sequence[:, :-1], attention_mask=mask[:, :-1], output_hidden_states=True)
    layers = [features.hidden_states[i][:, real[:-1]] for i in drafter.config.hidden_state_indices]
    context_length = int(real[:-1].sum())
    context_positions = torch.arange(context_length)
    kv = drafter.context_kv(layers, context_positions[None])
    anchor = int(sequence[0, -1])
    block = torch.full((1, drafter.config.block_size), drafter.config.mask_token_id)
    block[0, 0] = anchor
    positions = torch.arange(context_length, context_length + drafter.config.block_size)[None]
    hidden = drafter.backbone(block, positions, kv, context_positions, single_block=True)[0]
    hidden = hidden[drafter.config.first_draft_index :]
    base = drafter.draft_logits(hidden).float()
    vocabulary = drafter.draft_token_ids()
    previous, state, tokens, confidences = anchor, None, [], []
    for k in range(hidden.shape[0]):
        bias, confidence, state = drafter.head_step(hidden[k : k + 1], torch.tensor([previous]), state)
        logits = base[k] if bias is None else base[k] + bias[0].float()
        index = int(logits.argmax())
        previous = index if vocabulary is None else int(vocabulary[index])
        tokens.append(previous)
        if confidence is not None:
            confidences.append(float(torch.sigmoid(confidence.float())))
    return tokens, (confidences or None)


def reference_rounds(
    target, drafter, prompt, expected, attention_mask=None, threshold=0.0, cap=None, costs=None, timings=None
):
    """Every round generate() must make, as dicts of RoundRecord fields, given the plain greedy output `expected`.

    With `costs` (the cost scheduler), `timings` are the seconds each real round took: the
    drafting gate prices rounds by the clock, so it is fed the same numbers."""
    mask = attention_mask if attention_mask is not None else torch.ones_like(prompt)
    cap = drafter.config.num_draft_tokens if cap is None else cap
    gate = DraftingGate(costs) if costs is not None else None
    full = expected[0].tolist()
    length = len(full)
    sequence = list(full[: prompt.shape[1] + 1])  # the prefill's token comes before any round
    rounds = []
    while len(sequence) < length:
        anchor_index = len(sequence) - 1
        budget = min(cap, length - len(sequence) - 1)
        tokens, confidences, verified = [], None, 0
        if budget > 0 and (gate is None or gate.should_draft()):
            current = torch.tensor([sequence])
            current_mask = torch.cat((mask, torch.ones(1, len(sequence) - mask.shape[1], dtype=mask.dtype)), dim=1)
            tokens, confidences = reference_block(drafter, current, current_mask)
            scheduled = confidences
            if confidences is not None and drafter.calibration is not None:
                scheduled = drafter.calibration.apply(torch.tensor(confidences)).tolist()
            verified = min(budget, len(tokens))
            if scheduled is not None and threshold > 0:
                verified = next((k for k, c in enumerate(scheduled[:verified]) if c < threshold), verified)
            if gate is not None and scheduled is not None:
                verified = cost_aware_length(torch.tensor(scheduled), gate.costs, verified)
        truth = full[anchor_index + 1 :]
        accepted = 0
        while accepted < verified and tokens[accepted] == truth[accepted]:
            accepted += 1
        committed = truth[: accepted + 1]
        rounds.append(
            dict(position=anchor_index, draft_ids=tokens, confidences=confidences or [], num_verified=verified,
                 num_accepted=accepted, committed_ids=committed)
        )
        if gate is not None:
            gate.record(bool(tokens), len(committed), timings[len(rounds) - 1])
        sequence += committed
    return rounds


def assert_rounds_match(trace, reference):
    assert len(trace) == len(reference), f"{len(trace)} rounds, the reference makes {len(reference)}"
    for number, (record, expected) in enumerate(zip(trace, reference)):
        got = dict(position=record.position, draft_ids=record.draft_ids, num_verified=record.num_verified,
                   num_accepted=record.num_accepted, committed_ids=record.committed_ids)
        want = {key: value for key, value in expected.items() if key != "confidences"}
        assert got == want, f"round {number}"
        assert record.confidences == pytest.approx(expected["confidences"], abs=1e-4), f"round {number}"
