"""SpecForge DSpark layout (`RadixArk/Kimi-K3-DSpark`): a flat Qwen3 config with a nested `dflash_config`.

`architectures: ["DSparkDraftModel"]`, top-level `block_size` and `num_target_layers`, and
`dflash_config` holding `mask_token_id`, `target_layer_ids` (DeepSpec indexing), the head
fields and `projector_type: "dspark"` (`attention_mode` only checks head counts). Tensor names
are the core's; the target's embedding and LM head are reused. SpecForge's DFlash drafters
are z-lab's layout (`DFlashDraftModel`) and read as such.

Block convention: SpecForge trains DSpark anchor-first (slot k-1 learns the token k after the
anchor, with the anchor as the first Markov input), so that is how these drafters are read,
although its own generation helper slices them 1+N. `from_pretrained(...,
sample_from_anchor=False)` reads one as 1+N.
"""

from __future__ import annotations

from typing import Optional

from ..core.config import CheckpointError, DSparkConfig
from .common import dflash_layer_fields, head_fields, layer_fields, need

NAME = "specforge"
ARCHITECTURE = "DSparkDraftModel with dflash_config"
LAYER_ID_FIELD, LAYER_ID_OFFSET = "dflash_config.target_layer_ids", 0


def matches(raw: dict) -> bool:
    """`DSparkDraftModel`, or (SpecForge's first DSpark exports, July 2026) `DFlashDraftModel` with the DSpark projector."""
    nested = raw.get("dflash_config")
    if not isinstance(nested, dict) or "speculators_model_type" in raw:
        return False
    architectures = raw.get("architectures") or []
    return "DSparkDraftModel" in architectures or (
        "DFlashDraftModel" in architectures and nested.get("projector_type") == "dspark"
    )


def read_config(raw: dict, source: str, sample_from_anchor: Optional[bool] = None) -> DSparkConfig:
    layers = layer_fields(raw, source)
    nested = raw["dflash_config"]
    projector = nested.get("projector_type", "dspark")
    if projector not in ("dspark", "dflash"):
        raise CheckpointError(
            f"{source}: field 'dflash_config.projector_type' is {projector!r}; dspark_hf reads 'dspark' (and "
            "'dflash') drafters."
        )
    heads = dict(nested)
    heads.setdefault("enable_confidence_head", float(nested.get("confidence_head_alpha", 0.0)) > 0)
    return DSparkConfig(
        **layers,
        **head_fields(heads, source, "dflash_config."),
        vocab_size=int(need(raw, "vocab_size", source)),
        **dflash_layer_fields(raw, source, layers["num_hidden_layers"]),
        block_size=int(need(raw, "block_size", source)),
        mask_token_id=int(need(nested, "mask_token_id", source, "dflash_config.")),
        first_draft_index=0 if sample_from_anchor in (None, True) else 1,
        source_format=NAME,
    )
