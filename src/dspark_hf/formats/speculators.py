"""vLLM `speculators` layout (`RedHatAI/*-speculator.dspark`), which vLLM, SGLang and llama.cpp read.

config.json carries `speculators_model_type` ("dspark" or "dflash"), the draft layers' own HF
config as `transformer_layer_config` (rebuilt through its transformers class, since it may
be a diff against that class's defaults), `aux_hidden_state_layer_ids` (indices into HF
`hidden_states`: DeepSpec id + 1, so 0 is the embedding output), the head fields at the top
level, and `speculators_config` (proposal length, verifier). Tensor names are the core's.

`sample_from_anchor` is the block convention: true is DeepSpec's (slot k-1 predicts the token
k after the anchor), false DFlash's 1+N. Exports older than the field are 1+N; the engines
disagree on a missing value (vLLM assumes true, llama.cpp false), so a missing value is read
as false with a warning, and `from_pretrained(..., sample_from_anchor=...)` overrides it.
"""

from __future__ import annotations

import warnings
from typing import Optional

from ..core.config import CheckpointError, DSparkConfig
from .common import head_fields, layer_config, layer_fields, need

NAME = "speculators"
ARCHITECTURE = "DSparkDraftModel / DFlashDraftModel with speculators_model_type"
MODEL_TYPES = ("dspark", "dflash")
LAYER_MODEL_TYPES = ("qwen3", "llama")
LAYER_ID_FIELD, LAYER_ID_OFFSET = "aux_hidden_state_layer_ids", 1
SCHEMA_VERSION = "0.9.0"  # the speculators release whose layout this writes


def matches(raw: dict) -> bool:
    return "speculators_model_type" in raw


def full_layer_config(raw: dict, source: str) -> dict:
    """`transformer_layer_config` with the defaults of its transformers config class filled in."""
    from transformers import AutoConfig

    layer = need(raw, "transformer_layer_config", source)
    if not isinstance(layer, dict):
        raise CheckpointError(f"{source}: field 'transformer_layer_config' is {layer!r:.60}; expected an object.")
    model_type = layer.get("model_type", "qwen3")
    if model_type not in LAYER_MODEL_TYPES:
        raise CheckpointError(
            f"{source}: field 'transformer_layer_config.model_type' is {model_type!r}; dspark_hf reads draft layers "
            f"of type {list(LAYER_MODEL_TYPES)}."
        )
    fields = {key: value for key, value in layer.items() if key != "model_type"}
    return AutoConfig.for_model(model_type, **fields).to_dict()


def read_config(raw: dict, source: str, sample_from_anchor: Optional[bool] = None) -> DSparkConfig:
    kind = raw["speculators_model_type"]
    if kind not in MODEL_TYPES:
        raise CheckpointError(
            f"{source}: field 'speculators_model_type' is {kind!r}; dspark_hf reads {list(MODEL_TYPES)} "
            "speculators checkpoints (Eagle-style drafters draft autoregressively and are another family)."
        )
    layer = full_layer_config(raw, source)
    if layer.get("sliding_window") is None:
        layer["layer_types"] = None  # as speculators reads it: without a window, "sliding" layers see all the context
    target_hidden = raw.get("target_hidden_size")
    if target_hidden not in (None, layer["hidden_size"]):
        raise CheckpointError(
            f"{source}: field 'target_hidden_size' is {target_hidden} but the draft layers have hidden size "
            f"{layer['hidden_size']}; drafters narrower than their target are not supported."
        )
    aux_ids = [int(i) for i in need(raw, "aux_hidden_state_layer_ids", source)]
    if any(i < 0 for i in aux_ids):
        raise CheckpointError(
            f"{source}: field 'aux_hidden_state_layer_ids' is {aux_ids}; ids index hidden_states and start at 0 "
            "(the embedding output)."
        )
    anchor_first = raw.get("sample_from_anchor")
    if sample_from_anchor is not None:
        anchor_first = sample_from_anchor
    elif anchor_first is None:
        warnings.warn(
            f"{source}: 'sample_from_anchor' is missing, so the block convention is unknown (vLLM assumes true, "
            "llama.cpp false); reading it as false, the 1+N layout of every export made before the field existed. "
            "Pass DSparkDrafter.from_pretrained(..., sample_from_anchor=True) if slot k-1 predicts the token k "
            "after the anchor.",
            stacklevel=4,
        )
        anchor_first = False
    draft_vocab = raw.get("draft_vocab_size")
    return DSparkConfig(
        **layer_fields(layer, source, "transformer_layer_config."),
        **(head_fields(raw, source) if kind == "dspark" else {}),
        vocab_size=int(need(layer, "vocab_size", source, "transformer_layer_config.")),
        num_target_layers=None,  # not recorded: the loader takes it from the target
        target_layer_ids=[i - LAYER_ID_OFFSET for i in aux_ids],
        block_size=int(need(raw, "block_size", source)),
        mask_token_id=int(need(raw, "mask_token_id", source)),
        sliding_window_non_causal=bool(raw.get("sliding_window_non_causal", False)),
        draft_vocab_size=None if draft_vocab is None else int(draft_vocab),
        first_draft_index=0 if anchor_first else 1,
        source_format=NAME,
    )


def config_dict(config: DSparkConfig, target_config: dict) -> dict:
    """A config that vLLM's speculators parser accepts, for the target described by `target_config`."""
    anchor_first = config.first_draft_index == 0
    # vLLM serves speculators "dflash" as 1+N only, so anchor-first drafters are "dspark" even without heads.
    kind = "dspark" if anchor_first or config.markov_rank > 0 or config.enable_confidence_head else "dflash"
    layer = layer_config(config)
    layer.update(model_type="qwen3" if config.qk_norm else "llama", tie_word_embeddings=False,
                 use_sliding_window=config.layer_types is not None)
    out = {
        "architectures": ["DSparkDraftModel" if kind == "dspark" else "DFlashDraftModel"],
        "speculators_model_type": kind,
        "speculators_version": SCHEMA_VERSION,
        "transformer_layer_config": layer,
        "aux_hidden_state_layer_ids": [i + LAYER_ID_OFFSET for i in config.target_layer_ids],
        "block_size": config.block_size,
        "mask_token_id": config.mask_token_id,
        "target_hidden_size": config.hidden_size,
        "draft_vocab_size": config.scored_vocab_size,
        "sample_from_anchor": anchor_first,
        "sliding_window_non_causal": config.sliding_window_non_causal,
        "tie_word_embeddings": False,
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": config.num_draft_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": target_config.get("_name_or_path") or None,
                "architectures": target_config.get("architectures") or [],
            },
        },
    }
    if kind == "dspark":
        out.update(
            markov_rank=config.markov_rank,
            markov_head_type=config.markov_head_type or "vanilla",
            enable_confidence_head=config.enable_confidence_head,
            confidence_head_with_markov=config.confidence_head_with_markov,
        )
    return out
