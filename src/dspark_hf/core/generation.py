"""Glue between the drafter and transformers' assisted-generation loop.

`target.generate(..., assistant_model=drafter)` runs transformers' own
`_assisted_decoding`: it asks a candidate generator for draft tokens, verifies them
in one target forward pass and accepts them losslessly. `attach_to_target` installs,
on that one target instance only, a `_get_candidate_generator` that returns a
`DSparkCandidateGenerator` when the assistant is a DSpark drafter and defers to the
class's own method otherwise, so no other model (or call) changes behaviour.

Scheduler settings are GenerationConfig fields. A value passed to generate() (as a
kwarg or in a GenerationConfig) wins; otherwise `drafter.generation_config` decides:

* `dspark_scheduler`: "threshold" cuts at the first confidence below
  `assistant_confidence_threshold`; "cost" also weighs expected tokens against the
  device's cost table and skips drafting when it does not pay (see scheduling.py);
  "auto", the default, profiles the device once and picks one of the two.
* `assistant_confidence_threshold`, `num_assistant_tokens`: as in transformers.

When the drafter has STS temperatures (`drafter.calibration`), both schedulers
read calibrated confidences; the trace keeps the raw ones.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Optional

import torch
from transformers import GenerationConfig
from transformers.generation.candidate_generator import CandidateGenerator

from .costs import profile_costs, synchronize
from .modeling import ContextCache, DraftBlock, DraftModel
from .sampling import DraftTokenChooser
from .scheduling import (
    AUTO_SCHEDULER,
    COST_SCHEDULER,
    SCHEDULERS,
    THRESHOLD_SCHEDULER,
    CostTable,
    DraftingGate,
    cost_aware_length,
    threshold_length,
)
from .trace import RoundRecord

SCHEDULER_FIELDS = ("assistant_confidence_threshold", "num_assistant_tokens", "dspark_scheduler")


def attach_to_target(target) -> None:
    """Route `generate(assistant_model=<DSpark drafter>)` on this target instance to DSpark drafting."""
    if "_get_candidate_generator" in vars(target):
        return
    class_get_generator = target._get_candidate_generator
    class_prepare_config = target._prepare_generation_config

    def _prepare_generation_config(generation_config=None, **kwargs):
        # transformers fills unset fields with global defaults; remember which scheduler
        # fields the caller really set, so that the drafter's own defaults apply otherwise.
        # `dspark_scheduler` is not a GenerationConfig attribute, so transformers would
        # treat it as a model kwarg: it is taken out here and set on the config.
        scheduler = kwargs.pop("dspark_scheduler", None)
        prepared, model_kwargs = class_prepare_config(generation_config, **kwargs)
        if scheduler is not None:
            prepared.dspark_scheduler = scheduler
        prepared._dspark_explicit_fields = {
            key
            for key in SCHEDULER_FIELDS
            if key in kwargs or getattr(generation_config, key, None) is not None
        } | ({"dspark_scheduler"} if scheduler is not None else set())
        return prepared, model_kwargs

    def _get_candidate_generator(generation_config, logits_processor, assistant_model=None, **kwargs):
        if isinstance(assistant_model, DraftModel):
            if assistant_model.target is not target:
                raise ValueError(
                    "This drafter shares the embedding and LM head of another model; load it with "
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
    """The scheduler this call uses; "auto" resolved through the device's cost table."""
    name = scheduler_setting("dspark_scheduler", generation_config, drafter)
    if name not in SCHEDULERS:
        raise ValueError(f"dspark_scheduler is {name!r}; expected one of {list(SCHEDULERS)}.")
    if name == AUTO_SCHEDULER:
        wins = cost_table(drafter).prefers_cost_scheduler(drafter.config.num_draft_tokens)
        name = COST_SCHEDULER if wins else THRESHOLD_SCHEDULER
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


