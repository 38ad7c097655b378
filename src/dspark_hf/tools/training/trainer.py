"""Training a DSpark (or DFlash) drafter against a frozen target, on one process or several.

The target's features are computed on the fly (optionally cached per sequence on
disk, which pays off when several epochs run on a small set). Each sequence gives
many anchors; every anchor's block is drafted in parallel with the block attention
mask (context before the anchor, plus the block itself), through the very same
`DSparkDrafter.backbone` / `head_step` the inference path uses.

Under `accelerate launch` (or torchrun) each process trains its share of every step's
sequences against its own copy of the target, and the gradients are summed (see
`processes.py`). Which sequence, and which anchors, a step trains on depend only on
the step and the sequence's slot in the global batch, never on the process count, so
N processes compute the same steps as one, and `--resume` may change N.

Loss per draft position k, weighted by exp(-(k-1)/gamma):
    0.1 * CE(ground truth) + 0.9 * ||p_draft - p_target||_1 + 1.0 * BCE(c_k, 1 - TV)
A DFlash drafter (no Markov head, no confidence head) keeps CE only.

With `loss_vocab="responses"` every softmax in the loss (draft and target) runs over
the tokens the target actually emitted in the training responses instead of the full
vocabulary. The LM-head products dominate a CPU step, and a small model's answers use a
few thousand distinct tokens out of ~50k, so this is several times cheaper; such a
drafter still scores the full vocabulary at inference. A pruned drafter
(`draft_vocab_size`, FR-Spec) goes further: it keeps only the most frequent answer
tokens, at training and at inference, with the target's LM-head rows for them, frozen.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from accelerate import PartialState
from tqdm.auto import tqdm

from ...core.config import DSparkConfig, zlab_default_layer_ids
from ...core.generation import attach_to_target
from ...formats.loader import DSparkDrafter
from ..errors import InputError, positive_int
from ..options import announce, apply_threads
from ..prompts import read_prompts
from ..targets import DTYPES, load_target
from .processes import leave, process_state, sum_across, sum_gradients

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "trainer_state.pt"
LOG_FILE = "train_log.jsonl"
TERMS = ("ce", "l1", "conf", "expected_tau")  # the loss terms `sequence_loss` reports, in log order


@dataclasses.dataclass
class TrainSettings:
    max_steps: int = 1000
    sequences_per_step: int = 4
    anchors_per_sequence: int = 32
    max_tokens: int = 768
    learning_rate: float = 6e-4
    warmup_steps: int = 50
    weight_decay: float = 0.01
    gamma_decay: float = 4.0
    ce_weight: float = 0.1
    l1_weight: float = 0.9
    confidence_weight: float = 1.0
    loss_vocab: str = "full"  # "full", or "responses": the loss's softmaxes run over response tokens only
    trainable: str = "all"  # "all", or "confidence": only the confidence head learns (the rest is frozen)
    autocast: str = "auto"  # "auto": bf16 on CUDA GPUs that have it; "bf16": anywhere (CPUs with AVX512-BF16); "off"
    init: str = "random"  # a fresh run's draft layers: random, or "target": copies of its deepest layers
    save_every: int = 100
    log_every: int = 10
    eval_every: int = 500
    seed: int = 0

    def __post_init__(self):
        if self.loss_vocab not in ("full", "responses"):
            raise ValueError(f"TrainSettings.loss_vocab must be 'full' or 'responses', got {self.loss_vocab!r}.")
        if self.trainable not in ("all", "confidence"):
            raise ValueError(f"TrainSettings.trainable must be 'all' or 'confidence', got {self.trainable!r}.")
        if self.autocast not in ("auto", "bf16", "off"):
            raise ValueError(f"TrainSettings.autocast must be 'auto', 'bf16' or 'off', got {self.autocast!r}.")
        if self.init not in ("target", "random"):
            raise ValueError(f"TrainSettings.init must be 'target' or 'random', got {self.init!r}.")


def choose_mask_token(tokenizer, vocab_size: int) -> int:
    """A token the drafter can use as MASK: the tokenizer's own, else a padded-vocab slot, else unk, else the last id."""
    if tokenizer is not None and getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    if tokenizer is not None and len(tokenizer) < vocab_size:
        return vocab_size - 1
    if tokenizer is not None and getattr(tokenizer, "unk_token_id", None) is not None:
        return int(tokenizer.unk_token_id)
    return vocab_size - 1


def init_from_target(drafter: DSparkDrafter, target) -> None:
    """Start the draft layers as copies of the target's deepest layers (same shapes), for `init="target"`."""
    target_layers = target.get_decoder().layers
    for draft_layer, source in zip(drafter.layers, target_layers[-len(drafter.layers) :]):
        source_state = source.state_dict()
        own = draft_layer.state_dict()
        matched = {k: v for k, v in source_state.items() if k in own and own[k].shape == v.shape}
        draft_layer.load_state_dict(matched, strict=False)
    drafter.norm.load_state_dict(target.get_decoder().norm.state_dict())


