"""Tiny random targets and drafters in both checkpoint formats, built offline in temp dirs."""

from __future__ import annotations

import hashlib
import json
import os
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from dspark_hf import DSparkConfig, DSparkDrafter

VOCAB = 24

# Tiny models gain nothing from intra-op threads, and spinning threads thrash a shared 2-core machine. The
# environment variable carries the choice to `load_default` and to the commands the tests run in subprocesses.
torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"
MASK_ID = VOCAB - 1


@pytest.fixture(autouse=True)
def threshold_scheduler_by_default(monkeypatch):
    """Drafters built in tests default to the threshold scheduler, whose rounds do not depend on timings.

    The package default, "auto", times this machine; its choice and the cost scheduler are
    tested on their own with injected cost tables (test_scheduler.py)."""
    monkeypatch.setattr("dspark_hf.core.scheduling.DEFAULT_SCHEDULER", "threshold")


@pytest.fixture(autouse=True)
def drafter_rounds_by_default(monkeypatch):
    """Drafters built in tests propose their own blocks only, so that rounds compare with the reference loop.

    Hybrid n-gram drafting is tested on its own, with injected cost tables (test_hybrid.py)."""
    monkeypatch.setattr("dspark_hf.core.scheduling.DEFAULT_NGRAM", False)


@pytest.fixture
def quiet_machine(monkeypatch):
    """Profiling sees no other process busy, so its table is kept on disk whatever else runs beside the tests
    (a table timed beside another job is not kept; test_scheduler.py tests that on its own)."""
    monkeypatch.setattr("dspark_hf.core.costs.OtherProcesses", lambda: types.SimpleNamespace(busy_cores=lambda: 0.0))


def tiny_target(family: str = "qwen3", vocab: int = VOCAB, seed: int = 0, layers: int = 4):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if family == "qwen3":
        # Sharpened, untied head: greedy text falls into cycles a bigram drafter partly predicts.
        model = Qwen3ForCausalLM(Qwen3Config(**common, tie_word_embeddings=False))
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(4.0)
    else:
        # Tied embeddings like SmolLM2; a wide init keeps greedy text varied instead of one repeated token.
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True, initializer_range=0.3))
    return model.eval()


def drafter_config(target, **fields) -> DSparkConfig:
    depth = target.config.num_hidden_layers
    defaults = dict(
        num_hidden_layers=1,
        target_layer_ids=[0, depth - 2],
        block_size=5,
        mask_token_id=MASK_ID,
        markov_rank=8,
        markov_head_type="vanilla",
        enable_confidence_head=True,
        confidence_head_with_markov=True,
    )
    defaults.update(fields)
    return DSparkConfig.for_target(target.config, **defaults)


def write_deepspec(target, directory: Path, seed: int = 1, **fields) -> Path:
    torch.manual_seed(seed)
    drafter = DSparkDrafter(drafter_config(target, **fields), target)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            if name.endswith("proj.weight") or name.startswith("fc") or "markov" in name:
                param.normal_(0, 0.3)
    drafter.save_pretrained(directory, include_shared_weights=True)
    return directory


def write_zlab(target, directory: Path, seed: int = 1, block_size: int = 6, layer_ids=None, mask_token_id=MASK_ID) -> Path:
    """A z-lab DFlash layout: no heads, no embedding copies, fields under dflash_config."""
    torch.manual_seed(seed)
    depth = target.config.num_hidden_layers
    layer_ids = layer_ids if layer_ids is not None else [0, depth - 2]
    config = drafter_config(
        target, markov_rank=0, enable_confidence_head=False, target_layer_ids=layer_ids, mask_token_id=mask_token_id
    )
    drafter = DSparkDrafter(config, target)
    directory.mkdir(parents=True, exist_ok=True)
    raw = target.config.to_dict()
    raw.update(
        architectures=["DFlashDraftModel"],
        auto_map={"AutoModel": "dflash.DFlashDraftModel"},
        model_type="qwen3",
        num_hidden_layers=1,
        num_target_layers=depth,
        block_size=block_size,
        dflash_config={"mask_token_id": mask_token_id, "target_layer_ids": layer_ids},
    )
    (directory / "config.json").write_text(json.dumps(raw))
    save_file({k: v.contiguous() for k, v in drafter.state_dict().items()}, str(directory / "model.safetensors"))
    return directory


@pytest.fixture(scope="session")
def qwen3_target():
    return tiny_target("qwen3")


@pytest.fixture(scope="session")
def llama_target():
    return tiny_target("llama")


_BIGRAMS: dict[tuple, torch.Tensor] = {}


def weights_fingerprint(model) -> str:
    """A digest of the model's class, config and every weight: equal only for models that compute alike."""
    digest = hashlib.sha256(f"{type(model).__name__} {model.config.to_json_string()}".encode())
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def greedy_bigrams(target, vocab: int = VOCAB, prompts: int = 24, length: int = 40) -> torch.Tensor:
    """The target's most frequent greedy successor of each token, from its own generations.

    Computed once per set of weights (2 s of CPU each): dozens of tests build a bigram drafter for the same
    deterministic tiny target."""
    key = (weights_fingerprint(target), vocab, prompts, length)
    if key not in _BIGRAMS:
        _BIGRAMS[key] = _greedy_bigrams(target, vocab, prompts, length)
    return _BIGRAMS[key]


def _greedy_bigrams(target, vocab: int, prompts: int, length: int) -> torch.Tensor:
    counts = torch.zeros(vocab, vocab)
    generator = torch.Generator().manual_seed(1234)
    for i in range(prompts):
        ids = torch.randint(0, MASK_ID, (1, 3 + i % 7), generator=generator)
        out = target.generate(ids, max_new_tokens=length, do_sample=False)[0]
        for prev, nxt in zip(out[:-1].tolist(), out[1:].tolist()):
            counts[prev, nxt] += 1
    return counts.argmax(dim=-1)


def write_bigram_deepspec(target, directory: Path, seed: int = 1, strength: float = 30.0, **fields) -> Path:
    """A drafter whose Markov head encodes the target's greedy bigrams: it agrees often, not always."""
    torch.manual_seed(seed)
    fields = {"markov_rank": VOCAB, "markov_head_type": "vanilla", **fields}
    drafter = DSparkDrafter(drafter_config(target, **fields), target)
    successor = greedy_bigrams(target)
    with torch.no_grad():
        drafter.markov_head.markov_w1.weight.copy_(torch.eye(VOCAB))
        table = torch.zeros(VOCAB, VOCAB)
        table[successor, torch.arange(VOCAB)] = strength
        drafter.markov_head.markov_w2.weight.copy_(table)
        drafter.confidence_head["proj"].weight.normal_(0, 0.5)
    drafter.save_pretrained(directory)
    return directory
