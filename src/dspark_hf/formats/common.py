"""What the layouts share: required fields, and draft layers described by a flat Qwen3/Llama-style config."""

from __future__ import annotations

from typing import Any

from ..core.config import LAYER_TYPES, MARKOV_HEAD_TYPES, CheckpointError, rope_parameters, zlab_default_layer_ids


def fixed_convention(layout: str, anchor_first: bool, requested) -> None:
    """Layouts with one block convention refuse a `sample_from_anchor` that contradicts it."""
    if requested is not None and bool(requested) != anchor_first:
        raise ValueError(
            f"sample_from_anchor={requested} does not apply: the {layout} layout is always "
            f"{'anchor-first' if anchor_first else '1+N'}; the option is for speculators and SpecForge checkpoints."
        )


def need(raw: dict, key: str, source: str, where: str = "") -> Any:
    """`raw[key]`, or an error naming the file and the missing field (`where` prefixes nested fields)."""
    if key not in raw or raw[key] is None:
        raise CheckpointError(f"{source}: required field '{where}{key}' is missing.")
    return raw[key]


def layer_fields(raw: dict, source: str, where: str = "") -> dict:
    """DSparkConfig fields of the draft layers, from an HF layer config (`num_hidden_layers` is the draft depth)."""
    num_layers = int(need(raw, "num_hidden_layers", source, where))
    heads = int(need(raw, "num_attention_heads", source, where))
    hidden = int(need(raw, "hidden_size", source, where))
    layer_types = raw.get("layer_types")
    if layer_types is not None and set(layer_types) == {"full_attention"}:
        layer_types = None  # some layouts copy the target's list, of the target's length: all full attention anyway
    if layer_types is not None:
        unknown = sorted(set(layer_types) - set(LAYER_TYPES))
        if unknown or len(layer_types) != num_layers:
            raise CheckpointError(
                f"{source}: field '{where}layer_types' is {layer_types!r}; expected {num_layers} entries, each one "
                f"of {list(LAYER_TYPES)}."
            )
    sliding = layer_types is not None and "sliding_attention" in layer_types
    return dict(
        hidden_size=hidden,
        intermediate_size=int(need(raw, "intermediate_size", source, where)),
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_parameters=rope_parameters(raw),
        max_position_embeddings=int(raw.get("max_position_embeddings", 40960)),
        attention_bias=bool(raw.get("attention_bias", False)),
        layer_types=list(layer_types) if layer_types is not None else None,
        sliding_window=int(need(raw, "sliding_window", source, where)) if sliding else None,
    )


def dflash_layer_fields(raw: dict, source: str, num_draft_layers: int) -> dict:
    """`num_target_layers` and `target_layer_ids` of a config with a nested `dflash_config` (z-lab,
    SpecForge): the ids are DeepSpec's, and z-lab's default rule fills them in when absent."""
    num_target_layers = int(need(raw, "num_target_layers", source))
    layer_ids = (raw.get("dflash_config") or {}).get("target_layer_ids")
    if layer_ids is None:
        layer_ids = zlab_default_layer_ids(num_target_layers, num_draft_layers)
    return dict(num_target_layers=num_target_layers, target_layer_ids=layer_ids)


def head_fields(raw: dict, source: str, where: str = "") -> dict:
    """The Markov and confidence head fields, which every DSpark layout names the same way."""
    rank = int(raw.get("markov_rank") or 0)
    head_type = (raw.get("markov_head_type") or "vanilla") if rank > 0 else None
    if head_type is not None and head_type not in MARKOV_HEAD_TYPES:
        raise CheckpointError(
            f"{source}: field '{where}markov_head_type' is {head_type!r}; expected one of {list(MARKOV_HEAD_TYPES)}."
        )
    confidence = bool(raw.get("enable_confidence_head", False))
    return dict(
        markov_rank=rank,
        markov_head_type=head_type,
        enable_confidence_head=confidence,
        confidence_head_with_markov=bool(raw.get("confidence_head_with_markov", False)),
    )


def layer_config(config) -> dict:
    """The flat HF fields describing the draft layers of a DSparkConfig (the inverse of `layer_fields`)."""
    out = dict(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=dict(config.rope_parameters),
        max_position_embeddings=config.max_position_embeddings,
        attention_bias=config.attention_bias,
        hidden_act="silu",
        layer_types=list(config.layer_types or ["full_attention"] * config.num_hidden_layers),
    )
    if config.sliding_window is not None:
        out["sliding_window"] = config.sliding_window
    return out
