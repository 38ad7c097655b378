"""`DSparkConfig`: the one normalised description of a drafter, whatever layout it was read from.

The published layouts (DeepSpec, z-lab, speculators, SpecForge) place these fields
differently and index target layers differently; `dspark_hf.formats` translates
each of them into this class, and everything else reads only this class.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
LAYER_TYPES = ("full_attention", "sliding_attention")
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")


class CheckpointError(ValueError):
    """A draft checkpoint that cannot be used: the message names the file, the field and the values."""


def zlab_default_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule for checkpoints that do not list `target_layer_ids`; also our trainer's default."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclasses.dataclass
class DSparkConfig:
    """Hyper-parameters of a DSpark / DFlash drafter.

    `target_layer_ids` use DeepSpec's indexing: id l is the output of target layer l,
    -1 the embedding output. `first_draft_index` is the block convention: 0 when
    block slot k-1 predicts the token k after the anchor (DeepSpec, speculators'
    `sample_from_anchor`), 1 when the anchor slot predicts nothing and mask slot k
    predicts token k (DFlash's 1+N), so a block of 16 yields 15 draft tokens.
    `draft_vocab_size` below `vocab_size` means a pruned draft vocabulary: the
    drafter scores only those tokens (see `DraftModel.d2t`).
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
    qk_norm: bool = True  # Qwen3-style per-head q/k RMSNorm; Llama-layer drafters have none
    layer_types: Optional[list[str]] = None  # per draft layer; None: all full attention
    sliding_window: Optional[int] = None  # context tokens before the anchor a sliding_attention layer sees
    sliding_window_non_causal: bool = False  # sliding layers see the whole block, not just earlier slots
    markov_rank: int = 0
    markov_head_type: Optional[str] = None
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    draft_vocab_size: Optional[int] = None
    first_draft_index: int = 0
    source_format: str = "deepspec"  # the layout the checkpoint was read from
    # transformers reads this from any assistant model's config.
    is_encoder_decoder: bool = False
    # The target's special tokens (`with_tokens_of`): a drafter speaks its target's tokenizer, and transformers'
    # pipelines accept an assistant only when these equal the model's. Not part of what the drafter is.
    bos_token_id: Optional[int] = dataclasses.field(default=None, compare=False)
    eos_token_id: Optional[Union[int, list[int]]] = dataclasses.field(default=None, compare=False)
    pad_token_id: Optional[int] = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        # One canonical form, so that configs read from different layouts compare equal.
        if self.markov_rank <= 0:
            self.markov_rank, self.markov_head_type = 0, None
        elif self.markov_head_type is None:
            self.markov_head_type = "vanilla"
        self.confidence_head_with_markov = bool(
            self.confidence_head_with_markov and self.enable_confidence_head and self.markov_rank > 0
        )
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if self.layer_types is None or set(self.layer_types) == {"full_attention"}:
            self.layer_types = None
        if self.layer_types is None:
            self.sliding_window, self.sliding_window_non_causal = None, False
        if self.draft_vocab_size is not None and self.draft_vocab_size >= self.vocab_size:
            self.draft_vocab_size = None

    def with_tokens_of(self, target_config) -> "DSparkConfig":
        """This config with the special token ids of the target's (text) config."""
        text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        return dataclasses.replace(self, **{key: getattr(text, key, None) for key in SPECIAL_TOKENS})

    def get_text_config(self, *args, **kwargs) -> "DSparkConfig":
        """transformers calls this on every assistant config to compare vocabularies."""
        return self

    @property
    def num_draft_tokens(self) -> int:
        return self.block_size - self.first_draft_index

    @property
    def hidden_state_indices(self) -> list[int]:
        """Where the target layers sit in transformers' `hidden_states`, whose entry 0 is the embedding output."""
        return [i + 1 for i in self.target_layer_ids]

    @property
    def pruned(self) -> bool:
        return self.draft_vocab_size is not None

    @property
    def scored_vocab_size(self) -> int:
        """How many tokens the draft LM head and the Markov head's W2 score."""
        return self.draft_vocab_size or self.vocab_size

    def layer_window(self, index: int) -> Optional[int]:
        """The sliding window of draft layer `index`, or None for full attention."""
        if self.layer_types is None or self.layer_types[index] == "full_attention":
            return None
        return self.sliding_window

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
            rope_parameters=rope_parameters(raw),
            max_position_embeddings=raw.get("max_position_embeddings", 40960),
            attention_bias=raw.get("attention_bias", False),
        )
        base.update(fields)
        return cls(**base)


def rope_parameters(raw: dict) -> dict:
    """RoPE settings from either the transformers-5 `rope_parameters` or the older `rope_theta`/`rope_scaling`."""
    if isinstance(raw.get("rope_parameters"), dict):
        params = dict(raw["rope_parameters"])
    else:
        params = dict(raw.get("rope_scaling") or {})
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    return params
