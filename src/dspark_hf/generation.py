"""Glue between the drafter and transformers' assisted-generation loop.

`target.generate(..., assistant_model=drafter)` runs transformers' own
`_assisted_decoding`: it asks a candidate generator for draft tokens, verifies them
in one target forward pass and accepts them losslessly. `attach_to_target` installs,
on that one target instance only, a `_get_candidate_generator` that returns a
`DSparkCandidateGenerator` when the assistant is a DSpark drafter and defers to the
class's own method otherwise, so no other model (or call) changes behaviour.

Scheduler settings are ordinary GenerationConfig fields. They come from the
GenerationConfig or kwargs passed to generate() when set there, else from
`drafter.generation_config`:

* `dspark_scheduler`: "threshold" (default) cuts at the first confidence below
  `assistant_confidence_threshold`; "cost" also weighs expected tokens against the
  device's cost table and skips drafting when it does not pay (see scheduling.py).
  Being a custom field, it cannot be a generate() kwarg; set it on a GenerationConfig.
* `assistant_confidence_threshold`, `num_assistant_tokens`: as in transformers.

When the drafter has STS temperatures (`drafter.calibration`), both schedulers
read calibrated confidences; the trace keeps the raw ones.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
from transformers import GenerationConfig
from transformers.generation.candidate_generator import CandidateGenerator

from .config import DSparkConfig
from .costs import CostTable, profile_costs
from .modeling import ContextCache, DraftBlock
from .sampling import DraftTokenChooser
from .scheduling import (
    COST_SCHEDULER,
    DEFAULT_CONFIDENCE_THRESHOLD,
    SCHEDULERS,
    THRESHOLD_SCHEDULER,
    DraftingGate,
    cost_aware_length,
    threshold_length,
)
from .trace import RoundRecord

SCHEDULER_FIELDS = ("assistant_confidence_threshold", "num_assistant_tokens", "dspark_scheduler")


def default_generation_config(config: DSparkConfig) -> GenerationConfig:
    """The drafter's own defaults for the scheduler fields, used when generate() does not set them."""
    return GenerationConfig(
        assistant_confidence_threshold=DEFAULT_CONFIDENCE_THRESHOLD,
        num_assistant_tokens=config.num_draft_tokens,
        dspark_scheduler=THRESHOLD_SCHEDULER,
    )


def hidden_state_indices(config: DSparkConfig) -> list[int]:
    """Where the drafter's target layers sit in `hidden_states`, whose entry 0 is the embedding output."""
    return [i + 1 for i in config.target_layer_ids]


def attach_to_target(target) -> None:
    """Route `generate(assistant_model=<DSparkDrafter>)` on this target instance to DSpark drafting."""
    if "_get_candidate_generator" in vars(target):
        return
    class_get_generator = target._get_candidate_generator
    class_prepare_config = target._prepare_generation_config

    def _prepare_generation_config(generation_config=None, **kwargs):
        # transformers fills unset fields with global defaults; remember which scheduler
        # fields the caller really set so the drafter's own defaults apply otherwise.
        prepared, model_kwargs = class_prepare_config(generation_config, **kwargs)
        prepared._dspark_explicit_fields = {
            key
            for key in SCHEDULER_FIELDS
            if key in kwargs or getattr(generation_config, key, None) is not None
        }
        return prepared, model_kwargs

    def _get_candidate_generator(generation_config, logits_processor, assistant_model=None, **kwargs):
        from .modeling import DSparkDrafter

        if isinstance(assistant_model, DSparkDrafter):
            if assistant_model.target is not target:
                raise ValueError(
                    "This DSparkDrafter shares the embedding and LM head of another model; load it with "
                    "DSparkDrafter.from_pretrained(..., target=<this model>) before passing it as assistant_model."
                )
            return DSparkCandidateGenerator(assistant_model, generation_config, logits_processor)
        return class_get_generator(
            generation_config=generation_config,
            logits_processor=logits_processor,
            assistant_model=assistant_model,
            **kwargs,
        )

    target._prepare_generation_config = _prepare_generation_config
    target._get_candidate_generator = _get_candidate_generator


def scheduler_setting(key: str, generation_config: GenerationConfig, drafter) -> Any:
    """generate() kwargs / generation_config win; otherwise the drafter's generation_config decides."""
    if key in getattr(generation_config, "_dspark_explicit_fields", ()):
        return getattr(generation_config, key)
    return getattr(drafter.generation_config, key)


def scheduler_name(generation_config: GenerationConfig, drafter) -> str:
    name = scheduler_setting("dspark_scheduler", generation_config, drafter)
    if name not in SCHEDULERS:
        raise ValueError(f"dspark_scheduler is {name!r}; expected one of {list(SCHEDULERS)}.")
    return name


def cost_table(drafter) -> CostTable:
    """`drafter.cost_table` when set (or injected), else the profiled one for this device."""
    table = drafter.cost_table or profile_costs(drafter)
    needed = drafter.config.num_draft_tokens + 1
    if len(table.verify_seconds) < needed:
        raise ValueError(
            f"The cost table has verify times for 1..{len(table.verify_seconds)} tokens; "
            f"this drafter needs 1..{needed}."
        )
    return table


