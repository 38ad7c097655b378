"""How long a round takes on this machine: the cost table the cost-aware scheduler reads.

`T_verify(n)` is one target forward of n new tokens after a cached context, for n = 1 up
to the longest n-gram proposal (and at least the anchor plus a whole block); `T_draft` is
one drafting pass. Both depend on the hardware, the dtype and the two models, so they are
measured where generation runs, once, and kept on disk per (target, drafter, device, dtype,
CPU threads) under `$DSPARK_HF_CACHE/cost_tables` (default `~/.cache/dspark_hf/cost_tables`).
A CPU table timed while other processes kept this one's cores busy is not kept: it serves the
process that measured it, and the next process measures again.

The first call that needs the table pays for measuring it, so measuring is bounded at any
model size: a budget of `PROFILE_BUDGET_STEPS` one-token forwards (about as long as that many
tokens of plain decoding), or `PROFILE_MIN_SECONDS` where those are fast. Verify forwards are
timed at a few lengths only (`PROFILED_LENGTHS`, the whole block, the longest proposal), with
straight lines between them. One token, the whole block and the draft pass are always timed;
the other lengths, and repeats that sharpen the times, only while the time they are expected
to take fits in the budget. A 135M target gets every length, each a few times, within the
floor; a Qwen3-4B-sized one on a CPU gets one token and the block, and its longer verifies
are extrapolated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .lm_head import column_rows
from .machine import OtherProcesses, cache_root, cpu_model
from .modeling import ContextCache
from .ngram import MAX_PROPOSAL_TOKENS
from .sampling import DraftTokenChooser
from .scheduling import CostTable
from .timing import timed

# Long enough that attention over the context counts as it does mid-generation. The context is read from
# FIRST_CONTEXT_TOKENS on, doubling, and stops growing where the next chunk would take it past CONTEXT_SHARE of
# the budget (a big target on a CPU, where reading a long context costs many one-token forwards).
PROFILE_CONTEXT_TOKENS = 256
FIRST_CONTEXT_TOKENS = 16
CONTEXT_SHARE = 0.25
# Verify lengths timed besides the whole block and the longest proposal; T_verify is interpolated in between.
PROFILED_LENGTHS = (1, 2, 4, 8, 16)
# At most this many runs per length (and of the draft pass); the fastest counts.
PROFILE_RUNS = 7
# The budget: this many one-token forwards (about the price of as many tokens of plain decoding), or this many
# seconds where forwards are fast.
PROFILE_BUDGET_STEPS = 12
PROFILE_MIN_SECONDS = 2.0
# A progress bar appears when profiling has taken longer than this.
PROGRESS_AFTER_SECONDS = 3.0
# A CPU table is kept on disk only if other processes kept fewer of this process's cores busy than this while it
# was measured: timed beside a job, verifying 4 tokens read 216 ms where a quiet AVX2 EPYC takes 144, and a table
# kept on disk is read by every later run.
QUIET_OTHER_CORES = 0.5


def cache_directory() -> Path:
    return cache_root() / "cost_tables"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _device_name(device: torch.device) -> str:
    """The hardware, not just 'cuda:0': a table from another GPU model (or thread count) is not valid here."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        threads = torch.get_num_threads()
        return f"{cpu_model()} ({platform.machine()}), {threads} thread{'s' * (threads != 1)}"
    return device.type


def cost_table_key(drafter) -> dict:
    """What the measured times depend on: both architectures, the device, the dtypes, CPU threads and the head's product."""
    target = drafter.target
    device = drafter.device
    return {
        "target": type(target).__name__,
        "target_config": _digest(target.config.to_dict()),
        "drafter_config": _digest(dataclasses.asdict(drafter.config)),
        "device": str(device),
        "device_name": _device_name(device),
        "cpu_threads": torch.get_num_threads() if device.type == "cpu" else None,
        "target_dtype": str(target.get_input_embeddings().weight.dtype),
        "head_column_rows": column_rows(target.get_output_embeddings()),
        "drafter_dtype": str(drafter.dtype),
        "torch": torch.__version__,
        "verify_lengths": MAX_PROPOSAL_TOKENS + 1,
    }


