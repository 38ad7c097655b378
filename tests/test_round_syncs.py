"""What a drafting round asks of the host: at most two reads of the device, none more for a `dspark_rounds` sink,
and copies that do not grow.

On a GPU every read of a device tensor from Python waits for the queue to drain. The
round's reads are counted from dspark_hf's own code only (transformers' loop makes its
own): scalar reads (`_local_scalar_dense`: int(), float(), .item()), `nonzero`,
`.tolist()`, and tensors made from host data. Bytes written by copies and
concatenations are counted too, at two context lengths.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dspark_hf
from conftest import MASK_ID, tiny_target, write_bigram_deepspec, write_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.core.generation import DSparkCandidateGenerator
from dspark_hf.core.scheduling import CostTable

PACKAGE = str(Path(dspark_hf.__file__).parent)
SYNC_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.item.default"}
HOST_DATA_OPS = {"aten.lift_fresh.default", "aten.lift_fresh_copy.default"}
COPY_OPS = {"aten.copy_.default", "aten.cat.default", "aten.index_put_.default", "aten.slice_scatter.default"}
GENERATE_API_COPY = "the candidates: transformers' API takes the whole sequence back each round"


def called_from_package() -> bool:
    """Whether the innermost Python frame outside torch belongs to dspark_hf (not transformers, not the test)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" not in name:
            return name.startswith(PACKAGE)
        frame = frame.f_back
    return False


class RoundCounter(TorchDispatchMode):
    """Counts, per drafting round, host reads and bytes copied by dspark_hf code."""

    def __init__(self):
        super().__init__()
        self.round = 0
        self.syncs = collections.Counter()
        self.copied = collections.Counter()
        self.what = collections.defaultdict(list)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = str(func)
        if self.round and (name in SYNC_OPS or name in HOST_DATA_OPS) and called_from_package():
            self.syncs[self.round] += 1
            self.what[self.round].append(name)
        if self.round and name in COPY_OPS and called_from_package() and isinstance(result, torch.Tensor):
            if not getattr(self, "candidates_cat", False):
                self.copied[self.round] += result.numel() * result.element_size()
        return result


@pytest.fixture
def counted(monkeypatch):
    """Numbers rounds by get_candidates calls; counts `.tolist()` calls from the package as reads."""
    counter = RoundCounter()
    get_candidates, tolist = DSparkCandidateGenerator.get_candidates, torch.Tensor.tolist

    def numbered(self, input_ids, *args, is_first_iteration=False, **kwargs):
        if not is_first_iteration:
            counter.round += 1
        return get_candidates(self, input_ids, *args, is_first_iteration=is_first_iteration, **kwargs)

    def counted_tolist(tensor):
        if counter.round and called_from_package():
            counter.syncs[counter.round] += 1
            counter.what[counter.round].append("tolist")
        return tolist(tensor)

    real_cat = torch.cat

    def cat(tensors, *args, **kwargs):  # the candidates' concatenation is transformers' contract, not a cache copy
        frame = sys._getframe(1)
        counter.candidates_cat = frame.f_code.co_name == "get_candidates"
        try:
            return real_cat(tensors, *args, **kwargs)
        finally:
            counter.candidates_cat = False

    monkeypatch.setattr(DSparkCandidateGenerator, "get_candidates", numbered)
    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    monkeypatch.setattr("dspark_hf.core.generation.torch.cat", cat, raising=False)
    return counter


DRAFTERS = {
    "dspark": dict(kind="bigram"),
    "dspark-pruned": dict(kind="random", draft_vocab_size=16),
    "dflash": dict(kind="random", markov_rank=0, enable_confidence_head=False),
}
FLAT = CostTable(0.1, tuple(1.0 + 0.02 * n for n in range(33)))


def make_drafter(target, tmp_path, kind, **fields):
    write = write_bigram_deepspec if kind == "bigram" else write_deepspec
    drafter = DSparkDrafter.from_pretrained(write(target, tmp_path / "d", **fields), target)
    if drafter.config.pruned:
        with torch.no_grad():
            drafter.d2t.copy_(torch.arange(16) * 0)  # target ids 0..15
    drafter.cost_table = FLAT
    return drafter


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("hybrid", [False, True], ids=["dspark-only", "hybrid"])
@pytest.mark.parametrize("variant", list(DRAFTERS))
def test_at_most_two_host_reads_per_round(variant, hybrid, sampled, counted, tmp_path):
    target = tiny_target("qwen3")
    drafter = make_drafter(target, tmp_path, **DRAFTERS[variant])
    prompt = torch.randint(0, MASK_ID, (1, 12), generator=torch.Generator().manual_seed(1))
    sampling = dict(do_sample=True, temperature=0.8, top_k=10) if sampled else dict(do_sample=False)
    with counted:
        target.generate(prompt, max_new_tokens=40, assistant_model=drafter, dspark_ngram=hybrid,
                        dspark_scheduler="cost", **sampling)
    rounds = counted.round
    assert rounds >= 5
    worst = max(range(1, rounds + 1), key=lambda r: counted.syncs[r])
    assert counted.syncs[worst] <= 2, f"round {worst}: {counted.what[worst]}"
    sources = {r.source for r in drafter.last_trace}  # read after the rounds: the trace is built lazily
    assert "dspark" in sources


@pytest.mark.parametrize("variant", ["dspark", "dflash"])
def test_a_rounds_sink_adds_no_host_read(variant, counted, tmp_path):
    """`dspark_rounds` gets each record as its round ends, and the round does not read the device for it."""
    target = tiny_target("qwen3")
    drafter = make_drafter(target, tmp_path, **DRAFTERS[variant])
    prompt = torch.randint(0, MASK_ID, (1, 12), generator=torch.Generator().manual_seed(3))
    reads, sink = {}, []
    for with_sink in (False, True):
        counted.round, counted.syncs = 0, collections.Counter()
        with counted:
            target.generate(prompt, max_new_tokens=30, assistant_model=drafter, do_sample=False, dspark_ngram=True,
                            dspark_scheduler="cost", **({"dspark_rounds": sink} if with_sink else {}))
        reads[with_sink] = (counted.round, dict(counted.syncs))
    assert reads[True] == reads[False] and reads[True][0] >= 5
    assert sink == list(drafter.last_trace) and len(sink) == reads[True][0]  # read here, after the call


@pytest.mark.parametrize("variant", ["dspark", "dflash"])
def test_copies_per_round_do_not_grow_with_the_context(variant, counted, tmp_path):
    target = tiny_target("qwen3")
    drafter = make_drafter(target, tmp_path, **DRAFTERS[variant])
    drafter.generation_config.dspark_scheduler = "threshold"
    per_round = {}
    for length in (24, 192):
        prompt = torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(2))
        counted.round, counted.copied = 0, collections.Counter()
        with counted:
            target.generate(prompt, max_new_tokens=12, assistant_model=drafter, do_sample=False, dspark_ngram=False)
        later = [counted.copied[r] for r in range(2, counted.round + 1)]  # round 1 reads the whole prompt
        per_round[length] = max(later)
    assert per_round[192] == per_round[24], per_round
