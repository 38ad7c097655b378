"""The drafting round on the device: it never waits for the device, copies what is new only, drafts a
block without a Markov head in one pass, keeps RoPE in float32 and compiles.

Host syncs and copies are counted with a TorchDispatchMode over the round's draft-side work
(extending the context cache, the draft pass, building q), for drafters with and without a
Markov head, pruned or not, greedy and sampled. They are counted on CPU; a GPU round runs the
same ops.
"""

from __future__ import annotations

import contextlib
import shutil

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from conftest import VOCAB, tiny_target, write_bigram_deepspec, write_deepspec, write_zlab
from dspark_hf import DSparkDrafter
from dspark_hf.core.modeling import ContextCache
from dspark_hf.core.sampling import DraftTokenChooser

# Ops after which the host holds a value computed on the device (or sends it host data):
# scalar reads, data-dependent shapes, tensors built from Python data, and torch.multinomial,
# whose kernel checks its input on the host. A 0-d lift is a Python scalar written by indexing
# (`x[..., -k:] = 0` in top-p): it reaches the device as a fill kernel's argument, and is not counted.
SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "lift_fresh", "lift_fresh_copy", "equal",
            "is_nonzero", "multinomial", "unique", "_unique2", "unique_consecutive"}
COPY_OPS = {"copy_", "cat", "stack", "clone", "_to_copy", "index_copy", "index_copy_", "index_put", "index_put_",
            "slice_scatter", "repeat"}
SEQUENCE = torch.randint(0, VOCAB - 1, (1, 96), generator=torch.Generator().manual_seed(3))
PREFIX_FREE = [TemperatureLogitsWarper(0.7), TopKLogitsWarper(8), TopPLogitsWarper(0.9)]


class PassThrough(LogitsProcessor):
    """A processor dspark_hf does not know: it sends choosing down the sequential target-vocabulary path."""

    def __call__(self, input_ids, scores):
        return scores


PROCESSORS = {  # name: (logits processors, do_sample)
    "greedy": ([], False),
    "sampled": (PREFIX_FREE, True),
    "sampled-repetition-penalty": ([RepetitionPenaltyLogitsProcessor(1.3), *PREFIX_FREE], True),
}


class DeviceTraffic(TorchDispatchMode):
    """Counts host syncs, and bytes written by copies, of the torch ops run inside it."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []
        self.copied = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in SYNC_OPS and not (name.startswith("lift_fresh") and out.dim() == 0):
            self.syncs.append(name)
        if name in COPY_OPS:
            written = args[0] if name.endswith("_") else out
            self.copied += written.numel() * written.element_size()
        return out


@pytest.fixture
def traffic(monkeypatch):
    """A DeviceTraffic that also counts Tensor.tolist(), which reads the device without a dispatched op on CPU."""
    counter = DeviceTraffic()
    tolist = torch.Tensor.tolist

    def counted_tolist(tensor):
        counter.syncs.append("tolist")
        return tolist(tensor)

    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    return counter


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


def make_drafter(target, directory, kind: str) -> DSparkDrafter:
    """'dspark': Markov + confidence heads; 'dflash': z-lab layout (neither head); '-pruned': 16 draft tokens
    with a d2t that is not the identity; 'rank0': no Markov head, a confidence head."""
    if kind == "dflash":
        return DSparkDrafter.from_pretrained(write_zlab(target, directory), target)
    fields = dict(markov_rank=0) if kind.startswith("rank0") else {}
    if kind.endswith("-pruned"):
        fields["draft_vocab_size"] = 16
    drafter = DSparkDrafter.from_pretrained(write_deepspec(target, directory, **fields), target)
    if kind.endswith("-pruned"):
        with torch.no_grad():
            drafter.d2t.copy_(torch.tensor([0, 1, 1, 2, 2, 2, 3, 3, 3, 4, 5, 5, 6, 6, 7, 7]))
    return drafter


def features(drafter, start: int, end: int) -> list:
    hidden = drafter.target(SEQUENCE[:, :end], output_hidden_states=True).hidden_states
    return [hidden[i][:, start:end] for i in drafter.config.hidden_state_indices]


def context_kv(drafter, start: int, end: int):
    return drafter.context_kv(features(drafter, start, end), torch.arange(start, end)[None])


@torch.no_grad()
def drafting_round(drafter, cache, length: int, new: int, processors=(), do_sample=False, keep_q=False, traffic=None):
    """One round's draft-side work: the context grows by `new` tokens up to `length`, then a block is drafted."""
    kv = context_kv(drafter, length - new, length)
    chooser = DraftTokenChooser(SEQUENCE[:, : length + 1], LogitsProcessorList(processors), do_sample, VOCAB,
                                drafter.draft_token_ids(), keep_q)
    with traffic if traffic is not None else contextlib.nullcontext():
        cache.append(kv)
        block = drafter.draft(SEQUENCE[0, length : length + 1], length, cache, chooser)
        q = block.draft_logits
    return block, q, chooser


