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
* `dspark_ngram`: hybrid drafting (default on): a round may propose an n-gram
  continuation from the context instead of the DSpark block (see `_plan`).

When the drafter has STS temperatures (`drafter.calibration`), both schedulers
read calibrated confidences; the records keep both. Each call's records go to its own
CallTrace (`drafter.last_call`; `drafter.last_trace` reads its rounds), and with
`generate(..., dspark_rounds=sink)` each also goes to `sink.append` as its round ends.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import warnings
from typing import Any, Optional

import torch
from transformers import GenerationConfig
from transformers.generation.candidate_generator import CandidateGenerator

from .calibration import apply_temperatures
from .costs import profile_costs
from .lm_head import speed_up_few_rows
from .modeling import ContextCache, DraftBlock, DraftModel
from .ngram import MAX_PROPOSAL_TOKENS, AcceptanceStats, Match, NgramIndex
from .sampling import DraftTokenChooser
from .scheduling import (
    AUTO_SCHEDULER,
    COST_SCHEDULER,
    SCHEDULERS,
    THRESHOLD_SCHEDULER,
    CostTable,
    DraftingGate,
    best_geometric_length,
    block_may_win,
    cost_aware_length,
    geometric_expected,
    ngram_wins,
    threshold_length,
)
from .timing import Stopwatch
from .trace import (
    CUT_BUDGET,
    CUT_COST,
    CUT_GATE,
    CUT_NO_DRAFT,
    CUT_THRESHOLD,
    CUT_WHOLE,
    SOURCE_DSPARK,
    SOURCE_NGRAM,
    SOURCE_NONE,
    CallTrace,
    PendingRecord,
    RoundRecord,
)

SCHEDULER_FIELDS = ("assistant_confidence_threshold", "num_assistant_tokens", "dspark_scheduler", "dspark_ngram")
# generate() kwargs that are ours, not transformers': the per-call settings above that GenerationConfig lacks, and
# `dspark_rounds`, an object with .append that receives this call's RoundRecords as their rounds end.
OWN_KWARGS = ("dspark_scheduler", "dspark_ngram")


# The two private transformers methods `attach_to_target` wraps, and the parameters the wrappers rely on.
PATCHED_METHODS = {
    "_get_candidate_generator": ("generation_config", "logits_processor", "assistant_model"),
    "_prepare_generation_config": ("generation_config",),
}


def check_patched_signatures(target) -> None:
    """Fail in one clear line if a transformers release renamed what we wrap, rather than draft wrongly."""
    import transformers

    for name, needed in PATCHED_METHODS.items():
        method = getattr(type(target), name, None)
        parameters = inspect.signature(method).parameters if method is not None else {}
        missing = [p for p in needed if p not in parameters]
        if method is None or missing:
            raise RuntimeError(
                f"transformers {transformers.__version__} changed {type(target).__name__}.{name} "
                f"(missing: {', '.join(missing) or 'the method'}); dspark_hf supports transformers>=5.24,<6 -- "
                "install a supported version, or report this at the dspark_hf issue tracker."
            )


def attach_to_target(target) -> None:
    """Route `generate(assistant_model=<DSpark drafter>)` on this target instance to DSpark drafting.

    On a CPU where it measures faster, the target's LM head also takes the column product for 2-16 rows
    (lm_head.py); one row, plain decoding's, is computed as before."""
    if "_get_candidate_generator" in vars(target):
        return
    check_patched_signatures(target)
    class_get_generator = target._get_candidate_generator
    class_prepare_config = target._prepare_generation_config

    def _prepare_generation_config(generation_config=None, **kwargs):
        # transformers fills unset fields with global defaults; remember which scheduler
        # fields the caller really set, so that the drafter's own defaults apply otherwise.
        # Our own fields are not GenerationConfig attributes, so transformers would treat
        # them as model kwargs: they are taken out here and set on the config.
        own = {key: kwargs.pop(key) for key in OWN_KWARGS if kwargs.get(key) is not None}
        rounds = kwargs.pop("dspark_rounds", None)
        prepared, model_kwargs = class_prepare_config(generation_config, **kwargs)
        for key, value in own.items():
            setattr(prepared, key, value)
        prepared._dspark_rounds = rounds
        prepared._dspark_explicit_fields = {
            key
            for key in SCHEDULER_FIELDS
            if key in kwargs or key in own or getattr(generation_config, key, None) is not None
        }
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
    speed_up_few_rows(target.get_output_embeddings())  # verify passes score 2-16 rows against the whole vocabulary


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