@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, layer_ids: list[int]):
    """Hidden states of the selected target layers, plus the final normed hidden state that gives its logits."""
    depth = target.config.get_text_config().num_hidden_layers
    indices = [i + 1 for i in layer_ids] + [depth]
    out = target(input_ids, output_hidden_states=indices, use_cache=False, logits_to_keep=1)
    return [out.hidden_states[i] for i in indices[:-1]], out.hidden_states[depth]


class FeatureStore:
    """Per-sequence target features, computed on demand and kept on disk when a directory is given.

    Files are named by a hash of the token ids and layer ids, so one directory can serve
    several datasets and drafters without ever handing back another sequence's features.
    """

    def __init__(self, target, layer_ids: list[int], directory: Optional[Path] = None):
        self.target, self.layer_ids, self.directory = target, layer_ids, directory

    def get(self, ids: torch.Tensor):
        path = None
        if self.directory is not None:
            key = hashlib.sha1(ids.numpy().tobytes() + repr(self.layer_ids).encode()).hexdigest()[:20]
            path = self.directory / f"{key}.pt"
        if path is not None and path.is_file():
            stored = torch.load(path)
            return [h.float() for h in stored["layers"]], stored["final"].float()
        device = self.target.get_input_embeddings().weight.device
        layers, final = target_features(self.target, ids[None].to(device), self.layer_ids)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(f".{os.getpid()}.tmp")  # processes may store the same sequence at once
            torch.save({"layers": [h.to(torch.bfloat16) for h in layers], "final": final.to(torch.bfloat16)}, temporary)
            os.replace(temporary, path)
        return [h.float() for h in layers], final.float()


def answer_vocabulary(records: list[dict], vocab_size: int, limit: Optional[int] = None) -> torch.Tensor:
    """Token ids of the training answers, sorted by id: all of them, or the `limit` most frequent (FR-Spec).

    Ties go to the lower id, and a vocabulary larger than the answers use is filled with
    the lowest unused ids, as speculators does, so `limit` is always the exact size.
    """
    counts = collections.Counter(token for record in records for token in record["response_ids"])
    chosen = sorted(counts, key=lambda token: (-counts[token], token))[:limit]
    if limit is not None and len(chosen) < limit:
        unused = sorted(set(range(vocab_size)) - set(chosen))
        chosen += unused[: limit - len(chosen)]
    return torch.tensor(sorted(chosen))


def vocabulary_index(token_ids: Optional[torch.Tensor], vocab_size: int) -> Optional[torch.Tensor]:
    """Target id -> position in `token_ids`, -1 for ids outside it."""
    if token_ids is None:
        return None
    index = torch.full((vocab_size,), -1, dtype=torch.long, device=token_ids.device)
    index[token_ids] = torch.arange(len(token_ids), device=token_ids.device)
    return index


def pruned(drafter: DSparkDrafter, token_ids: torch.Tensor) -> DSparkDrafter:
    """The drafter restricted to the draft vocabulary `token_ids` (sorted target ids), FR-Spec style:
    the target's LM-head rows for them, the matching rows of the Markov W2, and d2t.

    A pruned drafter may move to a vocabulary with tokens it never scored (new data): their W2
    rows start at zero, so the Markov head adds nothing for them until training says otherwise."""
    config = dataclasses.replace(drafter.config, draft_vocab_size=len(token_ids))
    state = {key: value for key, value in drafter.state_dict().items() if key not in ("d2t", "lm_head.weight")}
    if "markov_head.markov_w2.weight" in state:
        w2 = state["markov_head.markov_w2.weight"]
        if drafter.config.pruned:  # W2 rows are indexed by the old draft vocabulary
            old = vocabulary_index(drafter.draft_token_ids(), drafter.config.vocab_size)[token_ids]
            state["markov_head.markov_w2.weight"] = torch.where((old >= 0)[:, None], w2[old.clamp(min=0)], 0)
        else:
            state["markov_head.markov_w2.weight"] = w2[token_ids]
    state["d2t"] = token_ids - torch.arange(len(token_ids))
    state["lm_head.weight"] = drafter.target_lm_head.weight.detach()[token_ids].to(drafter.dtype)
    result = DSparkDrafter(config, drafter.target)
    result.load_state_dict(state)
    return result.to(drafter.device)


@dataclasses.dataclass
class Blocks:
    """Teacher-forced drafting of the blocks anchored at `anchors` in one sequence."""

    logits: torch.Tensor  # [nb, B, n] over the loss vocabulary, Markov bias included
    confidence_logits: Optional[torch.Tensor]  # [nb, B]
    labels: torch.Tensor  # [nb, B] target ids of the tokens each slot predicts
    valid: torch.Tensor  # [nb, B] the slot predicts a token inside the sequence
    target_hidden: torch.Tensor  # [nb, B, d] the target's final hidden state that predicts each label


