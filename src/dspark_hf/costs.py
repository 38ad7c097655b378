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
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

# Long enough that attention over the context counts as it does mid-generation, short enough to profile fast.
PROFILE_CONTEXT_TOKENS = 256
PROFILE_REPEATS = 5
PROFILE_WARMUP = 2


@dataclasses.dataclass(frozen=True)
class CostTable:
    """Seconds per drafting pass and per target forward of n = 1, 2, ... new tokens."""

    draft_seconds: float
    verify_seconds: tuple[float, ...]  # verify_seconds[n - 1] = T_verify(n)

    def __post_init__(self):
        object.__setattr__(self, "verify_seconds", tuple(float(s) for s in self.verify_seconds))
        if not self.verify_seconds or min(self.verify_seconds) <= 0 or self.draft_seconds < 0:
            raise ValueError(f"A cost table needs positive verify times and a non-negative draft time; got {self}.")

    def verify(self, num_tokens: int) -> float:
        """T_verify(num_tokens): the target reads the anchor plus num_tokens - 1 draft tokens."""
        return self.verify_seconds[num_tokens - 1]

    def drafted_round(self, num_verified: int) -> float:
        """cost(l) = T_draft + T_verify(1 + l): a round that drafts and sends l tokens to the target."""
        return self.draft_seconds + self.verify(1 + num_verified)

    def to_dict(self) -> dict:
        return {"draft_seconds": self.draft_seconds, "verify_seconds": list(self.verify_seconds)}


def cache_directory() -> Path:
    from .smollm2 import default_cache_dir

    return default_cache_dir() / "cost_tables"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _device_name(device: torch.device) -> str:
    """The hardware, not just 'cuda:0': a table from another GPU model (or thread count) is not valid here."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"{platform.machine()} {platform.processor()} threads={torch.get_num_threads()}"
    return device.type


def cost_table_key(drafter) -> dict:
    """What the measured times depend on: both architectures, the device and the dtypes."""
    target = drafter.target
    device = drafter.device
    return {
        "target": type(target).__name__,
        "target_config": _digest(target.config.to_dict()),
        "drafter_config": _digest(dataclasses.asdict(drafter.config)),
        "device": str(device),
        "device_name": _device_name(device),
        "target_dtype": str(target.get_input_embeddings().weight.dtype),
        "drafter_dtype": str(drafter.dtype),
        "torch": torch.__version__,
    }


def cost_table_path(drafter) -> Path:
    return cache_directory() / f"{_digest(cost_table_key(drafter))}.json"


def _synchronize() -> None:
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()


def median_seconds(run: Callable[[], object], repeats: int = PROFILE_REPEATS, warmup: int = PROFILE_WARMUP) -> float:
    """Median wall time of `run()` after a few unmeasured calls (kernel selection, allocator warm-up)."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        _synchronize()
        started = time.perf_counter()
        run()
        _synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.no_grad()
def measure_costs(drafter, context_tokens: int = PROFILE_CONTEXT_TOKENS, repeats: int = PROFILE_REPEATS) -> CostTable:
    """Time the target's verify forwards and one drafting pass after a cached context of random tokens."""
    from .generation import hidden_state_indices
    from .modeling import ContextCache
    from .sampling import DraftTokenChooser

    target = drafter.target
    config = drafter.config
    device = target.get_input_embeddings().weight.device
    longest = config.num_draft_tokens + 1
    context_tokens = min(context_tokens, config.max_position_embeddings - longest - 1)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (1, context_tokens + longest), generator=generator).to(device)
    context_ids, new_ids = tokens[:, :context_tokens], tokens[:, context_tokens:]
    layers = hidden_state_indices(config)
    prefill = target(context_ids, use_cache=True, output_hidden_states=layers)
    target_cache = prefill.cache

    def verify(num_tokens: int) -> None:
        target(new_ids[:, :num_tokens], cache=target_cache, output_hidden_states=layers)
        target_cache.crop(-num_tokens)

    verify_seconds = [median_seconds(lambda n=n: verify(n), repeats) for n in range(1, longest + 1)]

    draft_context = ContextCache()
    positions = torch.arange(context_tokens)[None]
    draft_context.append(drafter.context_kv([prefill.hidden_states[i] for i in layers], positions))
    anchor = int(new_ids[0, 0])

    def draft() -> None:
        drafter.draft(anchor, context_tokens, draft_context, DraftTokenChooser(context_ids, None, do_sample=False))

    return CostTable(median_seconds(draft, repeats), tuple(verify_seconds))


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
        table = measure_costs(drafter)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {**table.to_dict(), "key": cost_table_key(drafter), "context_tokens": PROFILE_CONTEXT_TOKENS}
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record, indent=2))
        temporary.replace(path)
    drafter.cost_table = table
    return table