def forget_prefilled_cache(cache) -> None:
    """Empty a cache that generate() was given already holding the prompt's start (prefix caching).

    transformers' assisted decoding (5.24) feeds the whole prompt at its first step even when
    the cache holds part of it, which would read that part twice and change the target's
    output; the drafter also needs the target's features of every context token. So the
    prompt is read once more from scratch: correct, at the price of the prefix the cache held.
    """
    if cache is not None and cache.get_seq_length() > 0:
        warnings.warn(
            f"generate() got a cache already holding {cache.get_seq_length()} tokens; DSpark drafting reads the "
            "whole prompt again (transformers' assisted decoding cannot start from a prefilled cache).",
            stacklevel=4,
        )
        cache.crop(-cache.get_seq_length())


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

    def __init__(self, drafter: DraftModel, generation_config: GenerationConfig, logits_processor=None):
        self.drafter = drafter
        self.hidden_indices = drafter.config.hidden_state_indices
        # Ask the target for the layers we read only, unless the caller wants them all returned anyway.
        wanted = True if generation_config.output_hidden_states else self.hidden_indices
        self.model_kwargs_overrides = {"output_hidden_states": wanted}
        self.logits_processor = logits_processor
        self.do_sample = bool(generation_config.do_sample)
        # Greedy verification compares token ids only; q is needed to sample or to ensemble.
        self.keep_q = self.do_sample or generation_config.assistant_ensemble_weight is not None
        self.max_length = generation_config.max_length
        self.threshold = float(scheduler_setting("assistant_confidence_threshold", generation_config, drafter) or 0.0)
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"assistant_confidence_threshold is {self.threshold}; expected a value in [0, 1].")
        self.cap = int(scheduler_setting("num_assistant_tokens", generation_config, drafter))
        self.calibration = drafter.calibration
        self.scheduler = scheduler_name(generation_config, drafter)
        drafter.last_scheduler = self.scheduler
        self.gate = DraftingGate(cost_table(drafter)) if self.scheduler == COST_SCHEDULER else None
        self.draft_token_ids = drafter.draft_token_ids()
        self.cache = ContextCache()
        self.context_tokens = 0  # sequence positions whose target hidden states are in the cache
        self.pending: Optional[dict] = None
        self.trace: list[RoundRecord] = []
        drafter.last_trace = self.trace

    def _extend_context(self, input_ids: torch.Tensor, model_kwargs: dict, model_outputs) -> None:
        """Add the target's hidden states of the newly committed tokens before the anchor."""
        new_tokens = input_ids.shape[1] - 1 - self.context_tokens
        layer_hidden = [model_outputs.hidden_states[i] for i in self.hidden_indices]
        returned = layer_hidden[0].shape[1]
        if returned < new_tokens:
            raise RuntimeError(
                f"The target returned hidden states for {returned} tokens, but {new_tokens} were committed since "
                "the last round; DSpark drafting cannot follow this target's outputs."
            )
        layer_hidden = [h[:, :new_tokens] for h in layer_hidden]
        attention_mask = model_kwargs.get("attention_mask")
        if attention_mask is not None and self.context_tokens == 0:
            # Left padding in the prompt: padded slots are not context (the target never attends to them).
            real = attention_mask[0, :new_tokens].bool()
            layer_hidden = [h[:, real.to(h.device)] for h in layer_hidden]
        count = layer_hidden[0].shape[1]
        positions = torch.arange(len(self.cache), len(self.cache) + count, device=self.drafter.device)
        self.cache.append(self.drafter.context_kv(layer_hidden, positions[None]), positions)
        self.context_tokens = input_ids.shape[1] - 1

    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, **kwargs):
        if is_first_iteration:
            # Prefill: the target must produce the anchor (and our context) before we can draft.
            forget_prefilled_cache((model_kwargs or {}).get("cache"))
            return input_ids, None
        started = time.perf_counter()
        self._extend_context(input_ids, model_kwargs or {}, model_outputs)
        budget = min(self.cap, self.max_length - input_ids.shape[1] - 1)
        block: Optional[DraftBlock] = None
        num_verified = 0
        if budget > 0 and (self.gate is None or self.gate.should_draft()):
            chooser = DraftTokenChooser(
                input_ids, self.logits_processor, self.do_sample, self.drafter.config.vocab_size, self.draft_token_ids,
                keep_q=self.keep_q,
            )
            block = self.drafter.draft(int(input_ids[0, -1]), len(self.cache), self.cache, chooser)
            num_verified = self._verify_length(block, budget)
        synchronize(self.drafter.device)
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
        q_logits = block.draft_logits[None, :num_verified] if self.keep_q else None
        return torch.cat((input_ids, draft_ids), dim=-1), q_logits

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
        synchronize(input_ids.device)
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
            self.gate.record(block is not None, len(record.committed_ids), record.draft_seconds + record.verify_seconds)
        if self.drafter.on_round is not None:
            self.drafter.on_round(record)