class DSparkCandidateGenerator(CandidateGenerator):
    """Drafts one DSpark block per round from the target's hidden states at `target_layer_ids`.

    Round r: the hidden states the target just produced for committed tokens extend
    the draft context cache; the drafter proposes a block after the anchor (the
    target's last token); the scheduler keeps a prefix; transformers verifies it.
    With the cost scheduler a round may skip drafting and send no candidates; the
    context cache still grows, so drafting can resume. Every round, skipped or
    not, is appended to `drafter.last_trace`.
    """

    requires_model_outputs = True

    def __init__(self, drafter, generation_config: GenerationConfig, logits_processor=None):
        self.drafter = drafter
        self.hidden_indices = hidden_state_indices(drafter.config)
        # Ask the target for the layers we read only, unless the caller wants them all returned anyway.
        wanted = True if generation_config.output_hidden_states else self.hidden_indices
        self.model_kwargs_overrides = {"output_hidden_states": wanted}
        self.logits_processor = logits_processor
        self.do_sample = bool(generation_config.do_sample)
        self.max_length = generation_config.max_length
        self.threshold = float(scheduler_setting("assistant_confidence_threshold", generation_config, drafter) or 0.0)
        self.cap = int(scheduler_setting("num_assistant_tokens", generation_config, drafter))
        self.calibration = drafter.calibration
        use_costs = scheduler_name(generation_config, drafter) == COST_SCHEDULER
        self.gate = DraftingGate(cost_table(drafter)) if use_costs else None
        self.cache = ContextCache()
        self.context_tokens = 0  # sequence positions whose target hidden states are in the cache
        self.pending: Optional[dict] = None
        self.trace: list[RoundRecord] = []
        drafter.last_trace = self.trace

    def _extend_context(self, input_ids: torch.Tensor, model_kwargs: dict, model_outputs) -> None:
        """Add the target's hidden states of the newly committed tokens before the anchor."""
        new_tokens = input_ids.shape[1] - 1 - self.context_tokens
        layer_hidden = [model_outputs.hidden_states[i][:, :new_tokens] for i in self.hidden_indices]
        attention_mask = model_kwargs.get("attention_mask")
        if attention_mask is not None and self.context_tokens == 0:
            # Left padding in the prompt: padded slots are not context (the target never attends to them).
            real = attention_mask[0, :new_tokens].bool().to(layer_hidden[0].device)
            layer_hidden = [h[:, real] for h in layer_hidden]
        count = layer_hidden[0].shape[1]
        positions = torch.arange(len(self.cache), len(self.cache) + count)[None]
        self.cache.append(self.drafter.context_kv(layer_hidden, positions))
        self.context_tokens = input_ids.shape[1] - 1

    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, **kwargs):
        if is_first_iteration:
            # Prefill: the target must produce the anchor (and our context) before we can draft.
            return input_ids, None
        started = time.perf_counter()
        self._extend_context(input_ids, model_kwargs or {}, model_outputs)
        budget = min(self.cap, self.max_length - input_ids.shape[1] - 1)
        block: Optional[DraftBlock] = None
        num_verified = 0
        if budget > 0 and (self.gate is None or self.gate.should_draft()):
            chooser = DraftTokenChooser(input_ids, self.logits_processor, self.do_sample)
            block = self.drafter.draft(int(input_ids[0, -1]), len(self.cache), self.cache, chooser)
            num_verified = self._verify_length(block, budget)
        self.pending = {
            "position": input_ids.shape[1] - 1,
            "block": block,
            "num_verified": num_verified,
            "draft_seconds": time.perf_counter() - started,
            "verify_started": time.perf_counter(),
        }
        if num_verified == 0:
            return input_ids, None
        draft_ids = block.draft_ids[:num_verified].to(input_ids.device)[None]
        return torch.cat((input_ids, draft_ids), dim=-1), block.draft_logits[None, :num_verified]

    def _verify_length(self, block: DraftBlock, budget: int) -> int:
        """The threshold cut, then (cost scheduler) the expected-tokens-per-second walk within it."""
        confidences = block.confidences
        if confidences is not None and self.calibration is not None:
            confidences = self.calibration.apply(confidences)
        length = threshold_length(confidences, self.threshold, len(block.draft_ids), budget)
        if self.gate is not None:
            length = cost_aware_length(confidences, self.gate.costs, length)
        return length

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        if self.pending is None:  # the prefill round drafts nothing
            return
        pending, self.pending = self.pending, None
        block = pending["block"]
        record = RoundRecord(
            position=pending["position"],
            draft_ids=block.draft_ids.tolist() if block is not None else [],
            confidences=block.confidences.tolist() if block is not None and block.confidences is not None else [],
            num_verified=pending["num_verified"],
            num_accepted=int(num_matches),
            committed_ids=input_ids[0, pending["position"] + 1 :].tolist(),
            draft_seconds=pending["draft_seconds"],
            verify_seconds=time.perf_counter() - pending["verify_started"],
        )
        self.trace.append(record)
        if self.gate is not None:
            self.gate.record(block is not None, record.num_verified, len(record.committed_ids))
        if self.drafter.on_round is not None:
            self.drafter.on_round(record)
