"""Every published Hub layout at the full dimensions of Qwen3-4B and Qwen3-8B.

Tiny fixtures cannot show the bugs that depend on shape: head_dim 128, 32/8 grouped
heads, a 151,936-token vocabulary, Qwen3-4B's tied embeddings, 36 target layers with
`target_layer_ids` near the top, `d2t` at real size, and the memory a drafter adds when
it borrows the target's embedding and LM head. Each test writes random weights of full
size, in one layout, beside that layout's published config.json, into the
huggingface_hub cache layout; loads the drafter by repo id over a random Qwen3-shaped
target (the published hidden size, heads, head_dim, vocabulary, depth and tying; a
narrow MLP keeps its CPU time down); and checks that greedy output equals plain decoding
and that the drafter adds its own parameters and nothing else. It also reports the
draft pass time on this machine (pytest -s prints one JSON line per layout).

The targets run in float32, where greedy equality is exact (in bfloat16, verifying
several tokens at once rounds differently from one at a time, and random weights make
near-ties common); their layers share one set of weights so that an 8B-shaped target
fits beside its drafter (see `qwen3_target`). The 8B drafters run in bfloat16, as
they are served.

These tests use the threshold scheduler without hybrid drafting, so no cost table is
profiled. The last one runs what a user runs instead, at Qwen3-4B's full size (every layer
its own, the published MLP width, bfloat16, the drafter's defaults, profiling included),
through scripts/real_size_run.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from dspark_hf import DSparkDrafter
from dspark_hf.formats import specforge
from dspark_hf.formats.loader import read_config

# ------------------------------------------------------------------ published configs
# Qwen/Qwen3-4B and Qwen/Qwen3-8B config.json (huggingface.co/Qwen/Qwen3-4B, /Qwen3-8B; transformers 4.51 exports).
QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
    "initializer_range": 0.02, "intermediate_size": 9728, "max_position_embeddings": 40960, "max_window_layers": 36,
    "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_8B = {**QWEN3_4B, "hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False}

# deepseek-ai/dspark_qwen3_8b_block7 config.json as published (transformers 5.10.2 export). DeepSpec writes it
# with `build_draft_config` (github.com/deepseek-ai/DeepSpec, deepspec/modeling/dspark/qwen3/config.py): the
# target's config copied, then the draft fields set from the training config
# (config/dspark/dspark_qwen3_4b_online.py: 5 layers, block 7, layers [1, 9, 17, 25, 33], mask 151669, rank 256).
DSPARK_QWEN3_8B = {
    "architectures": ["Qwen3DSparkModel"], "attention_bias": False, "attention_dropout": 0.0, "block_size": 7,
    "bos_token_id": 151643, "confidence_head_with_markov": True, "dtype": "bfloat16", "enable_confidence_head": True,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "layer_types": ["full_attention"] * 5, "markov_head_type": "vanilla",
    "markov_rank": 256, "mask_token_id": 151669, "max_position_embeddings": 40960, "max_window_layers": 36,
    "model_type": "qwen3", "num_anchors": 512, "num_attention_heads": 32, "num_hidden_layers": 5,
    "num_key_value_heads": 8, "num_target_layers": 36, "pad_token_id": None, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}, "sliding_window": None,
    "target_layer_ids": [1, 9, 17, 25, 33], "tie_word_embeddings": False, "transformers_version": "5.10.2",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
# deepseek-ai/dspark_qwen3_4b_block7: the same fields over Qwen3-4B's.
DSPARK_QWEN3_4B = {**DSPARK_QWEN3_8B, "hidden_size": 2560, "intermediate_size": 9728}
# deepseek-ai/dflash_qwen3_{4b,8b}_block7: `build_draft_config` for config/dflash/dflash_qwen3_{4b,8b}.py, which
# set markov_rank 0 and confidence_head_alpha 0, so the head fields are absent or off.
NO_HEADS = {"markov_rank": 0, "enable_confidence_head": False}
HEAD_ONLY_FIELDS = ("markov_head_type", "confidence_head_with_markov")

# z-lab/Qwen3-4B-DFlash-b16 config.json (transformers 4.57.3 export; Qwen3-4B's fields, so tied embeddings).
ZLAB_QWEN3_4B = {
    "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 16, "bos_token_id": 151643,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}, "dtype": "bfloat16",
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560, "initializer_range": 0.02,
    "intermediate_size": 9728, "layer_types": ["full_attention"] * 5, "max_position_embeddings": 40960,
    "max_window_layers": 5, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 5,
    "num_key_value_heads": 8, "num_target_layers": 36, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True, "transformers_version": "4.57.3",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
# z-lab/Qwen3-8B-DFlash-b16: the same over Qwen3-8B's fields (5 layers of 4096 / 12288, as the source config in
# vllm-project/speculators' DFlash converter tests, tests/.../test_dflash_converter.py).
ZLAB_QWEN3_8B = {**ZLAB_QWEN3_4B, "hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False}

# sgl-project/SpecForge configs/qwen3-4b-dspark.json at a6b6b0230009d15ec2a97a57384e6f53f0f96946: the config its
# DSpark exports carry. Weights hold neither the embedding nor the LM head (the target's are reused).
SPECFORGE_QWEN3_4B = {
    "architectures": ["DSparkDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dspark.DSparkDraftModel"}, "block_size": 7, "bos_token_id": 151643,
    "dflash_config": {
        "attention_mode": "gqa", "mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33],
        "projector_type": "dspark", "markov_rank": 256, "markov_head_type": "vanilla", "confidence_head_alpha": 1.0,
        "enable_confidence_head": True, "confidence_head_with_markov": True,
    },
    "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
    "initializer_range": 0.02, "intermediate_size": 9728, "layer_types": ["full_attention"] * 5,
    "max_position_embeddings": 40960, "max_window_layers": 5, "model_type": "qwen3", "num_attention_heads": 32,
    "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 36, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}

# mgoin/Qwen3-8B-speculator.dspark, in the layout speculators 0.9.0 saves (tests/fixtures/speculators, written by
# the library itself), with that drafter's training recipe (as re-used in public recipes: `--num-layers 5
# --target-layer-ids 2 10 18 26 34 --block-size 8 --draft-vocab-size 32000 --markov-rank 256 --markov-head-type
# vanilla --enable-confidence-head --confidence-head-with-markov`) and speculators' mid-2026 sliding draft layers
# (window 2048; /work/shared/docs/checkpoint-formats.md).
SPECULATORS_QWEN3_8B = {
    "architectures": ["DSparkDraftModel"], "auto_map": {"": "config.DSparkSpeculatorConfig"},
    "aux_hidden_state_layer_ids": [2, 10, 18, 26, 34], "block_size": 8, "confidence_head_with_markov": True,
    "draft_vocab_size": 32000, "dtype": "bfloat16", "enable_confidence_head": True, "markov_head_type": "vanilla",
    "markov_rank": 256, "mask_token_id": 151669, "sample_from_anchor": True, "sliding_window_non_causal": False,
    "speculators_config": {
        "algorithm": "dspark", "default_proposal_method": "greedy",
        "proposal_methods": [
            {"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": 8, "verifier_accept_k": 1}
        ],
        "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": "Qwen/Qwen3-8B"},
    },
    "speculators_model_type": "dspark", "speculators_version": "0.9.0", "target_hidden_size": None,
    "tie_word_embeddings": False,
    "transformer_layer_config": {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": None,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 12288, "layer_types": ["sliding_attention"] * 5, "max_position_embeddings": 40960,
        "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 5,
        "num_key_value_heads": 8, "pad_token_id": None, "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}, "sliding_window": 2048,
        "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": True, "vocab_size": 151936,
    },
    "transformers_version": "5.19.0",
}


def without_heads(config: dict) -> dict:
    raw = {key: value for key, value in config.items() if key not in HEAD_ONLY_FIELDS}
    return {**raw, **NO_HEADS}


@dataclasses.dataclass
class Layout:
    """A published drafter: its config.json and what its weight file holds, written down from the layout."""

    repo_id: str
    target: str  # "4b" or "8b"
    config: dict
    markov_rank: int = 0
    confidence: bool = False  # a confidence head, over [h ; W1[x]] when there is a Markov head
    draft_vocab: Optional[int] = None  # a pruned vocabulary: own lm_head, d2t, t2d
    copies: bool = False  # embed_tokens / lm_head copies of the target's (DeepSpec)
    layers: int = 5
    taps: int = 5


LAYOUTS = [  # deepseek-ai/dflash_qwen3_8b_block7 is dspark_qwen3_8b_block7 without its heads: its 4B twin covers it
    Layout("deepseek-ai/dspark_qwen3_4b_block7", "4b", DSPARK_QWEN3_4B, 256, True, copies=True),
    Layout("deepseek-ai/dflash_qwen3_4b_block7", "4b", without_heads(DSPARK_QWEN3_4B), copies=True),
    Layout("z-lab/Qwen3-4B-DFlash-b16", "4b", ZLAB_QWEN3_4B),
    Layout("specforge/qwen3-4b-dspark", "4b", SPECFORGE_QWEN3_4B, 256, True),
    Layout("deepseek-ai/dspark_qwen3_8b_block7", "8b", DSPARK_QWEN3_8B, 256, True, copies=True),
    Layout("z-lab/Qwen3-8B-DFlash-b16", "8b", ZLAB_QWEN3_8B),
    Layout("mgoin/Qwen3-8B-speculator.dspark", "8b", SPECULATORS_QWEN3_8B, 256, True, draft_vocab=32000),
]
TARGETS = {"4b": QWEN3_4B, "8b": QWEN3_8B}
# The 4B drafters follow their float32 target; the 8B ones run in bfloat16, as they are served, over it.
DRAFTER_DTYPES = {"4b": torch.float32, "8b": torch.bfloat16}
TARGET_INTERMEDIATE = 256  # the published 9728 / 12288 would multiply the target's CPU time per token
PROMPT_TOKENS, NEW_TOKENS = 16, 8
MARKOV_STRENGTH = 1e4  # far above any base logit, so the Markov bias decides the draft token


def tensor_shapes(layout: Layout) -> dict[str, tuple[int, ...]]:
    """The drafter's own tensors in that layout, from the target's published dimensions."""
    published = TARGETS[layout.target]
    d, inter, vocab = published["hidden_size"], published["intermediate_size"], published["vocab_size"]
    head_dim = published["head_dim"]
    q, kv = published["num_attention_heads"] * head_dim, published["num_key_value_heads"] * head_dim
    shapes = {"fc.weight": (d, layout.taps * d), "hidden_norm.weight": (d,), "norm.weight": (d,)}
    for i in range(layout.layers):
        shapes.update({
            f"layers.{i}.input_layernorm.weight": (d,), f"layers.{i}.post_attention_layernorm.weight": (d,),
            f"layers.{i}.self_attn.q_proj.weight": (q, d), f"layers.{i}.self_attn.k_proj.weight": (kv, d),
            f"layers.{i}.self_attn.v_proj.weight": (kv, d), f"layers.{i}.self_attn.o_proj.weight": (d, q),
            f"layers.{i}.self_attn.q_norm.weight": (head_dim,), f"layers.{i}.self_attn.k_norm.weight": (head_dim,),
            f"layers.{i}.mlp.gate_proj.weight": (inter, d), f"layers.{i}.mlp.up_proj.weight": (inter, d),
            f"layers.{i}.mlp.down_proj.weight": (d, inter),
        })
    rank, scored = layout.markov_rank, layout.draft_vocab or vocab
    if rank:
        shapes.update({"markov_head.markov_w1.weight": (vocab, rank), "markov_head.markov_w2.weight": (scored, rank)})
    if layout.confidence:
        shapes.update({"confidence_head.proj.weight": (1, d + rank), "confidence_head.proj.bias": (1,)})
    if layout.draft_vocab:
        shapes.update({"lm_head.weight": (scored, d), "d2t": (scored,)})
    return shapes


# ------------------------------------------------------------------ the target
def fill_uniform(tensor: torch.Tensor, std: float, generator: torch.Generator) -> None:
    """Fill with uniform noise of standard deviation `std`, drawn in float32 a chunk at a time (fast, little memory)."""
    flat, bound, chunk = tensor.view(-1), std * math.sqrt(3.0), 1 << 24
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk]
        part.copy_(torch.empty(part.shape).uniform_(-bound, bound, generator=generator))


def fill_target(model: Qwen3ForCausalLM, generator: torch.Generator) -> None:
    """Random weights whose greedy text is varied rather than one token repeated.

    At the usual 0.02 scale every layer's attention adds the context's average to each
    position, and the sum over 36 layers drowns the current token: greedy text repeats
    one token. Here attention outputs are small and MLP outputs large, so the next token
    is a fixed random function of the current one, with the context a minor term.
    """
    config = model.config
    d, inter = config.hidden_size, config.intermediate_size
    scale = {"o_proj": 0.1 / math.sqrt(d), "down_proj": 3.0 / math.sqrt(inter), "embed_tokens": 1.0}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                fill_uniform(param, scale.get(name.split(".")[-2], 1.0 / math.sqrt(d)), generator)


def qwen3_target(published: dict) -> Qwen3ForCausalLM:
    """A random float32 Qwen3 of the published shape whose 36 decoder layers share one set of weights.

    The shapes (but the MLP's width), the depth and the hidden states per layer are real;
    the memory is not (an 8B-shaped float32 target in 5 GiB instead of 11), so greedy
    equality can be checked in float32, where it is exact, beside a drafter of full size.
    Built on the meta device, without transformers' slow initialisation.
    """
    config = Qwen3Config(**{**published, "intermediate_size": TARGET_INTERMEDIATE})
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    weights: dict[str, nn.Parameter] = {}
    for module_name, module in model.named_modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            key = re.sub(r"^model\.layers\.\d+\.", "layer.", f"{module_name}.{name}")
            if key not in weights:
                weights[key] = nn.Parameter(torch.empty(param.shape), requires_grad=False)
            module._parameters[name] = weights[key]
    model.model.rotary_emb = type(model.model.rotary_emb)(config)  # its buffers are computed, not loaded
    model.tie_weights()
    fill_target(model.eval(), torch.Generator().manual_seed(0))
    return model


_built: dict = {}


def real_target(size: str):
    """(target, prompt, plain greedy continuation), one size kept at a time: two would not fit in memory."""
    if size not in _built:
        _built.clear()
        target = qwen3_target(TARGETS[size])
        prompt = torch.randint(0, 151643, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1))
        plain = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
        _built[size] = target, prompt, plain
    return _built[size]


# ------------------------------------------------------------------ the checkpoint
def hub_snapshot(cache_dir: Path, repo_id: str, commit: str = "0" * 40) -> Path:
    """The huggingface_hub cache layout: models--org--name/{refs/main, snapshots/<commit>/}."""
    repo = cache_dir / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    return snapshot


def successors(prompt: torch.Tensor, plain: torch.Tensor) -> dict[int, int]:
    """Each token's greedy successor in the target's own text, from the prompt's last token on."""
    text = plain[0, prompt.shape[1] - 1 :].tolist()
    following: dict[int, int] = {}
    for prev, nxt in zip(text[:-1], text[1:]):
        following.setdefault(prev, nxt)
    return following


def write_checkpoint(directory: Path, layout: Layout, target, following: dict[int, int]) -> None:
    """config.json as published and random bfloat16 weights in the layout.

    A Markov head is set to the target's own greedy successors (one rank dimension per
    token seen), so DSpark blocks are accepted and verification of several tokens at once
    is exercised; DFlash drafters have no such head, and their random drafts are rejected.
    """
    (directory / "config.json").write_text(json.dumps(layout.config, indent=2))
    generator = torch.Generator().manual_seed(2)
    vocab = target.config.vocab_size
    draft_ids = None
    if layout.draft_vocab:  # the successors, and the rest drawn at random, sorted by id as speculators stores them
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[list(following.values())] = True
        others = torch.randperm(vocab, generator=generator)
        keep[others[~keep[others]][: layout.draft_vocab - int(keep.sum())]] = True
        draft_ids = keep.nonzero()[:, 0]
    column = {token: index for index, token in enumerate(draft_ids.tolist())} if draft_ids is not None else None
    tensors = {}
    for name, shape in tensor_shapes(layout).items():
        if name == "d2t":
            tensors[name] = draft_ids - torch.arange(len(draft_ids))
            continue
        tensor = torch.empty(shape)
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif name.endswith("bias"):
            tensor.zero_()
        else:
            fill_uniform(tensor, 0.02 if "markov" in name else 1.0 / math.sqrt(shape[-1]), generator)
        if name == "markov_head.markov_w1.weight":
            for rank, prev in enumerate(following):
                tensor[prev] = 0.0
                tensor[prev, rank] = 1.0
        if name == "markov_head.markov_w2.weight":
            for rank, nxt in enumerate(following.values()):
                tensor[nxt if column is None else column[nxt], rank] = MARKOV_STRENGTH
        tensors[name] = tensor.to(torch.bfloat16)
    if draft_ids is not None:
        tensors["t2d"] = keep
    if layout.copies:
        tensors["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().to(torch.bfloat16)
        tensors["lm_head.weight"] = target.get_output_embeddings().weight.detach().to(torch.bfloat16)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def resident_bytes() -> int:
    """This process's resident memory, freed heap returned first: anonymous, and the files it maps (a drafter
    whose dtype is its checkpoint's keeps its tensors in the mapped safetensors file)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return sum(int(fields[key].split()[0]) * 1024 for key in ("RssAnon", "RssFile"))


def storages(tensors) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


# ------------------------------------------------------------------ the tests
@pytest.mark.slow  # one to three minutes each on a 2-core CPU
@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.repo_id for layout in LAYOUTS])
def test_published_layout_at_real_size(layout, tmp_path, record_property):
    target, prompt, plain = real_target(layout.target)
    following = successors(prompt, plain)
    snapshot = hub_snapshot(tmp_path / "hub", layout.repo_id)
    write_checkpoint(snapshot, layout, target, following)

    before = resident_bytes()
    started = time.perf_counter()
    dtype = DRAFTER_DTYPES[layout.target]
    drafter = DSparkDrafter.from_pretrained(
        layout.repo_id, target, cache_dir=tmp_path / "hub", local_files_only=True, dtype=dtype
    )
    load_seconds = time.perf_counter() - started
    for path in snapshot.iterdir():  # gigabytes on disk: gone before the next layout writes its own (mappings stay)
        path.unlink()

    # The drafter's bytes are its own tensors, as the layout lists them, and none is the target's.
    own = {**dict(drafter.named_parameters()), **dict(drafter.named_buffers())}
    assert {name: tuple(t.shape) for name, t in own.items() if name != "rotary.inv_freq"} == tensor_shapes(layout)
    assert all(t.dtype == dtype for name, t in own.items() if t.is_floating_point() and name != "rotary.inv_freq")
    own_bytes = sum(storages(own.values()).values())
    assert not set(storages(own.values())) & set(storages(target.parameters()))
    assert drafter.embed_tokens.weight is target.get_input_embeddings().weight

    spec = target.generate(
        prompt, max_new_tokens=NEW_TOKENS, do_sample=False, assistant_model=drafter,
        dspark_scheduler="threshold", dspark_ngram=False, assistant_confidence_threshold=0.0,
    )
    assert spec.tolist() == plain.tolist()
    # Loading and drafting (which touches every mapped page) leave those bytes resident, give or take allocator
    # slack: a copy of the embedding or LM head would be 0.7-2.3 GiB more.
    added = resident_bytes() - before
    message = f"the drafter added {added / 2**20:.0f} MiB; its tensors are {own_bytes / 2**20:.0f} MiB"
    assert added < own_bytes * 1.05 + 2**27, message
    rounds = list(drafter.last_trace)
    accepted = sum(r.num_accepted for r in rounds)
    if layout.markov_rank:
        assert accepted > 0, "the Markov head encodes the target's successors; some drafts must survive"
    draft_ms = statistics.median(r.draft_seconds for r in rounds) * 1000
    report = dict(
        layout=layout.repo_id, dtype=str(dtype).removeprefix("torch."), own_mib=round(own_bytes / 2**20),
        added_mib=round(added / 2**20), load_s=round(load_seconds, 1), draft_ms=round(draft_ms),
        rounds=len(rounds), accepted=accepted,
    )
    for key, value in report.items():
        record_property(key, value)
    print(json.dumps(report))


def test_specforge_first_dspark_exports_are_read_with_their_heads(tmp_path):
    """SpecForge's DSpark config at its first DSpark commit (832263fe, July 2026) names DFlashDraftModel."""
    raw = {**SPECFORGE_QWEN3_4B, "architectures": ["DFlashDraftModel"], "auto_map": ZLAB_QWEN3_4B["auto_map"]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    config, layout = read_config(tmp_path / "config.json")
    assert layout is specforge
    assert (config.markov_rank, config.enable_confidence_head, config.num_draft_tokens) == (256, True, 7)


@pytest.mark.slow  # about three minutes on a 2-core CPU, and 9 GiB of memory
def test_a_full_size_target_through_the_default_generate(tmp_path):
    """scripts/real_size_run.py at Qwen3-4B: every layer its own, the published MLP width, bfloat16, and the
    drafter's defaults (the auto scheduler profiling a fresh cache, hybrid drafting) that the tests above leave out."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "real_size_run.py"
    result = subprocess.run(
        [sys.executable, str(script), "--size", "4b", "--threads", "2", "--prompt-tokens", "16", "--new-tokens", "8"],
        env={**os.environ, "DSPARK_HF_CACHE": str(tmp_path / "cache")}, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["target_parameters_billion"] == 4.02
    assert report["drafter_added_gib"] < report["drafter_own_gib"] * 1.05 + 0.125, report
    assert report["dspark_only"]["accepted_by_source"].keys() >= {"dspark"}, report  # DSpark blocks were drafted
    for run in ("defaults", "dspark_only"):  # in bfloat16 a flip is allowed at a near-tie only
        divergence = report[run]["divergence"]
        assert divergence is None or divergence["steps"] <= 2, report
    assert report["exports_draft_the_same"] == {"speculators": True, "deepspec": True}, report
