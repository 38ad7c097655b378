"""z-lab DFlash layout (`z-lab/Qwen3-4B-DFlash-b16`): a Qwen3 layer config plus `dflash_config`.

`architectures: ["DFlashDraftModel"]` (its `auto_map` code is never run), `block_size` at the
top level or in `dflash_config`, `dflash_config.{mask_token_id, target_layer_ids}` (DeepSpec
indexing; z-lab's default rule when absent). No heads, no embedding or LM head. The block is
1+N: the anchor slot predicts nothing and mask slot k predicts the token k after the anchor.
"""

from __future__ import annotations

from typing import Optional

from ..core.config import CheckpointError, DSparkConfig
from .common import dflash_layer_fields, fixed_convention, layer_fields, need

NAME = "zlab"
ARCHITECTURE = "DFlashDraftModel"
LAYER_ID_FIELD, LAYER_ID_OFFSET = "dflash_config.target_layer_ids", 0


def matches(raw: dict) -> bool:
    return ARCHITECTURE in (raw.get("architectures") or []) and "speculators_model_type" not in raw


def read_config(raw: dict, source: str, sample_from_anchor: Optional[bool] = None) -> DSparkConfig:
    fixed_convention(NAME, False, sample_from_anchor)
    layers = layer_fields(raw, source)
    dflash = raw.get("dflash_config") or {}
    block_size = raw.get("block_size", dflash.get("block_size"))
    if block_size is None:
        raise CheckpointError(f"{source}: required field 'block_size' (or 'dflash_config.block_size') is missing.")
    return DSparkConfig(
        **layers,
        vocab_size=int(need(raw, "vocab_size", source)),
        **dflash_layer_fields(raw, source, layers["num_hidden_layers"]),
        block_size=int(block_size),
        mask_token_id=int(need(dflash, "mask_token_id", source, "dflash_config.")),
        first_draft_index=1,
        source_format=NAME,
    )
