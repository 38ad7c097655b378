"""The drafter's configuration, read from either published checkpoint format.

DeepSpec (`Qwen3DSparkModel`) and z-lab (`DFlashDraftModel`) describe the same
backbone with different field placements and one different block convention;
`DSparkConfig` is the single normalised view the rest of the package uses.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

DEEPSPEC_ARCHITECTURE = "Qwen3DSparkModel"
ZLAB_ARCHITECTURE = "DFlashDraftModel"
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")


class CheckpointError(ValueError):
    """A draft checkpoint that cannot be used: the message names the file, the field and the values."""


def zlab_default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule for checkpoints that do not list `target_layer_ids`."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclasses.dataclass
class DSparkConfig:
    """Hyper-parameters of a DSpark / DFlash drafter.

    `first_draft_index` encodes the block convention: DeepSpec reads draft token k
    from block index k-1 (the anchor slot predicts the next token), z-lab from
    block index k (each mask slot predicts itself), so a z-lab block of 16 yields
    15 draft tokens.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_parameters: dict = dataclasses.field(default_factory=lambda: {"rope_type": "default", "rope_theta": 1e6})
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    markov_rank: int = 0
    markov_head_type: Optional[str] = None
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    first_draft_index: int = 0
    source_format: str = "deepspec"
    # Generation code reads these two from any assistant's config.
    is_encoder_decoder: bool = False

    def __post_init__(self):
        # One canonical form: fields that only matter with a Markov head or confidence head are off without them.
        if self.markov_rank <= 0:
            self.markov_rank, self.markov_head_type = 0, None
        self.confidence_head_with_markov = bool(
            self.confidence_head_with_markov and self.enable_confidence_head and self.markov_rank > 0
        )

    def get_text_config(self, *args, **kwargs) -> "DSparkConfig":
        """transformers calls this on every assistant config to compare vocabularies."""
        return self

    @property
    def num_draft_tokens(self) -> int:
        return self.block_size - self.first_draft_index

    @property
    def is_dflash(self) -> bool:
        return self.markov_rank == 0 and not self.enable_confidence_head

    @classmethod
    def for_target(cls, target_config, **fields) -> "DSparkConfig":
        """A drafter shaped like the target's layers (what DeepSpec does); `fields` sets the draft-specific rest."""
        text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        raw = text.to_dict() if hasattr(text, "to_dict") else dict(text)
        heads = raw["num_attention_heads"]
        base = dict(
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab_size=raw["vocab_size"],
            num_target_layers=raw["num_hidden_layers"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_parameters=_rope_parameters(raw),
            max_position_embeddings=raw.get("max_position_embeddings", 40960),
            attention_bias=raw.get("attention_bias", False),
        )
        base.update(fields)
        return cls(**base)

    # ----------------------------------------------------------------- reading
    @classmethod
    def from_json_file(cls, path: str | Path) -> "DSparkConfig":
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: config.json is missing; a draft checkpoint needs one.")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{path}: not valid JSON ({err}).") from None
        return cls.from_checkpoint_dict(raw, source=str(path))

    @classmethod
    def from_checkpoint_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "DSparkConfig":
        architectures = raw.get("architectures") or []
        if DEEPSPEC_ARCHITECTURE in architectures:
            fmt = "deepspec"
        elif ZLAB_ARCHITECTURE in architectures:
            fmt = "zlab"
        else:
            raise CheckpointError(
                f"{source}: field 'architectures' is {architectures!r}; expected "
                f"['{DEEPSPEC_ARCHITECTURE}'] (DeepSpec) or ['{ZLAB_ARCHITECTURE}'] (z-lab DFlash)."
            )

        def need(key: str, container: dict = raw, where: str = "") -> Any:
            if key not in container:
                raise CheckpointError(f"{source}: required field '{where}{key}' is missing.")
            return container[key]

        num_layers = int(need("num_hidden_layers"))
        layer_types = raw.get("layer_types") or ["full_attention"] * num_layers
        unsupported = sorted(set(layer_types) - {"full_attention"})
        if unsupported:
            raise CheckpointError(
                f"{source}: field 'layer_types' contains {unsupported}; only 'full_attention' draft layers "
                "are supported (sliding-window drafters are not)."
            )
        heads = int(need("num_attention_heads"))
        common = dict(
            hidden_size=int(need("hidden_size")),
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads", heads)),
            head_dim=int(raw.get("head_dim") or need("hidden_size") // heads),
            vocab_size=int(need("vocab_size")),
            num_target_layers=int(need("num_target_layers")),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_parameters=_rope_parameters(raw),
            max_position_embeddings=int(raw.get("max_position_embeddings", 40960)),
            attention_bias=bool(raw.get("attention_bias", False)),
            source_format=fmt,
        )
        if fmt == "deepspec":
            rank = int(raw.get("markov_rank", 0))
            head_type = raw.get("markov_head_type", "vanilla") if rank > 0 else None
            if head_type is not None and head_type not in MARKOV_HEAD_TYPES:
                raise CheckpointError(
                    f"{source}: field 'markov_head_type' is {head_type!r}; expected one of {list(MARKOV_HEAD_TYPES)}."
                )
            confidence = bool(raw.get("enable_confidence_head", False))
            return cls(
                **common,
                target_layer_ids=[int(i) for i in need("target_layer_ids")],
                block_size=int(need("block_size")),
                mask_token_id=int(need("mask_token_id")),
                markov_rank=rank,
                markov_head_type=head_type,
                enable_confidence_head=confidence,
                confidence_head_with_markov=confidence and rank > 0 and bool(raw.get("confidence_head_with_markov", False)),
                first_draft_index=0,
            )
        dflash = raw.get("dflash_config") or {}
        block_size = raw.get("block_size", dflash.get("block_size"))
        if block_size is None:
            raise CheckpointError(f"{source}: required field 'block_size' (or 'dflash_config.block_size') is missing.")
        layer_ids = dflash.get("target_layer_ids") or zlab_default_layer_ids(common["num_target_layers"], num_layers)
        return cls(
            **common,
            target_layer_ids=[int(i) for i in layer_ids],
            block_size=int(block_size),
            mask_token_id=int(need("mask_token_id", dflash, "dflash_config.")),
            first_draft_index=1,
        )

    # ----------------------------------------------------------------- writing
    def to_deepspec_dict(self, target_config: Optional[dict] = None) -> dict[str, Any]:
        """The DeepSpec layout: the target's config copied, overridden by the drafter's fields."""
        if self.source_format != "deepspec":
            raise ValueError("Only DeepSpec-convention drafters (first_draft_index 0) can be written in DeepSpec layout.")
        out = dict(target_config or {})
        for key in ("auto_map", "quantization_config", "_name_or_path", "transformers_version"):
            out.pop(key, None)
        out.update(
            model_type="qwen3",
            architectures=[DEEPSPEC_ARCHITECTURE],
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=dict(self.rope_parameters),
            rope_theta=self.rope_parameters.get("rope_theta"),
            max_position_embeddings=self.max_position_embeddings,
            attention_bias=self.attention_bias,
            hidden_act="silu",
            num_target_layers=self.num_target_layers,
            target_layer_ids=list(self.target_layer_ids),
            block_size=self.block_size,
            mask_token_id=self.mask_token_id,
            markov_rank=self.markov_rank,
            enable_confidence_head=self.enable_confidence_head,
            tie_word_embeddings=False,
            layer_types=["full_attention"] * self.num_hidden_layers,
        )
        if self.markov_rank > 0:
            out["markov_head_type"] = self.markov_head_type
        if self.enable_confidence_head:
            out["confidence_head_with_markov"] = self.confidence_head_with_markov
        return out


def _rope_parameters(raw: dict[str, Any]) -> dict:
    """RoPE settings from either the transformers-5 `rope_parameters` or the older `rope_theta`/`rope_scaling`."""
    if isinstance(raw.get("rope_parameters"), dict):
        params = dict(raw["rope_parameters"])
    else:
        params = dict(raw.get("rope_scaling") or {})
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params.pop("type")
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    return params