def teacher_forced_blocks(drafter: DSparkDrafter, ids, features, anchors, loss_ids=None) -> Blocks:
    """Every block in one parallel pass; each slot's Markov input is the true previous token.

    That is exactly what greedy drafting computes for a slot whose earlier slots were all
    right, so it serves both the loss and the exact greedy acceptance. `loss_ids` are the
    target ids to score (None: what the drafter scores itself, its pruned vocabulary or all).
    """
    layer_hidden, final_hidden = features
    device = drafter.device
    ids, anchors = ids.to(device), anchors.to(device)
    length, block = len(ids), drafter.config.block_size
    block_positions = anchors[:, None] + torch.arange(block, device=device)  # [nb, B]
    label_positions = block_positions + 1  # block index k-1 predicts position p+k
    valid = label_positions < length
    safe_labels = label_positions.clamp(max=length - 1)
    previous = ids[safe_labels - 1]  # teacher-forced x_{k-1}; the anchor for k = 1
    block_ids = torch.full_like(block_positions, drafter.config.mask_token_id)
    block_ids[:, 0] = ids[anchors]

    positions = torch.arange(length, device=device)
    context = drafter.context_kv([h.to(device) for h in layer_hidden], positions[None])
    hidden = drafter.backbone(block_ids.view(1, -1), block_positions.view(1, -1), context, positions)
    hidden = hidden.view(len(anchors), block, -1)
    if drafter.config.pruned:  # its own head and W2 already score exactly its vocabulary
        logits, head_ids = drafter.draft_logits(hidden).float(), None
    else:
        logits, head_ids = drafter.vocab_logits(hidden, loss_ids).float(), loss_ids
    confidence_logits, biases, state = [], [], None
    for k in range(block):
        bias, confidence_logit, state = drafter.head_step(hidden[:, k], previous[:, k], state, head_ids)
        biases.append(bias)
        confidence_logits.append(confidence_logit)
    if biases[0] is not None:
        logits = logits + torch.stack(biases, dim=1).float()
    confidences = torch.stack(confidence_logits, dim=1).float() if confidence_logits[0] is not None else None
    return Blocks(logits, confidences, ids[safe_labels], valid, final_hidden[0, safe_labels - 1].to(device))