def cost_table_path(drafter) -> Path:
    return cache_directory() / f"{_digest(cost_table_key(drafter))}.json"


def profiled_lengths(num_draft_tokens: int) -> list[int]:
    """The verify lengths timed, in the order their repeats are worth most: one token and the anchor plus a whole
    block (the "auto" scheduler weighs one against the other), then PROFILED_LENGTHS and the longest proposal."""
    block, longest = num_draft_tokens + 1, max(num_draft_tokens + 1, MAX_PROPOSAL_TOKENS + 1)
    others = sorted({n for n in PROFILED_LENGTHS if n < longest} | {longest} - {1, block})
    return [1, block, *others]


@torch.no_grad()
def measure_costs(drafter, context_tokens: int = PROFILE_CONTEXT_TOKENS) -> CostTable:
    """Time the target's verify forwards and one drafting pass after a cached context of random tokens.

    Within the budget (see the module's docstring): the context grows by doubling while the next chunk fits in
    its share; then one token, the whole block and the draft pass are timed, and every other length and every
    repeat only where the time it is expected to take still fits.
    """
    started = time.perf_counter()
    target, config = drafter.target, drafter.config
    device = target.get_input_embeddings().weight.device
    lengths = profiled_lengths(config.num_draft_tokens)
    longest = max(lengths)
    context_tokens = min(context_tokens, config.max_position_embeddings - longest - 1)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (1, context_tokens + longest), generator=generator).to(device)
    context_ids, new_ids = tokens[:, :context_tokens], tokens[:, context_tokens:]
    layers = config.hidden_state_indices
    target_cache, features, read = None, [], 0

    def elapsed() -> float:
        return time.perf_counter() - started

    def read_context(count: int) -> None:
        """Extend the target's cache by the next `count` context tokens, keeping their features for the drafter."""
        nonlocal target_cache, read
        output = target(context_ids[:, read : read + count], cache=target_cache, use_cache=True,
                        output_hidden_states=layers)
        target_cache = output.cache
        features.append([output.hidden_states[i] for i in layers])
        read += count

    def verify(num_tokens: int) -> None:
        target(new_ids[:, :num_tokens], cache=target_cache, output_hidden_states=layers)
        target_cache.crop(-num_tokens)

    chunk = min(FIRST_CONTEXT_TOKENS, context_tokens)
    chunk_seconds = timed(lambda: read_context(chunk), device)
    step = min(timed(lambda: verify(1), device) for _ in range(2))  # the first of the two warms up
    budget = max(PROFILE_MIN_SECONDS, PROFILE_BUDGET_STEPS * step)
    while read < context_tokens:
        following = min(read, context_tokens - read)  # the context doubles
        if elapsed() + chunk_seconds * following / chunk > CONTEXT_SHARE * budget:
            break
        chunk, chunk_seconds = following, timed(lambda: read_context(following), device)

    draft_context = ContextCache(read + config.block_size)
    context_hidden = [torch.cat(per_layer, dim=1) for per_layer in zip(*features)]
    draft_context.append(drafter.context_kv(context_hidden, torch.arange(read)[None]))
    anchor = new_ids[0, :1]
    draft_ids = drafter.draft_token_ids()

    def draft() -> None:
        chooser = DraftTokenChooser(context_ids[:, :read], None, False, config.vocab_size, draft_ids)
        drafter.draft(anchor, read, draft_context, chooser)

    # One token and the whole block ("auto" weighs one against the other) and the draft pass are always timed.
    passes = {**{n: lambda n=n: verify(n) for n in lengths[:2]}, "draft": draft,
              **{n: lambda n=n: verify(n) for n in lengths[2:]}}
    always = {*lengths[:2], "draft"}
    runs = {name: [] for name in passes}
    progress = tqdm(total=round(budget, 1), unit="s", desc="[dspark_hf] profiling costs", file=sys.stderr,
                    delay=PROGRESS_AFTER_SECONDS, bar_format="{desc}: {bar} {n:.0f}/{total:.0f} s")

    def measured() -> dict[int, float]:
        # The fastest run of each: the first ones pay for kernel selection and warm caches, and a busy machine
        # only ever adds time. The drafting gate then judges rounds by their real times.
        return {n: min(times) for n, times in runs.items() if n != "draft" and times}

    def expected(name) -> float:
        return min(runs[name]) if runs[name] else interpolated(measured(), name)[-1]

    for repeat in range(PROFILE_RUNS):
        for name, run in passes.items():
            if len(runs[name]) < repeat:
                continue  # it did not fit before, and the budget only shrinks
            if (repeat > 0 or name not in always) and elapsed() + expected(name) > budget:
                continue
            runs[name].append(timed(run, device))
            progress.total = max(progress.total, round(elapsed(), 1))  # what is always timed may overrun
            progress.update(round(elapsed(), 1) - progress.n)
    progress.n = progress.total
    progress.close()
    return CostTable(min(runs["draft"]), tuple(interpolated(measured(), longest)))


