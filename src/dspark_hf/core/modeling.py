"""The DSpark drafter, top to bottom: one definition for inference and training.

A drafter reads the target's hidden states at `target_layer_ids`, compresses them
into a context (`fc` + `hidden_norm`), and runs a few non-causal decoder layers
over one block `[anchor, MASK, ...]` that attends to that context. The target's
own embedding turns block tokens into vectors, and the target's LM head turns
vectors into logits; the drafter borrows both and never holds a copy. On top sit
two optional heads:

* the Markov head adds a bias that depends on the previous draft token, so draft
  tokens are chosen left to right instead of independently;
* the confidence head estimates, per draft token, the chance it survives.

A drafter with a pruned draft vocabulary (`config.draft_vocab_size`) scores only
those tokens, through an LM head of its own and a smaller Markov `W2`; `d2t` maps
its indices back to target token ids.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .config import DSparkConfig
from .sampling import DraftTokenChooser
from .scheduling import default_generation_config


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like the Qwen3/Llama targets do, so bf16 drafters match their training numerics.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Rotary(nn.Module):
    """RoPE tables at absolute positions; non-default scalings come from transformers' own rules."""

    def __init__(self, config: DSparkConfig):
        super().__init__()
        params = config.rope_parameters
        if params.get("rope_type", "default") == "default":
            dim = config.head_dim
            inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            self.attention_scaling = 1.0
        else:
            from transformers import Qwen3Config
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            rope_config = Qwen3Config(
                hidden_size=config.hidden_size,
                num_attention_heads=config.num_attention_heads,
                head_dim=config.head_dim,
                max_position_embeddings=config.max_position_embeddings,
                rope_parameters=dict(params),
            )
            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](rope_config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[..., None].float() * self.inv_freq.to(positions.device)
        angles = torch.cat((angles, angles), dim=-1)
        return (angles.cos() * self.attention_scaling).to(dtype), (angles.sin() * self.attention_scaling).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, heads, seq, head_dim]; cos/sin: [batch, seq, head_dim]."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def block_attention_mask(
    anchors: torch.Tensor, block_size: int, context_positions: torch.Tensor, window=None, causal: bool = False
) -> torch.Tensor:
    """[1, 1, nb*B, T + nb*B] boolean: what each token of the blocks anchored at `anchors` attends to.

    Block b sees the context before its anchor (with a sliding `window`: only the `window`
    positions right before it, whatever the slot) and its own block (with `causal`: only
    its own and earlier slots). One mask serves inference (one block) and training (many).
    """
    num_blocks = len(anchors)
    context = context_positions[None, :] < anchors[:, None]  # [nb, T]
    if window is not None:
        context &= context_positions[None, :] >= anchors[:, None] - window
    context = context.repeat_interleave(block_size, dim=0)
    block_of = torch.arange(num_blocks, device=anchors.device).repeat_interleave(block_size)
    sees_block = block_of[:, None] == block_of[None, :]
    if causal:
        slot = torch.arange(block_size, device=anchors.device).repeat(num_blocks)
        sees_block &= slot[:, None] >= slot[None, :]
    return torch.cat((context, sees_block), dim=1)[None, None]


class DraftAttention(nn.Module):
    """Queries from the block; keys/values from the context followed by the block. Not causal."""

    def __init__(self, config: DSparkConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        d, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=bias)
        identity = nn.Identity()
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else identity
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else identity

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        return x.view(*x.shape[:2], count, self.head_dim).transpose(1, 2)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys = apply_rotary(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        return keys, self._heads(self.v_proj(x), self.num_kv_heads)

    def forward(self, x, cos, sin, context_kv, mask=None):
        queries = apply_rotary(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), cos, sin)
        block_keys, block_values = self.keys_values(x, cos, sin)
        keys = torch.cat((context_kv[0], block_keys), dim=2)
        values = torch.cat((context_kv[1], block_values), dim=2)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class DraftLayer(nn.Module):
    def __init__(self, config: DSparkConfig):
        super().__init__()
        d = config.hidden_size
        self.input_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.self_attn = DraftAttention(config)
        self.post_attention_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.mlp = nn.ModuleDict(
            {
                "gate_proj": nn.Linear(d, config.intermediate_size, bias=False),
                "up_proj": nn.Linear(d, config.intermediate_size, bias=False),
                "down_proj": nn.Linear(config.intermediate_size, d, bias=False),
            }
        )

    def forward(self, x, cos, sin, context_kv, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context_kv, mask)
        h = self.post_attention_layernorm(x)
        return x + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](h)) * self.mlp["up_proj"](h))