def expected_accepted_length(survival: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Expected tokens per round, bonus included, from per-position survival chances [..., n].

    A draft token counts only if every earlier one survived, so the expectation is
    1 + sum_k prod_{i<=k} survival_i. Masked-out positions end the block.
    """
    if mask is not None:
        survival = survival * mask
    return 1 + torch.cumprod(survival, dim=-1).sum(dim=-1)


def sequence_loss(drafter: DSparkDrafter, ids: torch.Tensor, features, anchors, settings, loss_ids=None):
    """Loss terms and the expected tau for the blocks of one sequence.

    `loss_ids` (on the drafter's device) are the target ids every softmax runs over: a
    pruned drafter's vocabulary or a shortlist of answer tokens; None is the full vocabulary.
    A label outside them has no CE term, and the target's distribution is renormalised over them.
    """
    out = teacher_forced_blocks(drafter, ids, features, anchors, loss_ids)
    block = drafter.config.block_size
    labels = out.labels
    if loss_ids is not None:
        labels = vocabulary_index(loss_ids, drafter.config.vocab_size)[labels]
    weights = torch.exp(-torch.arange(block, device=drafter.device, dtype=torch.float) / settings.gamma_decay)
    weights = weights[None].expand_as(labels) * out.valid
    total_weight = weights.sum().clamp(min=1e-6)

    ce = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), reduction="none", ignore_index=-1)
    ce = ce.view_as(weights)
    with torch.no_grad():
        target_probs = drafter.vocab_logits(out.target_hidden, loss_ids).float().softmax(-1)
    l1 = (out.logits.softmax(-1) - target_probs).abs().sum(-1)
    survival = (1 - 0.5 * l1).detach()
    terms = {"ce": (ce * weights).sum() / total_weight, "l1": (l1 * weights).sum() / total_weight}
    dflash = drafter.markov_head is None and drafter.confidence_head is None
    loss = terms["ce"] if dflash else settings.ce_weight * terms["ce"] + settings.l1_weight * terms["l1"]
    if out.confidence_logits is not None:
        bce = F.binary_cross_entropy_with_logits(out.confidence_logits, survival, reduction="none")
        terms["conf"] = (bce * weights).sum() / total_weight
        loss = loss + settings.confidence_weight * terms["conf"]
    terms["expected_tau"] = expected_accepted_length(survival, out.valid.float()).mean()
    return loss, terms


def greedy_tau(drafter: DSparkDrafter, records: list[dict], store, max_tokens: int, chunk: int = 48) -> float:
    """Tau of greedy decoding that verifies whole blocks, replayed on answers the target wrote greedily."""
    tokens, rounds = greedy_rounds(drafter, records, store, max_tokens, chunk)
    return tokens / max(rounds, 1)


@torch.no_grad()
def greedy_rounds(drafter: DSparkDrafter, records: list[dict], store, max_tokens: int, chunk: int = 48):
    """(tokens, rounds) of greedy decoding that verifies whole blocks, replayed on answers the target wrote greedily.

    Every answer position is drafted once as an anchor; rounds then walk the answer from
    its first token, each jumping past its accepted drafts and the target's token. Exact
    for greedy decoding (see `teacher_forced_blocks`), and far cheaper than generating.
    As in generate() with `max_new_tokens` at the answer's length, the last token is
    always the target's own, so no draft may reach it.
    """
    was_training = drafter.training
    drafter.eval()
    rounds = tokens = 0
    draft_ids = drafter.draft_token_ids()
    for record in records:
        ids = torch.tensor(record["prompt_ids"] + record["response_ids"])[:max_tokens]
        start = len(record["prompt_ids"])
        if len(ids) - 1 <= start:
            continue
        features = store.get(ids)
        accepted = []
        for anchors in torch.arange(start, len(ids) - 1).split(chunk):
            out = teacher_forced_blocks(drafter, ids, features, anchors)
            guesses = out.logits.argmax(-1)
            guesses = guesses if draft_ids is None else draft_ids[guesses]
            before_last = anchors[:, None] + torch.arange(1, out.labels.shape[1] + 1) < len(ids) - 1
            hits = (guesses == out.labels) & before_last.to(guesses.device)
            accepted += hits.long().cumprod(dim=1).sum(dim=1).tolist()
        position = 0
        while position < len(accepted):
            rounds, tokens = rounds + 1, tokens + accepted[position] + 1
            position += accepted[position] + 1
    drafter.train(was_training)
    return tokens, rounds


def sequence_ids(record: dict, settings: TrainSettings) -> torch.Tensor:
    return torch.tensor(record["prompt_ids"] + record["response_ids"])[: settings.max_tokens]


def sample_anchors(prompt_length: int, length: int, count: int, generator: torch.Generator) -> Optional[torch.Tensor]:
    """Anchors are response tokens with at least one token after them, as at inference."""
    candidates = torch.arange(prompt_length, max(prompt_length, length - 1))  # none when the prompt fills the window
    if len(candidates) == 0:
        return None
    chosen = torch.randperm(len(candidates), generator=generator)[: min(count, len(candidates))]
    return candidates[chosen].sort().values


def sequence_order(step: int, slot: int, settings: TrainSettings, num_sequences: int) -> int:
    """Which sequence a (step, global slot) trains on: a fresh permutation each epoch, the same after a resume
    and for any process count."""
    flat = step * settings.sequences_per_step + slot
    epoch, offset = divmod(flat, num_sequences)
    generator = torch.Generator().manual_seed(settings.seed * 100003 + epoch)
    return int(torch.randperm(num_sequences, generator=generator)[offset])


def learning_rate(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup_steps:
        return settings.learning_rate * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.max_steps - settings.warmup_steps)
    return settings.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclasses.dataclass
class Training:
    """What every step of one run reads: the drafter and its optimizer, the data, the processes, where it writes."""

    drafter: DSparkDrafter
    optimizer: torch.optim.Optimizer
    learned: list[torch.nn.Parameter]
    records: list[dict]
    store: FeatureStore
    loss_ids: Optional[torch.Tensor]  # the target ids the loss's softmaxes run over; None: all
    settings: TrainSettings
    state: PartialState
    device: torch.device
    out_dir: Path
    eval_records: list[dict]  # this process's share of the held-out answers
    evaluates: bool  # some process holds held-out answers (then every process takes part in the evaluation)


def save_checkpoint(training: Training, step: int) -> None:
    """Weights and trainer state side by side, swapped in atomically so a kill never leaves half a checkpoint."""
    out_dir = training.out_dir
    final = out_dir / CHECKPOINT_DIR
    staging = out_dir / (CHECKPOINT_DIR + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    training.drafter.save_pretrained(staging)
    settings = dataclasses.asdict(training.settings)
    torch.save({"step": step, "optimizer": training.optimizer.state_dict(), "settings": settings}, staging / STATE_FILE)
    previous = out_dir / (CHECKPOINT_DIR + ".old")
    shutil.rmtree(previous, ignore_errors=True)
    if final.exists():
        os.replace(final, previous)
    os.replace(staging, final)
    shutil.rmtree(previous, ignore_errors=True)


def starting_point(target, records, out_dir: Path, config, settings: TrainSettings, resume: bool, init_from, device):
    """(drafter, first step, optimizer state or None): the checkpoint to resume, trained weights, or fresh ones."""
    checkpoint = out_dir / CHECKPOINT_DIR
    if resume and (checkpoint / STATE_FILE).is_file():
        resumed = torch.load(checkpoint / STATE_FILE, map_location=device)
        drafter = DSparkDrafter.from_pretrained(checkpoint, target, dtype=torch.float32)
        return drafter, resumed["step"], resumed["optimizer"]
    if init_from is not None:
        drafter = DSparkDrafter.from_pretrained(init_from, target, dtype=torch.float32)
        if config is not None and config.pruned:  # --draft-vocab: this run's most frequent answer tokens
            drafter = pruned(drafter, answer_vocabulary(records, drafter.config.vocab_size, config.draft_vocab_size))
        return drafter, 0, None
    if config is None:
        raise ValueError(f"No checkpoint to resume in {checkpoint}; pass a DSparkConfig to start a new run.")
    torch.manual_seed(settings.seed)  # the same settings always start from the same weights
    drafter = DSparkDrafter(dataclasses.replace(config, draft_vocab_size=None), target)
    if settings.init == "target":
        init_from_target(drafter, target)
    if config.pruned:  # FR-Spec: the most frequent answer tokens
        drafter = pruned(drafter, answer_vocabulary(records, config.vocab_size, config.draft_vocab_size))
    return drafter, 0, None


def loss_vocabulary(drafter: DSparkDrafter, records: list[dict], settings: TrainSettings) -> Optional[torch.Tensor]:
    """The target ids the loss scores: a pruned drafter's own, the answers' (loss_vocab="responses"), or None: all."""
    if drafter.config.pruned:
        return drafter.draft_token_ids()
    return answer_vocabulary(records, drafter.config.vocab_size) if settings.loss_vocab == "responses" else None


def trainable_parameters(drafter: DSparkDrafter, settings: TrainSettings) -> list[torch.nn.Parameter]:
    """What the optimizer moves: all but a pruned drafter's LM-head rows (the target's, which FR-Spec keeps),
    or with trainable="confidence" the confidence head alone."""
    if drafter.config.pruned:
        drafter.lm_head.weight.requires_grad_(False)
    if settings.trainable == "confidence":
        if drafter.confidence_head is None:
            raise ValueError("trainable='confidence' needs a drafter with a confidence head (this one has none).")
        for name, param in drafter.named_parameters():
            param.requires_grad_(name.startswith("confidence_head."))
    return [param for param in drafter.parameters() if param.requires_grad]


def autocast_context(device: torch.device, setting: str):
    """bf16 autocast for the drafter's passes; the weights, the optimizer and the checkpoints stay fp32."""
    enabled = setting == "bf16" or (setting == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported())
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def window_means(window: dict[str, list[float]], state, device) -> dict[str, float]:
    """Each loss term's mean over the sequences every process trained on since the last log line."""
    totals = [[sum(window.get(name, [])), len(window.get(name, []))] for name in TERMS]
    totals = sum_across(torch.tensor(totals, dtype=torch.float64, device=device), state).tolist()
    return {name: total / count for name, (total, count) in zip(TERMS, totals) if count > 0}


def announce_processes(state, settings: TrainSettings, device: torch.device) -> None:
    """One line at the start: the process count and the global batch, so a launch that did not go as meant shows."""
    processes = f"{state.num_processes} process{'es' * (state.num_processes != 1)}"
    per_process = math.ceil(settings.sequences_per_step / state.num_processes)
    print(f"dspark train: {processes}, global batch {settings.sequences_per_step} (at most {per_process} per process, "
          f"one sequence per pass), on {device}", file=sys.stderr, flush=True)


def train_step(training: Training, step: int, window: dict[str, list[float]]) -> None:
    """One optimizer step: this process's slots of the global batch, then the gradients summed over the processes."""
    settings, state = training.settings, training.state
    for group in training.optimizer.param_groups:
        group["lr"] = learning_rate(step, settings)
    training.optimizer.zero_grad(set_to_none=True)
    for slot in range(state.process_index, settings.sequences_per_step, state.num_processes):
        record = training.records[sequence_order(step, slot, settings, len(training.records))]
        ids = sequence_ids(record, settings)
        generator = torch.Generator().manual_seed(settings.seed * 7919 + step * 131 + slot)
        anchors = sample_anchors(len(record["prompt_ids"]), len(ids), settings.anchors_per_sequence, generator)
        if anchors is None:
            continue
        features = training.store.get(ids)
        with autocast_context(training.device, settings.autocast):
            loss, terms = sequence_loss(training.drafter, ids, features, anchors, settings, training.loss_ids)
        (loss / settings.sequences_per_step).backward()
        for name, value in terms.items():
            window.setdefault(name, []).append(value.item())
    sum_gradients(training.learned, state)
    torch.nn.utils.clip_grad_norm_(training.learned, 1.0)
    training.optimizer.step()


def log_line(training: Training, completed: int, window: dict[str, list[float]], seconds: float) -> dict[str, float]:
    """The loss terms since the last line (and the held-out tau when it is due), appended to OUT/train_log.jsonl."""
    settings = training.settings
    means = window_means(window, training.state, training.device)
    if training.evaluates and (completed % settings.eval_every == 0 or completed == settings.max_steps):
        mine = greedy_rounds(training.drafter, training.eval_records, training.store, settings.max_tokens)
        summed = sum_across(torch.tensor(mine, dtype=torch.float64, device=training.device), training.state)
        tokens, rounds = summed.tolist()
        means["heldout_tau"] = tokens / max(rounds, 1)
    if training.state.is_main_process and means:
        entry = {"step": completed, "lr": learning_rate(completed - 1, settings), "elapsed": seconds, **means}
        training.out_dir.mkdir(parents=True, exist_ok=True)
        with (training.out_dir / LOG_FILE).open("a") as log:
            log.write(json.dumps(entry) + "\n")
    return means


def run_steps(training: Training, start_step: int, progress: bool) -> int:
    """The loop: steps from `start_step` to max_steps, logged and checkpointed as the settings say; returns the steps
    completed. A kill (Ctrl-C, SIGTERM) keeps every finished step: --resume continues from exactly there."""
    settings, main = training.settings, training.state.is_main_process
    bar = tqdm(range(start_step, settings.max_steps), initial=start_step, total=settings.max_steps,
               desc="train", disable=not (progress and main))
    window: dict[str, list[float]] = {}
    started, completed = time.time(), start_step
    try:
        for step in bar:
            train_step(training, step, window)
            completed = step + 1
            if completed % settings.log_every == 0 or completed == settings.max_steps:
                means = log_line(training, completed, window, time.time() - started)
                bar.set_postfix({name: f"{value:.3f}" for name, value in means.items()})
                window = {}
            if main and completed % settings.save_every == 0:
                save_checkpoint(training, completed)
    except KeyboardInterrupt:
        if main:
            save_checkpoint(training, completed)
        raise
    return completed


def train(
    target,
    sequences: list[dict],
    out_dir: str | os.PathLike,
    *,
    config: Optional[DSparkConfig] = None,
    settings: Optional[TrainSettings] = None,
    resume: bool = False,
    init_from: Optional[str | os.PathLike] = None,
    feature_cache: Optional[str | os.PathLike] = None,
    device: Optional[str] = None,
    progress: bool = True,
    eval_sequences: Optional[list[dict]] = None,
) -> DSparkDrafter:
    """Train a drafter on `sequences` ({"prompt_ids", "response_ids"} records) and write it to `out_dir`.

    `config` is required for a fresh run; with `resume=True` it is read from the checkpoint.
    `init_from` (a drafter directory or Hub id) starts from trained weights with a new
    optimizer and schedule, e.g. to fit only the confidence head on answers the
    backbone never saw (`TrainSettings.trainable="confidence"`). With `eval_sequences`
    (held-out greedy answers) the log records their greedy tau every `eval_every` steps.
    A config with `draft_vocab_size` trains a pruned drafter on the most frequent answer tokens
    (with `init_from`, those of these answers: new data may bring new frequent tokens).

    Under `accelerate launch` every process calls this with the same arguments; only the
    main one writes. `out_dir` is made when there is something to write in it, so a run
    that fails first leaves nothing behind.
    """
    settings = settings or TrainSettings()
    out_dir, state = Path(out_dir), process_state(device)
    device = torch.device(device) if device else state.device
    target.requires_grad_(False).eval()
    # a sequence trains only if at least 2 answer tokens fit in the window; the others would waste batch slots
    records = [s for s in sequences if min(len(s["response_ids"]), settings.max_tokens - len(s["prompt_ids"])) >= 2]
    if not records:
        raise ValueError(f"No training sequence has at least 2 answer tokens within max_tokens={settings.max_tokens}.")
    drafter, start_step, optimizer_state = starting_point(
        target, records, out_dir, config, settings, resume, init_from, device)
    loss_ids = loss_vocabulary(drafter, records, settings)
    drafter.to(device=device, dtype=torch.float32).train()
    learned = trainable_parameters(drafter, settings)
    optimizer = torch.optim.AdamW(learned, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    eval_records = [r for r in (eval_sequences or []) if len(r["response_ids"]) >= 2]
    store = FeatureStore(target, drafter.config.target_layer_ids, Path(feature_cache) if feature_cache else None)
    training = Training(
        drafter, optimizer, learned, records, store, None if loss_ids is None else loss_ids.to(device), settings,
        state, device, out_dir, eval_records[state.process_index :: state.num_processes], bool(eval_records))
    if progress and state.is_main_process:
        announce_processes(state, settings, device)
    completed = run_steps(training, start_step, progress)
    drafter.eval()
    if state.is_main_process:
        save_checkpoint(training, completed)
        drafter.save_pretrained(out_dir)
    attach_to_target(target)  # as from_pretrained does: generate(assistant_model=drafter) works on what is returned
    return drafter


# ------------------------------------------------------------------ the command
def add_arguments(parser) -> None:
    parser.add_argument("--target", required=True, help="Hub id or directory ('smollm2': offline default)")
    parser.add_argument("--local-files-only", action="store_true", help="never reach the Hub; use its cache only")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="float32",
                        help="the target's dtype while it computes the features the drafter learns from; auto: "
                        "bfloat16 where the hardware multiplies it natively")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads per process; unset: OMP_NUM_THREADS, else the cores not already busy")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompts", nargs="+", help='jsonl files of {"turns": [...]}; the target regenerates answers')
    source.add_argument("--data", nargs="+", help="already regenerated jsonl (prompt_ids/response_ids records)")
    parser.add_argument("--text", nargs="+",
                        help="plain text files the target only reads (alone, or added to the above)")
    parser.add_argument("--out", required=True, help="directory for the drafter, its checkpoints and log")
    parser.add_argument("--arch", choices=["dspark", "dflash"], default="dspark",
                        help="dspark: Markov and confidence heads; dflash: the parallel drafter alone")
    parser.add_argument("--block-size", type=positive_int, default=7, help="block length: the anchor plus draft slots")
    parser.add_argument("--layers", type=positive_int, default=1, help="draft decoder layers")
    parser.add_argument("--markov-rank", type=positive_int, default=64, help="rank of the Markov head's bias")
    parser.add_argument("--markov-head", choices=["vanilla", "gated", "rnn"], default="vanilla",
                        help="how the previous token's feature is mixed in")
    parser.add_argument("--target-layer-ids", type=int, nargs="+", default=None,
                        help="target layers whose hidden states the drafter reads (default: spread over the depth)")
    parser.add_argument("--num-target-features", type=positive_int, default=4,
                        help="layers read when ids are not given")
    parser.add_argument("--mask-token-id", type=int, default=None,
                        help="token id filling the draft slots (default: the tokenizer's mask token, else an unused "
                        "slot or unk)")
    parser.add_argument("--draft-vocab", type=positive_int, default=None,
                        help="prune the draft vocabulary to the N most frequent answer tokens (FR-Spec); saved as d2t. "
                        "With --init-from, this run's answers choose it again")
    parser.add_argument("--max-steps", type=int, default=1000, help="optimizer steps in all (a resumed run counts on)")
    parser.add_argument("--batch-size", type=positive_int, default=4,
                        help="sequences per optimizer step over all processes (the global batch); each process runs "
                        "its share one sequence per forward/backward pass and accumulates, so any batch fits in memory")
    parser.add_argument("--anchors", type=positive_int, default=32, help="anchors (blocks) per sequence")
    parser.add_argument("--max-tokens", type=positive_int, default=768, help="tokens per training sequence")
    parser.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (cosine decay after warm-up)")
    parser.add_argument("--warmup-steps", type=int, default=50, help="steps of linear learning-rate warm-up")
    parser.add_argument("--ce-weight", type=float, default=0.1,
                        help="weight of the cross-entropy on the answer's tokens (the paper's 0.1); it is what "
                        "teaches the drafter the target's top token, which greedy acceptance needs")
    parser.add_argument("--l1-weight", type=float, default=0.9,
                        help="weight of ||p_draft - p_target||_1 (the paper's 0.9), what sampled acceptance needs")
    parser.add_argument(
        "--loss-vocab",
        choices=["full", "responses"],
        default="full",
        help="'responses': the loss scores only tokens seen in the training answers (several times cheaper on CPU)",
    )
    parser.add_argument("--autocast", choices=["auto", "bf16", "off"], default="auto",
                        help="bf16 autocast of the drafter's passes; auto: on CUDA GPUs with bf16, off on CPUs "
                        "(bf16 there is untested for speed)")
    parser.add_argument("--save-every", type=positive_int, default=100, help="steps between resumable checkpoints")
    parser.add_argument("--log-every", type=positive_int, default=10, help="steps per line of OUT/train_log.jsonl")
    parser.add_argument("--eval-data", nargs="+", default=None,
                        help="held-out regenerated answers: their greedy tau is logged every --eval-every steps")
    parser.add_argument("--eval-every", type=positive_int, default=500, help="steps between held-out tau evaluations")
    parser.add_argument("--seed", type=int, default=0, help="initialisation and data order")
    parser.add_argument("--max-prompts", type=positive_int, default=None,
                        help="with --prompts: answer only the first N")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256, help="regenerated response length")
    parser.add_argument("--regen-batch-size", type=positive_int, default=16,
                        help="with --prompts: prompts answered at once")
    parser.add_argument("--feature-cache", default=None, help="directory to keep target features between epochs")
    parser.add_argument("--device", default=None, help="unset: each process's own GPU, else the CPU")
    parser.add_argument("--resume", action="store_true", help="continue OUT/checkpoint; the process count may differ")
    parser.add_argument("--init-from", default=None,
                        help="start from this drafter's weights (new optimizer and schedule); it keeps its draft "
                        "vocabulary unless --draft-vocab is given")
    parser.add_argument("--init", choices=("random", "target"), default="random",
                        help="a fresh run's draft layers: random, or copies of the target's deepest layers (slower "
                        "to train in the README's lever study)")
    parser.add_argument(
        "--trainable",
        choices=["all", "confidence"],
        default="all",
        help="'confidence': fit only the confidence head, e.g. on answers held out from the backbone's training",
    )
    parser.add_argument("--include-shared-weights", action="store_true", help="also store embed_tokens/lm_head copies")
    parser.add_argument("--save-dtype", choices=["bf16", "fp32"], default="fp32", help="dtype of the saved weights")
    parser.set_defaults(func=run)