@pytest.mark.parametrize("processors", list(PROCESSORS))
@pytest.mark.parametrize("kind", ["dspark", "dspark-pruned", "dflash", "rank0-pruned"])
def test_a_drafting_round_never_waits_for_the_device(kind, processors, target, tmp_path, traffic):
    drafter = make_drafter(target, tmp_path / "d", kind)
    cache = ContextCache(128)
    with torch.no_grad():
        cache.append(context_kv(drafter, 0, 40))
    chosen, do_sample = PROCESSORS[processors]
    block, q, _ = drafting_round(drafter, cache, 43, 3, chosen, do_sample, keep_q=do_sample, traffic=traffic)
    assert traffic.syncs == []
    assert len(block.draft_ids) == drafter.config.num_draft_tokens and (q is not None) == do_sample


@pytest.mark.parametrize("kind", ["dspark", "dflash"])
def test_a_round_copies_as_many_bytes_at_a_long_context_as_at_a_short_one(kind, target, tmp_path):
    drafter = make_drafter(target, tmp_path / "d", kind)

    def copied(length: int) -> int:
        cache = ContextCache(128)
        with torch.no_grad():
            cache.append(context_kv(drafter, 0, length - 3))
        traffic = DeviceTraffic()
        drafting_round(drafter, cache, length, 3, traffic=traffic)
        return traffic.copied

    copied(80)  # RoPE's table grows (by doubling) to the longest context once; this is about the rounds after
    short, long = copied(16), copied(80)
    assert short == long > 0


def test_the_cache_grows_when_outgrown_and_keeps_its_context(target, tmp_path):
    drafter = make_drafter(target, tmp_path / "d", "dspark")
    small, roomy = ContextCache(4), ContextCache(128)
    with torch.no_grad():
        for start, end in ((0, 3), (3, 11), (11, 30)):
            for cache in (small, roomy):
                cache.append(context_kv(drafter, start, end))
    assert len(small) == len(roomy) == 30 and small.capacity >= 30
    for layer in range(len(drafter.layers)):
        for mine, theirs in zip(small.layer(layer), roomy.layer(layer)):
            assert torch.equal(mine, theirs)
    assert torch.equal(drafting_round(drafter, small, 33, 3)[0].draft_ids,
                       drafting_round(drafter, roomy, 33, 3)[0].draft_ids)