class MarkovHead(nn.Module):
    """A low-rank bias on draft logits from the previous token: `W2(f(W1[x_{k-1}], h_k, state))`.

    W1 is indexed by target token ids; W2 scores the draft vocabulary (pruned or not)."""

    def __init__(self, config: DSparkConfig):
        super().__init__()
        rank, d = config.markov_rank, config.hidden_size
        self.kind = config.markov_head_type
        self.markov_w1 = nn.Embedding(config.vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, config.scored_vocab_size, bias=False)
        if self.kind == "gated":
            self.gate_proj = nn.Linear(d + rank, rank)
        elif self.kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + d, 3 * rank)

    def forward(self, hidden, prev_ids, state=None, token_ids=None):
        """Returns (bias over the scored vocabulary, previous-token feature W1[x], next recurrent state).

        `token_ids` restricts the bias to those rows of W2 (training on a shortlist)."""
        prev_feature = self.markov_w1(prev_ids)
        if self.kind == "vanilla":
            mixed = prev_feature
        elif self.kind == "gated":
            mixed = torch.sigmoid(self.gate_proj(torch.cat((hidden, prev_feature), dim=-1))) * prev_feature
        else:
            if state is None:
                state = torch.zeros_like(prev_feature)
            gate, candidate, output = self.joint_proj(torch.cat((state, prev_feature, hidden), dim=-1)).chunk(3, dim=-1)
            keep = torch.sigmoid(gate)
            state = keep * state + (1 - keep) * torch.tanh(candidate)
            mixed = torch.tanh(output)
        weight = self.markov_w2.weight if token_ids is None else self.markov_w2.weight[token_ids]
        return F.linear(mixed, weight), prev_feature, state


@dataclasses.dataclass
class DraftBlock:
    """One drafting pass: every token proposed, the distribution each came from, and its survival estimate."""

    draft_ids: torch.Tensor  # [n] proposed target token ids, left to right
    draft_logits: Optional[torch.Tensor]  # [n, vocab] float32 logits whose softmax is q; None when greedy
    confidences: Optional[torch.Tensor]  # [n] c_k, or None without a confidence head