def drafter_config(args, target, tokenizer) -> DSparkConfig:
    """A fresh drafter shaped like the target's layers, as the options say (dflash: no Markov or confidence head)."""
    depth = target.config.get_text_config().num_hidden_layers
    vocab = target.get_input_embeddings().weight.shape[0]
    dflash = args.arch == "dflash"
    return DSparkConfig.for_target(
        target.config,
        num_hidden_layers=args.layers,
        target_layer_ids=args.target_layer_ids or zlab_default_layer_ids(depth, args.num_target_features),
        block_size=args.block_size,
        mask_token_id=args.mask_token_id if args.mask_token_id is not None else choose_mask_token(tokenizer, vocab),
        markov_rank=0 if dflash else args.markov_rank,
        markov_head_type=None if dflash else args.markov_head,
        enable_confidence_head=not dflash,
        confidence_head_with_markov=not dflash,
        draft_vocab_size=args.draft_vocab,
    )


def train_settings(args) -> TrainSettings:
    return TrainSettings(
        max_steps=args.max_steps,
        sequences_per_step=args.batch_size,
        anchors_per_sequence=args.anchors,
        max_tokens=args.max_tokens,
        learning_rate=args.lr,
        warmup_steps=args.warmup_steps,
        ce_weight=args.ce_weight,
        l1_weight=args.l1_weight,
        loss_vocab=args.loss_vocab,
        trainable=args.trainable,
        autocast=args.autocast,
        init=args.init,
        save_every=args.save_every,
        log_every=args.log_every,
        eval_every=args.eval_every,
        seed=args.seed,
    )


