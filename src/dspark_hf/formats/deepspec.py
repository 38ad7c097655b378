"""DeepSpec layout (`deepseek-ai/dspark_qwen3_4b_block7`): the target's config plus the draft fields.

`architectures: ["Qwen3DSparkModel"]`, flat Qwen3 layer fields with `num_hidden_layers`
the draft depth, `target_layer_ids` in DeepSpec indexing, `block_size` draft tokens
(slot k-1 predicts the token k after the anchor). Tensor names have no prefix and are
the core model's own. A pruned draft vocabulary, which DeepSpec itself never writes, is
stored the speculators way: `draft_vocab_size`, `lm_head.weight` [draft vocab, d], `d2t`, `t2d`.
"""

from __future__ import annotations

from typing import Optional

from ..core.config import CheckpointError, DSparkConfig
from .common import fixed_convention, head_fields, layer_config, layer_fields, need

NAME = "deepspec"
ARCHITECTURE = "Qwen3DSparkModel"
LAYER_ID_FIELD, LAYER_ID_OFFSET = "target_layer_ids", 0
# Fields of the target's config that describe the target's own files, not the drafter's.
TARGET_ONLY_FIELDS = {
    "auto_map", "quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "dtype",
    "torch_dtype", "id2label", "label2id", "architectures", "output_hidden_states", "return_dict",
    "chunk_size_feed_forward", "problem_type", "output_attentions", "use_cache",
}


def matches(raw: dict) -> bool:
    return ARCHITECTURE in (raw.get("architectures") or [])


def read_config(raw: dict, source: str, sample_from_anchor: Optional[bool] = None) -> DSparkConfig:
    fixed_convention(NAME, True, sample_from_anchor)
    return DSparkConfig(
        **layer_fields(raw, source),
        **head_fields(raw, source),
        vocab_size=int(need(raw, "vocab_size", source)),
        num_target_layers=int(need(raw, "num_target_layers", source)),
        target_layer_ids=need(raw, "target_layer_ids", source),
        block_size=int(need(raw, "block_size", source)),
        mask_token_id=int(need(raw, "mask_token_id", source)),
        draft_vocab_size=raw.get("draft_vocab_size"),
        first_draft_index=0,
        source_format=NAME,
    )


def config_dict(config: DSparkConfig, target_config: dict) -> dict:
    """The target's config copied, overridden by the drafter's fields."""
    if config.first_draft_index != 0:
        raise CheckpointError(
            "The DeepSpec layout holds anchor-first drafters only (the anchor slot predicts the next token); "
            "save this 1+N drafter with format='speculators'."
        )
    out = {
        key: value
        for key, value in target_config.items()
        if key not in TARGET_ONLY_FIELDS
    }
    out.update(layer_config(config))
    out.update(
        model_type="qwen3",
        architectures=[ARCHITECTURE],
        rope_theta=config.rope_parameters.get("rope_theta"),
        num_target_layers=config.num_target_layers,
        target_layer_ids=list(config.target_layer_ids),
        block_size=config.block_size,
        mask_token_id=config.mask_token_id,
        markov_rank=config.markov_rank,
        enable_confidence_head=config.enable_confidence_head,
        tie_word_embeddings=False,
    )
    if config.markov_rank > 0:
        out["markov_head_type"] = config.markov_head_type
    if config.enable_confidence_head:
        out["confidence_head_with_markov"] = config.confidence_head_with_markov
    if config.pruned:
        out["draft_vocab_size"] = config.draft_vocab_size
    return out
