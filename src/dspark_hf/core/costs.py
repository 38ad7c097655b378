"""How long a round takes on this machine: the cost table the cost-aware scheduler reads.

`T_verify(n)` is one target forward of n new tokens after a cached context, for
n = 1..block+1 (the anchor plus up to a whole block); `T_draft` is one drafting
pass. Both depend on the hardware, the dtype and the two models, so they are
measured where generation runs, once, and kept on disk per (target, drafter,
device, dtype) under `$DSPARK_HF_CACHE/cost_tables` (default
`~/.cache/dspark_hf/cost_tables`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from .modeling import ContextCache
from .ngram import MAX_PROPOSAL_TOKENS
from .sampling import DraftTokenChooser
from .scheduling import CostTable

CACHE_ENV_VAR = "DSPARK_HF_CACHE"

# Long enough that attention over the context counts as it does mid-generation, short enough to profile fast.
PROFILE_CONTEXT_TOKENS = 256
PROFILE_REPEATS = 5
PROFILE_WARMUP = 2
# Past the block, verify times are measured at these lengths and interpolated: hybrid drafting may send an
# n-gram continuation of up to MAX_PROPOSAL_TOKENS, whose price it must know.
LONG_PROPOSAL_LENGTHS = (12, 17, 25, MAX_PROPOSAL_TOKENS + 1)


def cache_root() -> Path:
    """Where dspark_hf keeps what it measures or converts: `$DSPARK_HF_CACHE`, else `~/.cache/dspark_hf`."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "dspark_hf"


def cache_directory() -> Path:
    return cache_root() / "cost_tables"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cpu_model() -> str:
    """The CPU's marketing name where Linux tells it; platform.processor() is often empty."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def _device_name(device: torch.device) -> str:
    """The hardware, not just 'cuda:0': a table from another GPU model (or thread count) is not valid here."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"{cpu_model()} ({platform.machine()}), {torch.get_num_threads()} threads"
    return device.type


def cost_table_key(drafter) -> dict:
    """What the measured times depend on: both architectures, the device, the dtypes and CPU threads."""
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
        "drafter_dtype": str(drafter.dtype),
        "torch": torch.__version__,
        "verify_lengths": MAX_PROPOSAL_TOKENS + 1,
    }


def cost_table_path(drafter) -> Path:
    return cache_directory() / f"{_digest(cost_table_key(drafter))}.json"


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock times measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    run: Callable[[], object], device: torch.device, repeats: int = PROFILE_REPEATS, warmup: int = PROFILE_WARMUP
) -> float:
    """Median wall time of `run()` after a few unmeasured calls (kernel selection, allocator warm-up)."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.no_grad()
def measure_costs(drafter, context_tokens: int = PROFILE_CONTEXT_TOKENS, repeats: int = PROFILE_REPEATS) -> CostTable:
    """Time the target's verify forwards and one drafting pass after a cached context of random tokens."""
    target = drafter.target
    config = drafter.config
    device = target.get_input_embeddings().weight.device
    block_lengths = range(1, config.num_draft_tokens + 2)
    measured = sorted({*block_lengths, *(n for n in LONG_PROPOSAL_LENGTHS if n > block_lengths[-1])})
    longest = measured[-1]
    context_tokens = min(context_tokens, config.max_position_embeddings - longest - 1)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (1, context_tokens + longest), generator=generator).to(device)
    context_ids, new_ids = tokens[:, :context_tokens], tokens[:, context_tokens:]
    layers = config.hidden_state_indices
    prefill = target(context_ids, use_cache=True, output_hidden_states=layers)
    target_cache = prefill.cache

    def verify(num_tokens: int) -> None:
        target(new_ids[:, :num_tokens], cache=target_cache, output_hidden_states=layers)
        target_cache.crop(-num_tokens)

    seconds = {n: median_seconds(lambda n=n: verify(n), device, repeats) for n in measured}
    verify_seconds = interpolated(seconds)

    draft_context = ContextCache(context_tokens + config.block_size)
    context_hidden = [prefill.hidden_states[i] for i in layers]
    draft_context.append(drafter.context_kv(context_hidden, torch.arange(context_tokens)[None]))
    anchor = new_ids[0, :1]
    draft_ids = drafter.draft_token_ids()

    def draft() -> None:
        chooser = DraftTokenChooser(context_ids, None, False, config.vocab_size, draft_ids)
        drafter.draft(anchor, context_tokens, draft_context, chooser)

    return CostTable(median_seconds(draft, drafter.device, repeats), tuple(verify_seconds))


def interpolated(seconds: dict[int, float]) -> list[float]:
    """T_verify(1..longest) from times measured at some lengths, straight lines between them."""
    lengths = sorted(seconds)
    table = []
    for n in range(1, lengths[-1] + 1):
        upper = next(m for m in lengths if m >= n)
        lower = max(m for m in lengths if m <= n)
        share = 0.0 if upper == lower else (n - lower) / (upper - lower)
        table.append(seconds[lower] + share * (seconds[upper] - seconds[lower]))
    return table


def profile_costs(drafter, refresh: bool = False) -> CostTable:
    """The drafter's cost table: measured here and cached on disk; `refresh=True` measures again.

    The result is also kept on `drafter.cost_table`, which generation reads first
    (assign a CostTable there to skip profiling altogether).
    """
    path = cost_table_path(drafter)
    if path.is_file() and not refresh:
        stored = json.loads(path.read_text())
        table = CostTable(stored["draft_seconds"], tuple(stored["verify_seconds"]))
    else:
        print(
            f"[dspark_hf] profiling verify and draft costs on {_device_name(drafter.device)} for the cost scheduler "
            f"(once; cached in {path.parent}) ...",
            file=sys.stderr,
            flush=True,
        )
        table = measure_costs(drafter)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {**table.to_dict(), "key": cost_table_key(drafter), "context_tokens": PROFILE_CONTEXT_TOKENS}
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record, indent=2))
        temporary.replace(path)
    drafter.cost_table = table
    return table