class ContextCache:
    """Per-layer keys/values of committed context only, and their positions; block keys/values never enter it."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.positions: Optional[torch.Tensor] = None  # [T] position of each cached token

    def __len__(self) -> int:
        return 0 if self.positions is None else len(self.positions)

    def append(self, per_layer_kv: list[tuple[torch.Tensor, torch.Tensor]], positions: torch.Tensor) -> None:
        if not self.keys:
            self.keys, self.values = [k for k, _ in per_layer_kv], [v for _, v in per_layer_kv]
            self.positions = positions
            return
        self.keys = [torch.cat((old, new), dim=2) for old, (new, _) in zip(self.keys, per_layer_kv)]
        self.values = [torch.cat((old, new), dim=2) for old, (_, new) in zip(self.values, per_layer_kv)]
        self.positions = torch.cat((self.positions, positions))

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[index], self.values[index]


class DraftModel(nn.Module):
    """A DSpark or DFlash drafter bound to the target whose embedding and LM head it shares.

    Users get one through `dspark_hf.DSparkDrafter.from_pretrained(name_or_path, target)`,
    which adds loading and saving in every published layout to this class.
    """

    def __init__(self, config: DSparkConfig, target: nn.Module):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.fc = nn.Linear(len(config.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rotary = Rotary(config)
        self.markov_head = MarkovHead(config) if config.markov_rank > 0 else None
        if config.enable_confidence_head:
            width = d + (config.markov_rank if config.confidence_head_with_markov else 0)
            self.confidence_head = nn.ModuleDict({"proj": nn.Linear(width, 1)})
        else:
            self.confidence_head = None
        if config.pruned:
            # The drafter's own head over its vocabulary, and d2t: target id = draft index + d2t[draft index].
            self.lm_head = nn.Linear(d, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        # Kept outside nn.Module registration: the target owns these, so state_dict(),
        # parameters() and .to() of the drafter never see or copy them.
        self.__dict__["target"] = target
        self.generation_config = default_generation_config(config)
        self.last_trace: list = []  # one RoundRecord per drafting round of the latest generate() call
        self.last_scheduler: Optional[str] = None  # the scheduler that call used ("auto" resolved)
        self.on_round: Optional[Callable] = None  # called with each RoundRecord as soon as its round ends
        self.calibration = None  # STS temperatures, read from dspark_calibration.json when the checkpoint has one
        self.cost_table = None  # verify/draft timings for the cost scheduler: profiled on first use, or assigned

    # ---------------------------------------------------------- shared modules
    @property
    def embed_tokens(self) -> nn.Module:
        return self.target.get_input_embeddings()

    @property
    def target_lm_head(self) -> nn.Module:
        return self.target.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def draft_token_ids(self) -> Optional[torch.Tensor]:
        """The target id of each draft-vocabulary index, or None when the drafter scores the whole vocabulary."""
        if not self.config.pruned:
            return None
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight
        return F.embedding(ids.to(weight.device), weight).to(self.device, self.dtype)

    def vocab_logits(self, hidden: torch.Tensor, token_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits through the target's LM head; `token_ids` scores only those tokens (training on a shortlist)."""
        head = self.target_lm_head
        hidden = hidden.to(head.weight.device, head.weight.dtype)
        if token_ids is None:
            return head(hidden).to(self.device)
        bias = None if head.bias is None else head.bias[token_ids]
        return F.linear(hidden, head.weight[token_ids], bias).to(self.device)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base logits over what the drafter scores: its own pruned head, or the target's full one."""
        return self.lm_head(hidden) if self.config.pruned else self.vocab_logits(hidden)

    # ------------------------------------------------------------- the math
    def context_kv(self, layer_hidden: list[torch.Tensor], positions: torch.Tensor):
        """Target features [b, t, d] per selected layer at `positions` [b, t] -> keys/values for every draft layer."""
        features = torch.cat([h.to(self.device, self.dtype) for h in layer_hidden], dim=-1)
        context = self.hidden_norm(self.fc(features))
        cos, sin = self.rotary(positions.to(self.device), self.dtype)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def backbone(self, block_ids, block_positions, context_kv, context_positions, single_block=False) -> torch.Tensor:
        """The parallel pass: blocks [1, nb*B] at positions [1, nb*B] over a context at `context_positions` [T]
        -> normed hidden states [1, nb*B, d]. Each block starts with its anchor.

        `single_block`: one block whose context all lies before its anchor (inference), so
        full-attention layers need no mask at all."""
        x = self.embed(block_ids)
        cos, sin = self.rotary(block_positions.to(self.device), self.dtype)
        size = self.config.block_size
        anchors = block_positions.reshape(-1)[::size].to(self.device)
        context_positions = context_positions.to(self.device)
        full_mask = None if single_block else block_attention_mask(anchors, size, context_positions)
        for index, (layer, kv) in enumerate(zip(self.layers, context_kv)):
            window = self.config.layer_window(index)
            mask = full_mask
            if window is not None:  # sliding layers: the window, and causal inside the block unless told otherwise
                causal = not self.config.sliding_window_non_causal
                mask = block_attention_mask(anchors, size, context_positions, window, causal)
            x = layer(x, cos, sin, kv, mask)
        return self.norm(x)

    def head_step(self, hidden, prev_ids, state=None, token_ids=None):
        """One sequential step: (Markov bias or None, confidence logit or None, next state)."""
        bias, prev_feature = None, None
        if self.markov_head is not None:
            bias, prev_feature, state = self.markov_head(hidden, prev_ids, state, token_ids)
        confidence_logit = None
        if self.confidence_head is not None:
            features = hidden
            if self.config.confidence_head_with_markov:
                features = torch.cat((hidden, prev_feature), dim=-1)
            confidence_logit = self.confidence_head["proj"](features).squeeze(-1)
        return bias, confidence_logit, state

    def anchor_block(self, anchor_id: int, anchor_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`[anchor, MASK x (block_size-1)]` and its positions, as [1, block_size] tensors."""
        size = self.config.block_size
        ids = torch.full((1, size), self.config.mask_token_id, dtype=torch.long, device=self.device)
        ids[0, 0] = anchor_id
        positions = torch.arange(anchor_position, anchor_position + size, device=self.device)[None]
        return ids, positions

    @torch.no_grad()
    def draft(self, anchor_id: int, anchor_position: int, cache: ContextCache, choose: DraftTokenChooser) -> DraftBlock:
        """One parallel pass, then the sequential head left to right, then the confidences.

        `choose(logits)` turns step k's logits over the scored vocabulary (base + Markov
        bias) into a target token id, and keeps the distribution q it drew from.
        """
        block_ids, positions = self.anchor_block(anchor_id, anchor_position)
        kv = [cache.layer(i) for i in range(len(self.layers))]
        hidden = self.backbone(block_ids, positions, kv, cache.positions, single_block=True)
        hidden = hidden[0, self.config.first_draft_index :]
        base_logits = self.draft_logits(hidden).float()
        prev = torch.tensor([anchor_id], device=self.device)
        state, draft_ids, confidence_logits = None, [], []
        for k in range(hidden.shape[0]):
            bias, confidence_logit, state = self.head_step(hidden[k : k + 1], prev, state)
            token = choose(base_logits[k] if bias is None else base_logits[k] + bias[0].float())
            draft_ids.append(token)
            if confidence_logit is not None:
                confidence_logits.append(confidence_logit)
            prev = torch.tensor([token], device=self.device)
        confidences = torch.sigmoid(torch.cat(confidence_logits).float()) if confidence_logits else None
        return DraftBlock(torch.tensor(draft_ids), choose.q_logits(), confidences)

    def generate(self, *args, **kwargs):
        raise TypeError(
            "A DSpark drafter does not generate on its own: load it with DSparkDrafter.from_pretrained(path, target) "
            "(or call dspark_hf.core.generation.attach_to_target(target) for one built by hand), then call "
            "target.generate(..., assistant_model=drafter)."
        )