def run(args) -> None:
    """`dspark train`: every input is read before a model loads, and before --out exists: a bad file costs nothing."""
    from .data import load_sequences, tokenize_texts
    from .regenerate import regenerate

    if not (args.prompts or args.data or args.text):
        raise InputError("give training data: --prompts (the target answers them), --data, or --text.")
    prompts = read_prompts(args.prompts, limit=args.max_prompts) if args.prompts else None
    sequences = [r for path in args.data or [] for r in load_sequences(path)]
    texts = [Path(path).read_text(errors="replace") for path in args.text or []]
    eval_sequences = [r for path in args.eval_data for r in load_sequences(path)] if args.eval_data else None
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill saves the last finished step too
    state = process_state(args.device)
    # under accelerate launch: this process's own GPU; a CPU has no index (torch.load cannot map to "cpu:0")
    device = args.device or ("cpu" if state.device.type == "cpu" else str(state.device))
    threads_why = apply_threads(args)
    target, tokenizer = load_target(args.target, dtype=args.dtype, device=device,
                                    local_files_only=args.local_files_only)
    if state.is_main_process:
        announce(args, target, threads_why)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    if prompts is not None:
        regenerated = out / "regenerated"
        regenerate(target, tokenizer, prompts, regenerated, batch_size=args.regen_batch_size,
                   max_new_tokens=args.max_new_tokens)
        sequences = load_sequences(regenerated)
    sequences += tokenize_texts(tokenizer, texts)
    config = drafter_config(args, target, tokenizer)
    drafter = train(target, sequences, out, config=config, settings=train_settings(args), resume=args.resume,
                    init_from=args.init_from, feature_cache=args.feature_cache, device=device,
                    eval_sequences=eval_sequences)
    if state.is_main_process:
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.save_dtype]
        drafter.save_pretrained(out, include_shared_weights=args.include_shared_weights, dtype=dtype)
        print(json.dumps({"out": str(out), "steps": args.max_steps, "sequences": len(sequences)}))
    leave(state)
