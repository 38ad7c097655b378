"""Tiny random targets and drafters in both checkpoint formats, built offline in temp dirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from dspark_hf import DSparkConfig, DSparkDrafter

VOCAB = 24
MASK_ID = VOCAB - 1


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
        model = Qwen3ForCausalLM(Qwen3Config(**common, tie_word_embeddings=False))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True))
    # Sharper logits make greedy paths less degenerate and give drafts a fair chance of agreeing.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
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
    if defaults["markov_rank"] == 0:
        defaults.update(markov_head_type=None, confidence_head_with_markov=False)
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


def write_zlab(target, directory: Path, seed: int = 1, block_size: int = 6, layer_ids=None) -> Path:
    """A z-lab DFlash layout: no heads, no embedding copies, fields under dflash_config."""
    torch.manual_seed(seed)
    depth = target.config.num_hidden_layers
    layer_ids = layer_ids if layer_ids is not None else [0, depth - 2]
    config = drafter_config(target, markov_rank=0, enable_confidence_head=False, target_layer_ids=layer_ids)
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
        dflash_config={"mask_token_id": MASK_ID, "target_layer_ids": layer_ids},
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