@dataclasses.dataclass
class Proposal:
    """What a round sends: its source, how many tokens and why that many, and the block or match they come from."""

    source: str  # a SOURCE_* name
    budget: int
    num_verified: int
    cut: str
    block: Optional[DraftBlock] = None  # SOURCE_DSPARK: the block
    calibrated: Optional[list[float]] = None  # SOURCE_DSPARK: its confidences as the scheduler read them
    match: Optional[Match] = None  # SOURCE_NGRAM: the continuation


@dataclasses.dataclass(frozen=True)
class NgramOffer:
    """The context's n-gram continuation, cut where its expected tokens per second peak."""

    match: Match
    budget: int  # the longest continuation looked up
    length: int  # its leading tokens worth sending
    expected: float  # tokens a round sending them is expected to commit

    def proposal(self) -> Proposal:
        cut = CUT_WHOLE if self.length == len(self.match.tokens) else CUT_COST
        return Proposal(SOURCE_NGRAM, self.budget, self.length, cut, match=self.match)


@dataclasses.dataclass
class Round:
    """A proposal sent, kept until transformers reports what survived."""

    proposal: Proposal
    position: int  # the anchor's index
    started: float  # host clock, for the gate
    marks: tuple  # Stopwatch marks: round start, candidates ready


class DSparkCandidateGenerator(CandidateGenerator):
    """Drafts one round at a time from the target's hidden states at `target_layer_ids`.

    Round r: the hidden states the target just produced for committed tokens extend the
    draft context cache; a source proposes tokens after the anchor (the target's last
    token) -- the DSpark block, or with hybrid drafting an n-gram continuation from the
    context when that is expected to commit more tokens per second; the scheduler keeps a
    prefix; transformers verifies it. A round may propose nothing; the context cache
    still grows, so drafting can resume.

    Inside a round the host reads the device at most twice: the tokens the last round
    committed (for the n-gram index, only with hybrid drafting) and the confidences the
    scheduler weighs. Each round's record is read from its tensors when first used (PendingRecord).
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
        self.ensemble = generation_config.assistant_ensemble_weight is not None
        self.keep_q = self.do_sample or self.ensemble
        self.max_length = generation_config.max_length
        self.threshold = float(scheduler_setting("assistant_confidence_threshold", generation_config, drafter) or 0.0)
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"assistant_confidence_threshold is {self.threshold}; expected a value in [0, 1].")
        self.cap = int(scheduler_setting("num_assistant_tokens", generation_config, drafter))
        self.scheduler = scheduler_name(generation_config, drafter)
        hybrid = bool(scheduler_setting("dspark_ngram", generation_config, drafter))
        self.costs = cost_table(drafter) if hybrid or self.scheduler == COST_SCHEDULER else None
        self.gate = DraftingGate(self.costs) if self.scheduler == COST_SCHEDULER else None
        self.ngram = NgramIndex() if hybrid else None
        # The most tokens one round may propose; transformers >= 5.25 reads it to size what a cache records.
        self.num_drafting_tokens = max(drafter.config.num_draft_tokens, MAX_PROPOSAL_TOKENS if hybrid else 0)
        self.ngram_stats = AcceptanceStats()  # keyed by match length
        self.dspark_stats = AcceptanceStats()  # one key: weighs a drafter without a confidence head
        calibration = drafter.calibration
        self.temperatures = (
            None if calibration is None
            else torch.tensor(calibration.temperatures, dtype=torch.float32, device=drafter.device)
        )
        self.draft_token_ids = drafter.draft_token_ids()
        # Room for every context token and the block the draft pass writes after them: never grown mid-call.
        self.cache = ContextCache(self.max_length + drafter.config.block_size)
        self.context_tokens = 0  # sequence positions whose target hidden states are in the cache
        self.clock = Stopwatch(drafter.device)
        self.pending: Optional[Round] = None
        self.rounds_sink = getattr(generation_config, "_dspark_rounds", None)
        self.call = drafter.last_call = CallTrace(self.scheduler)

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
        self.cache.append(self.drafter.context_kv(layer_hidden, positions[None]))
        self.context_tokens = input_ids.shape[1] - 1

    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, **kwargs):
        if is_first_iteration:
            # Prefill: the target must produce the anchor (and our context) before we can draft.
            forget_prefilled_cache((model_kwargs or {}).get("cache"))
            return input_ids, None
        started, start_mark = time.perf_counter(), self.clock.mark()
        self._extend_context(input_ids, model_kwargs or {}, model_outputs)
        if self.ngram is not None:
            self.ngram.extend(input_ids[0, len(self.ngram.tokens) :].tolist())
        room = self.max_length - input_ids.shape[1] - 1
        proposal = self._plan(input_ids, min(self.cap, room), room)
        self.pending = Round(proposal, input_ids.shape[1] - 1, started, (start_mark, self.clock.mark()))
        if proposal.num_verified == 0:
            return input_ids, None
        draft_ids, q_logits = self._sent(proposal, input_ids)
        return torch.cat((input_ids, draft_ids.to(input_ids.device)[None]), dim=-1), q_logits

    def _plan(self, input_ids: torch.Tensor, budget: int, room: int) -> Proposal:
        """This round's proposal, from three decisions: is there an n-gram offer, is the gate open, which source wins.

        The choice between the sources reads only what is known before either proposes a
        token: the n-gram continuation (a function of the context), the running statistics,
        the cost table and DSpark's first confidence c_1. Which prefix of the DSpark block
        to send then follows the scheduler, whose decision about x_k reads c_1..c_k only.
        """
        offer = self._ngram_offer(room)
        gate_open = self.gate is None or self.gate.should_draft()
        drafting = budget > 0 and gate_open
        if drafting and offer is not None:  # no draft pass when even a block that survives whole could not win
            drafting = block_may_win(self.costs, budget, offer.length, offer.expected)
        block = calibrated = None
        if drafting:
            chooser = DraftTokenChooser(
                input_ids, self.logits_processor, self.do_sample, self.drafter.config.vocab_size, self.draft_token_ids,
                keep_q=self.keep_q,
            )
            block = self.drafter.draft(input_ids[0, -1:], len(self.cache), self.cache, chooser)
            calibrated = self._calibrated(block)
            first = calibrated[0] if calibrated else self.dspark_stats.alpha(0)
            if offer is not None and not ngram_wins(self.costs, budget, offer.length, offer.expected, first):
                offer = None
        if offer is not None:  # a block drafted to weigh c_1 is dropped
            return offer.proposal()
        if block is not None:
            length, cut = self._dspark_length(block, calibrated, budget)
            return Proposal(SOURCE_DSPARK, budget, length, cut, block=block, calibrated=calibrated)
        return Proposal(SOURCE_NONE, budget, 0, CUT_NO_DRAFT if gate_open else CUT_GATE)

    def _ngram_offer(self, room: int) -> Optional[NgramOffer]:
        """The n-gram continuation worth sending, if the context has one (hybrid drafting only)."""
        if self.ngram is None:
            return None
        budget = min(MAX_PROPOSAL_TOKENS, room, len(self.costs.verify_seconds) - 1)
        match = self.ngram.lookup(budget)
        if match is None:
            return None
        alpha = self.ngram_stats.alpha(match.match_length)
        length, _ = best_geometric_length(alpha, self.costs, len(match.tokens))
        return NgramOffer(match, budget, length, geometric_expected(alpha, length)) if length > 0 else None

    def _sent(self, proposal: Proposal, input_ids: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The draft tokens a proposal sends, and their q as transformers takes it ([1, n, vocab]) or None.

        An n-gram proposal is not drawn from a distribution: verifying it by matching the target's own
        sample is exact, so it needs q (one-hot) only for ensemble verification."""
        count = proposal.num_verified
        if proposal.source == SOURCE_NGRAM:  # already on the device: a slice of the context
            draft_ids = input_ids[0, proposal.match.start : proposal.match.start + count]
            q_logits = one_hot_logits(draft_ids, self.drafter.config.vocab_size) if self.ensemble else None
        else:
            draft_ids = proposal.block.draft_ids[:count]
            q_logits = proposal.block.draft_logits[:count] if self.keep_q else None
        return draft_ids, None if q_logits is None else q_logits[None]

    def _calibrated(self, block: DraftBlock) -> Optional[list[float]]:
        """The confidences as the scheduler reads them (STS applied): the round's one read of the drafter's output."""
        if block.confidences is None:
            return None
        confidences = block.confidences
        if self.temperatures is not None:
            confidences = apply_temperatures(confidences, self.temperatures)
        return confidences.tolist()

    def _dspark_length(self, block: DraftBlock, calibrated: Optional[list[float]], budget: int) -> tuple[int, str]:
        """The threshold cut, then (cost scheduler) the expected-tokens-per-second walk within it; and why it stops."""
        proposed = block.draft_ids.shape[0]
        length = threshold_length(calibrated, self.threshold, proposed, budget)
        cut = CUT_WHOLE if length == proposed else CUT_BUDGET if length == budget else CUT_THRESHOLD
        if self.gate is not None:
            walked = cost_aware_length(calibrated, self.costs, length)
            cut = CUT_COST if walked < length else cut
            length = walked
        return length, cut

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        if self.pending is None:  # the prefill round drafts nothing
            return
        end_mark = self.clock.mark()
        sent, self.pending = self.pending, None
        proposal, accepted = sent.proposal, int(num_matches)
        seconds = time.perf_counter() - sent.started
        if proposal.source == SOURCE_NGRAM:
            self.ngram_stats.record(proposal.match.match_length, proposal.num_verified, accepted)
        elif proposal.source == SOURCE_DSPARK:
            self.dspark_stats.record(0, proposal.num_verified, accepted)
        if self.gate is not None and proposal.source != SOURCE_NGRAM:
            self.gate.record(proposal.source == SOURCE_DSPARK, input_ids.shape[1] - sent.position - 1, seconds)
        committed_ids = input_ids[0, sent.position + 1 :]
        record = PendingRecord(lambda: self._record(sent, committed_ids, accepted, end_mark))
        self.call.rounds.append(record)
        if self.rounds_sink is not None:
            self.rounds_sink.append(record)

    def _record(self, sent: Round, committed_ids: torch.Tensor, num_accepted: int, end_mark) -> RoundRecord:
        proposal = sent.proposal
        block, match = proposal.block, proposal.match
        if match is not None:
            draft_ids = match.tokens
        else:
            draft_ids = block.draft_ids.tolist() if block is not None else []
        confidences = block.confidences.tolist() if block is not None and block.confidences is not None else []
        start, drafted = sent.marks
        return RoundRecord(
            position=sent.position,
            source=proposal.source,
            draft_ids=draft_ids,
            confidences=confidences,
            calibrated=proposal.calibrated or [],
            budget=proposal.budget,
            num_verified=proposal.num_verified,
            cut=proposal.cut,
            num_accepted=num_accepted,
            committed_ids=committed_ids.tolist(),
            draft_seconds=self.clock.seconds(start, drafted),
            verify_seconds=self.clock.seconds(drafted, end_mark),
            match_length=match.match_length if match is not None else 0,
        )


def one_hot_logits(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, vocab] logits whose softmax puts all mass on each token: q of a proposal that is not sampled."""
    logits = torch.full((len(token_ids), vocab_size), float("-inf"), device=token_ids.device)
    return logits.scatter_(1, token_ids[:, None], 0.0)
