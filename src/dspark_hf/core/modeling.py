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
from .trace import CallTrace, RoundRecord


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
    """RoPE tables at absolute positions; non-default scalings come from transformers' own rules.

    `inv_freq` stays float32 whatever dtype the drafter is cast to: bf16 would round the
    frequencies, and the rounding error grows with the position."""

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
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.tables: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # cos/sin at positions 0.., see table()

    def _apply(self, fn, recurse=True):
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device)  # follow device moves, never dtype casts
        self.tables = None
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[..., None].float() * self.inv_freq.to(positions.device)
        angles = torch.cat((angles, angles), dim=-1)
        return (angles.cos() * self.attention_scaling).to(dtype), (angles.sin() * self.attention_scaling).to(dtype)

    def table(self, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [>= length, head_dim] at positions 0, 1, ...: computed once, doubled when outgrown."""
        tables = self.tables
        if tables is None or tables[0].shape[0] < length or tables[0].dtype != dtype:
            size = max(length, 2 * tables[0].shape[0] if tables is not None else 0)
            tables = self.tables = self(torch.arange(size, device=self.inv_freq.device), dtype)
        return tables


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

    def forward(self, x, cos, sin, context_kv, mask=None, block_in_cache=False):
        """`context_kv`: the context's keys and values, which the block's follow. With `block_in_cache`
        they are views of a ContextCache's storage ending in one block's free slots: the block's keys
        and values are written there, so the context is never copied."""
        queries = apply_rotary(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), cos, sin)
        block_keys, block_values = self.keys_values(x, cos, sin)
        keys, values = context_kv
        if block_in_cache:
            keys[:, :, -x.shape[1] :] = block_keys
            values[:, :, -x.shape[1] :] = block_values
        else:
            keys, values = torch.cat((keys, block_keys), dim=2), torch.cat((values, block_values), dim=2)
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

    def forward(self, x, cos, sin, context_kv, mask=None, block_in_cache=False):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context_kv, mask, block_in_cache)
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
    """One drafting pass: every token proposed, the distribution each came from, and its survival estimate.

    All on the drafter's device: reading them is the caller's choice (and its host sync)."""

    draft_ids: torch.Tensor  # [n] long: proposed target token ids, left to right
    draft_logits: Optional[torch.Tensor]  # [n, vocab] float32 logits whose softmax is q; None when not kept
    confidences: Optional[torch.Tensor]  # [n] float32 c_k, or None without a confidence head


class ContextCache:
    """Keys/values of the committed context per draft layer, in storage allocated once and written in place.

    Context token i sits in slot i, at position i. A drafting pass writes its block's keys and
    values into the free slots right after the context (the next append overwrites them), so a
    round copies its new tokens only, whatever the context length. The storage takes the dtype
    and device of the first keys appended, and doubles when outgrown.
    """

    def __init__(self, capacity: int = 0):
        # slots per layer: a generate() call of max_length tokens never outgrows max_length + block_size
        self.capacity = capacity
        self.length = 0
        self.keys: list[torch.Tensor] = []  # per layer [1, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []

    def __len__(self) -> int:
        return self.length

    def append(self, per_layer_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Add the keys/values [1, kv_heads, n, head_dim] of n new context tokens, at positions len(self)..."""
        count = per_layer_kv[0][0].shape[2]
        end = self.length + count
        self.reserve(end, per_layer_kv)
        for keys, values, (new_keys, new_values) in zip(self.keys, self.values, per_layer_kv):
            keys[:, :, self.length : end] = new_keys
            values[:, :, self.length : end] = new_values
        self.length = end

    def reserve(self, slots: int, like: Optional[list[tuple[torch.Tensor, torch.Tensor]]] = None) -> None:
        """Make room for `slots` tokens per layer: allocate (shaped like `like`) or double the storage."""
        if self.keys and slots <= self.capacity:
            return
        like = like or list(zip(self.keys, self.values))
        if not like:
            raise ValueError("The context cache is empty: append the context's keys/values before drafting.")
        size = max(slots, self.capacity, 2 * self.capacity if self.keys else 0)

        def grown(old: Optional[torch.Tensor], template: torch.Tensor) -> torch.Tensor:
            # zeros, not empty: masked slots still enter attention's matmul, and 0 * NaN would leak
            storage = template.new_zeros((*template.shape[:2], size, template.shape[3]))
            if old is not None:
                storage[:, :, : self.length] = old[:, :, : self.length]
            return storage

        olds = list(zip(self.keys, self.values)) or [(None, None)] * len(like)
        self.keys = [grown(old, template) for (old, _), (template, _) in zip(olds, like)]
        self.values = [grown(old, template) for (_, old), (_, template) in zip(olds, like)]
        self.capacity = size

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[index][:, :, : self.length], self.values[index][:, :, : self.length]


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
        self.last_call: Optional[CallTrace] = None  # the latest generate() call's own record, made by that call
        self.compiled_pass: Optional[Callable] = None  # draft_pass compiled by compile_draft()
        self.calibration = None  # STS temperatures, read from dspark_calibration.json when the checkpoint has one
        self.cost_table = None  # verify/draft timings for the cost scheduler: profiled on first use, or assigned

    @property
    def last_trace(self) -> list[RoundRecord]:
        """The latest generate() call's RoundRecords, one per drafting round."""
        return self.last_call.rounds if self.last_call is not None else []

    @property
    def last_scheduler(self) -> Optional[str]:
        """The scheduler the latest generate() call used ("auto" resolved)."""
        return self.last_call.scheduler if self.last_call is not None else None

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
        size = self.config.block_size
        anchors = block_positions.reshape(-1)[::size].to(self.device)
        context_positions = context_positions.to(self.device)
        full_mask = None if single_block else block_attention_mask(anchors, size, context_positions)
        masks = self.layer_masks(full_mask, lambda window, causal: block_attention_mask(
            anchors, size, context_positions, window, causal))
        cos, sin = self.rotary(block_positions.to(self.device), self.dtype)
        return self.run_layers(self.embed(block_ids), cos, sin, context_kv, masks)

    def layer_masks(self, full_mask, sliding_mask: Callable) -> list:
        """Each layer's mask: `full_mask` for full attention; one `sliding_mask(window, causal)` per window size."""
        causal = not self.config.sliding_window_non_causal  # sliding layers are causal inside the block unless told
        by_window = {None: full_mask}
        for index in range(len(self.layers)):
            window = self.config.layer_window(index)
            if window not in by_window:
                by_window[window] = sliding_mask(window, causal)
        return [by_window[self.config.layer_window(index)] for index in range(len(self.layers))]

    def run_layers(self, x, cos, sin, context_kv, masks, block_in_cache=False) -> torch.Tensor:
        for layer, kv, mask in zip(self.layers, context_kv, masks):
            x = layer(x, cos, sin, kv, mask, block_in_cache)
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

    def anchor_block(self, anchor_id, anchor_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`[anchor, MASK x (block_size-1)]` and its positions, as [1, block_size] tensors; `anchor_id`: int or [1]."""
        size = self.config.block_size
        if isinstance(anchor_id, int):
            anchor_id = torch.full((1,), anchor_id, device=self.device)
        masks = torch.full((size - 1,), self.config.mask_token_id, dtype=torch.long, device=self.device)
        ids = torch.cat((anchor_id.to(self.device, torch.long), masks))[None]
        positions = torch.arange(anchor_position, anchor_position + size, device=self.device)[None]
        return ids, positions

    # ------------------------------------------------------------- drafting
    @torch.no_grad()
    def draft(self, anchor_id, anchor_position: int, cache: ContextCache, choose: DraftTokenChooser) -> DraftBlock:
        """Propose a block after the anchor (a [1] tensor, or an int) that follows the context in `cache`.

        Sets up the round from host-side sizes only, then runs `draft_pass`. The host never waits
        for the device: the block comes back as device tensors.
        """
        length, size = len(cache), self.config.block_size
        if anchor_position != length:
            raise ValueError(f"The anchor is at position {anchor_position}, but the context cache holds {length} "
                             "tokens: drafting continues the cached context.")
        block_ids, positions = self.anchor_block(anchor_id, anchor_position)
        cache.reserve(length + size)
        # Compiled: attend over the whole storage, masked, so that shapes do not change from round to round.
        # Processors that read the running prefix see a longer one each round: they run eagerly.
        compiled = self.compiled_pass is not None and choose.prefix_free
        span = cache.capacity - size if compiled else length  # context slots attention reads
        cos, sin = (table[positions] for table in self.rotary.table(length + size, self.dtype))
        anchor, slots = positions[0, :1], torch.arange(span, device=self.device)
        full_mask = block_attention_mask(anchor, size, slots) if compiled else None
        masks = self.layer_masks(full_mask, lambda window, causal: block_attention_mask(
            anchor, size, slots, window, causal))
        kv = [(k[:, :, : span + size], v[:, :, : span + size]) for k, v in zip(cache.keys, cache.values)]
        run = self.compiled_pass if compiled else self.draft_pass
        draft_ids, confidences = run(block_ids, cos, sin, kv, masks, choose)
        return DraftBlock(draft_ids, choose.q_logits(), confidences)

    def draft_pass(self, block_ids, cos, sin, kv, masks, choose: DraftTokenChooser):
        """A round's tensor work: the block's hidden states, its tokens, their confidences -> (ids [n], c [n] or None).

        A drafter without a Markov head chooses the whole block at once (its tokens depend on
        nothing drafted before them) unless a processor reads the running prefix."""
        x = self.embed(block_ids)
        hidden = self.run_layers(x, cos, sin, kv, masks, block_in_cache=True)[0, self.config.first_draft_index :]
        base_logits = self.draft_logits(hidden).float()
        if self.markov_head is None and choose.prefix_free:
            _, confidence_logits, _ = self.head_step(hidden, None)
            draft_ids = choose(base_logits)
        else:
            previous, state, chosen, confidence_logits = block_ids[0, :1], None, [], []
            for k in range(hidden.shape[0]):
                bias, confidence_logit, state = self.head_step(hidden[k : k + 1], previous, state)
                previous = choose(base_logits[k : k + 1] if bias is None else base_logits[k : k + 1] + bias.float())
                chosen.append(previous)
                confidence_logits.append(confidence_logit)
            draft_ids = torch.cat(chosen)
            confidence_logits = None if self.confidence_head is None else torch.cat(confidence_logits)
        return draft_ids, None if confidence_logits is None else torch.sigmoid(confidence_logits.float())

    def compile_draft(self, **options) -> "DraftModel":
        """Compile `draft_pass` with torch.compile(fullgraph=True); `options` go to torch.compile.

        The compiled pass attends over the cache's whole storage behind a mask, so it compiles
        once per cache size and chooser setting rather than once per context length."""
        self.compiled_pass = torch.compile(self.draft_pass, fullgraph=True, dynamic=False, **options)
        return self

    def generate(self, *args, **kwargs):
        raise TypeError(
            "A DSpark drafter does not generate on its own: load it with DSparkDrafter.from_pretrained(path, target) "
            "(or call dspark_hf.core.generation.attach_to_target(target) for one built by hand), then call "
            "target.generate(..., assistant_model=drafter)."
        )