@pytest.mark.parametrize("path", ["prefix-free", "target-vocabulary"])
def test_a_pruned_drafter_holding_every_argmax_drafts_like_the_whole_vocabulary(path, target, tmp_path):
    """The greedy ids of a pruned drafter equal the unpruned drafter's, and argmax q is the id proposed.

    Exact-law tests cannot see a d2t mapping off by one where q is built: q stays the law the
    (wrong) token was drawn from. Comparing ids with the unpruned drafter's and with argmax q can."""
    whole = make_drafter(target, tmp_path / "whole", "dspark")
    rounds = [(20, 20), (26, 6), (31, 5), (40, 9)]
    reference, cache = [], ContextCache(64)
    for length, new in rounds:
        reference.append(drafting_round(whole, cache, length, new)[0].draft_ids)
    proposed = set(torch.cat(reference).tolist())
    others = [token for token in range(VOCAB) if token not in proposed and token % 3]  # gaps: d2t is no shift
    vocabulary = sorted(proposed | set(others[: 16 - len(proposed)]))
    offsets = torch.tensor(vocabulary) - torch.arange(len(vocabulary))
    assert len(vocabulary) == 16 and len(proposed) >= 4 and len(set(offsets.tolist())) > 2
    pruned = make_drafter(target, tmp_path / "pruned", "dspark-pruned")
    pruned.load_state_dict({k: v for k, v in whole.state_dict().items() if not k.startswith("markov_head.markov_w2")},
                           strict=False)
    rows = torch.tensor(vocabulary)
    with torch.no_grad():
        pruned.d2t.copy_(rows - torch.arange(len(rows)))
        pruned.lm_head.weight.copy_(target.get_output_embeddings().weight[rows])
        pruned.markov_head.markov_w2.weight.copy_(whole.markov_head.markov_w2.weight[rows])
    processors = [PassThrough()] if path == "target-vocabulary" else []
    cache = ContextCache(64)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[rows] = False
    for (length, new), expected in zip(rounds, reference):
        block, q, _ = drafting_round(pruned, cache, length, new, processors, keep_q=True)
        assert block.draft_ids.tolist() == expected.tolist()
        assert q.argmax(dim=-1).tolist() == expected.tolist()
        assert torch.isneginf(q[:, outside]).all()


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", ["rank0", "dflash"])
def test_one_pass_drafting_equals_the_sequential_loop(kind, do_sample, target, tmp_path):
    """Without a Markov head the block is chosen in one call; a processor we do not know forces the loop."""
    drafter = make_drafter(target, tmp_path / "d", kind)
    processors = PREFIX_FREE if do_sample else []
    results = []
    for extra in ([], [PassThrough()]):
        cache = ContextCache(64)
        torch.manual_seed(0)
        results.append([drafting_round(drafter, cache, length, new, processors + extra, do_sample, keep_q=True)
                        for length, new in ((20, 20), (24, 4), (29, 5))])
    for (one, q_one, chooser_one), (loop, q_loop, chooser_loop) in zip(*results):
        assert len(chooser_one.chosen) == 1 and len(chooser_loop.chosen) == drafter.config.num_draft_tokens
        assert one.draft_ids.tolist() == loop.draft_ids.tolist()
        torch.testing.assert_close(q_one, q_loop)
        if kind == "rank0":
            torch.testing.assert_close(one.confidences, loop.confidences)
    if do_sample:  # the draws are really random: rounds differ
        assert len({tuple(block.draft_ids.tolist()) for block, _, _ in results[0]}) > 1


def test_a_bf16_drafter_keeps_rope_in_float32_and_drafts_like_fp32(target, tmp_path):
    """bf16 would round RoPE's frequencies: at position 4000 the angles would be off by radians."""
    path = write_bigram_deepspec(target, tmp_path / "d", block_size=5)
    fp32 = DSparkDrafter.from_pretrained(path, target)
    bf16 = DSparkDrafter.from_pretrained(path, target, dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and bf16.rotary.inv_freq.dtype == torch.float32
    assert torch.equal(bf16.rotary.inv_freq, fp32.rotary.inv_freq)
    bf16.half().to(torch.bfloat16)
    assert torch.equal(bf16.rotary.inv_freq, fp32.rotary.inv_freq)
    for exact, rounded in zip(fp32.rotary.table(4096, torch.float32), bf16.rotary.table(4096, torch.bfloat16)):
        assert rounded.dtype == torch.bfloat16 and (rounded.float() - exact).abs().max() < 1e-2
    fp32_cache, bf16_cache = ContextCache(64), ContextCache(64)
    for length, new in ((20, 20), (25, 5), (31, 6)):
        exact = drafting_round(fp32, fp32_cache, length, new)[0]
        rounded = drafting_round(bf16, bf16_cache, length, new)[0]
        assert rounded.draft_ids.tolist() == exact.draft_ids.tolist()
        torch.testing.assert_close(rounded.confidences, exact.confidences, atol=0.03, rtol=0)


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")), reason="no C++ compiler for inductor")
@pytest.mark.slow  # compiling takes long; compile_draft() is off by default
def test_the_compiled_draft_pass_drafts_like_the_eager_one(target, tmp_path):
    """fullgraph compilation over the cache's whole storage, masked: same ids and confidences, one graph."""
    drafter = make_drafter(target, tmp_path / "d", "dspark")
    rounds = ((20, 20), (23, 3), (30, 7), (31, 1))

    def run():
        cache = ContextCache(48)
        return [drafting_round(drafter, cache, length, new)[0] for length, new in rounds]

    eager = run()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    drafter.compile_draft()
    compiled = run()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # no recompilation as the context grows
    for mine, theirs in zip(compiled, eager):
        assert mine.draft_ids.tolist() == theirs.draft_ids.tolist()
        torch.testing.assert_close(mine.confidences, theirs.confidences, atol=1e-5, rtol=0)