def interpolated(seconds: dict[int, float], longest: int) -> list[float]:
    """T_verify(1..longest) from times measured at some lengths (1 and at least one more): straight lines between
    them, and past the longest measured the line through the last two, never below it (a forward of many tokens
    costs more with each one once the hardware is busy)."""
    lengths = sorted(seconds)
    table = []
    for n in range(1, longest + 1):
        lower = max(m for m in lengths if m <= n)
        upper = next((m for m in lengths if m >= n), None)
        if upper is None:
            lower, upper = lengths[-2:]
        share = 0.0 if upper == lower else (n - lower) / (upper - lower)
        line = seconds[lower] + share * (seconds[upper] - seconds[lower])
        table.append(max(line, min(seconds[lower], seconds[upper])))  # past the last: never below it
    return table


def profile_costs(drafter, refresh: bool = False) -> CostTable:
    """The drafter's cost table: measured here and cached on disk; `refresh=True` measures again.

    The result is also kept on `drafter.cost_table`, which generation reads first
    (assign a CostTable there to skip profiling altogether). Tools that time generate()
    call this first, so that the timed call does not include the measuring.
    """
    path = cost_table_path(drafter)
    if path.is_file() and not refresh:
        stored = json.loads(path.read_text())
        table = CostTable(stored["draft_seconds"], tuple(stored["verify_seconds"]))
    else:
        print(
            f"[dspark_hf] profiling verify and draft costs on {_device_name(drafter.device)} for the cost scheduler "
            f"(once, a few seconds on a small model; cached in {path.parent}) ...",
            file=sys.stderr,
            flush=True,
        )
        started, others = time.perf_counter(), OtherProcesses()
        table = measure_costs(drafter)
        seconds = time.perf_counter() - started
        busy = others.busy_cores() if drafter.device.type == "cpu" else 0.0
        keep = busy < QUIET_OTHER_CORES
        if keep:
            path.parent.mkdir(parents=True, exist_ok=True)
            record = {**table.to_dict(), "key": cost_table_key(drafter), "profile_seconds": round(seconds, 2),
                      "other_busy_cores": round(busy, 2)}
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(record, indent=2))
            temporary.replace(path)
        block = drafter.config.num_draft_tokens + 1
        kept = ("" if keep else f"; other processes kept {busy:.1f} cores busy meanwhile, so it "
                "serves this process only and the next one measures again (a table measured on a quiet machine is kept)")
        print(
            f"[dspark_hf] cost table measured in {seconds:.1f} s: T_verify(1) {table.verify(1) * 1e3:.1f} ms, "
            f"T_verify({block}) {table.verify(block) * 1e3:.1f} ms, T_draft {table.draft_seconds * 1e3:.1f} ms{kept}",
            file=sys.stderr,
            flush=True,
        )
    drafter.cost_table = table
    return table
