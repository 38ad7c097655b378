"""The target's LM head on 2-16 rows: the column product gives F.linear's logits, is taken only where it
measured faster, and is what verify passes then really use, with output unchanged."""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from conftest import MASK_ID, tiny_target, write_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.core import lm_head
from dspark_hf.core.lm_head import column_product, column_rows, columns_win, speed_up_few_rows


def force(monkeypatch, wins: bool = True) -> list[int]:
    """Any head qualifies and the measurement says `wins`; returns the row counts each column product saw."""
    monkeypatch.setattr(lm_head, "MIN_WEIGHTS", 0)
    monkeypatch.setattr(lm_head, "columns_win", lambda weight: wins)
    seen = []

    def counted(hidden, weight, bias):
        seen.append(hidden.numel() // hidden.shape[-1])
        return column_product(hidden, weight, bias)

    monkeypatch.setattr(lm_head, "column_product", counted)
    return seen


def test_column_product_gives_the_linear_logits():
    torch.manual_seed(0)
    weight, bias = torch.randn(300, 64), torch.randn(300)
    for shape in [(8, 64), (1, 5, 64), (2, 3, 64)]:
        hidden = torch.randn(*shape)
        for b in (None, bias):
            torch.testing.assert_close(column_product(hidden, weight, b), F.linear(hidden, weight, b))


def test_the_head_takes_it_for_2_to_16_rows_only(monkeypatch):
    seen = force(monkeypatch)
    head = nn.Linear(32, 40, bias=True)
    speed_up_few_rows(head)
    assert column_rows(head) == (2, 16)
    for rows in (1, 2, 8, 16, 17, 40):
        hidden = torch.randn(1, rows, 32)
        torch.testing.assert_close(head(hidden), F.linear(hidden, head.weight, head.bias))
    assert seen == [2, 8, 16]


def test_heads_it_leaves_as_they_are(monkeypatch):
    force(monkeypatch, wins=False)
    slower = nn.Linear(32, 40)
    speed_up_few_rows(slower)
    assert column_rows(slower) is None
    force(monkeypatch)
    bf16 = nn.Linear(32, 40).to(torch.bfloat16)
    hooked = nn.Linear(32, 40)
    hooked.forward = lambda hidden: hidden  # an offloading hook's wrapper, say
    for head in (bf16, hooked, nn.Sequential(nn.Linear(32, 40))):
        speed_up_few_rows(head)
        assert column_rows(head) is None
    assert hooked.forward(torch.ones(1)).tolist() == [1.0]
    monkeypatch.undo()
    small = nn.Linear(32, 40)  # the real threshold: a head that fits in cache gains nothing
    speed_up_few_rows(small)
    assert column_rows(small) is None


def test_verify_passes_use_it_and_greedy_output_is_unchanged(monkeypatch, tmp_path):
    seen = force(monkeypatch)
    target = tiny_target("llama")
    plain_outputs = []
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, MASK_ID, (1, 3 + 5 * i), generator=generator) for i in range(5)]
    for prompt in prompts:
        plain_outputs.append(target.generate(prompt, max_new_tokens=12 + 7 * len(plain_outputs), do_sample=False))
    drafter = DSparkDrafter.from_pretrained(write_deepspec(target, tmp_path / "d"), target)  # attaches: installs
    assert column_rows(target.get_output_embeddings()) == (2, 16)
    for prompt, expected in zip(prompts, plain_outputs):
        seen.clear()
        produced = target.generate(prompt, max_new_tokens=expected.shape[1] - prompt.shape[1], do_sample=False,
                                   assistant_model=drafter)
        assert produced.tolist() == expected.tolist()
        verify_rows = Counter(record.num_verified + 1 for record in drafter.last_trace if record.num_verified)
        assert verify_rows and not verify_rows - Counter(seen)  # (the prefill and draft passes may use it too)


def test_the_measurement_is_taken_once_per_shape(monkeypatch):
    weight = torch.randn(4096, 1024)
    first = columns_win(weight)
    monkeypatch.setattr(lm_head.F, "linear", lambda *args: (_ for _ in ()).throw(AssertionError("timed again")))
    assert columns_win(weight) is first
