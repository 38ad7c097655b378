"""T_verify(n) of the default target, fp32 and bf16: one forward over n new tokens after a 256-token cache (CPU).

    OMP_NUM_THREADS=1 python scripts/verify_costs.py; OMP_NUM_THREADS=2 python scripts/verify_costs.py

Prints the median of 5 timed forwards after 2 warm-ups, in ms, for n = 1, 2, 4, 8, 16, 32.
scripts/gpu_check.py times T_verify(1..16) on a GPU with `verify_milliseconds`.
"""

from __future__ import annotations

import inspect
import statistics
import time

import torch

from dspark_hf.core.timing import synchronize
from dspark_hf.tools.targets import load_smollm2

CONTEXT, LENGTHS = 256, (1, 2, 4, 8, 16, 32)


def cache_argument(model) -> str:
    """The forward's cache argument: `cache` since transformers 5.2x, `past_key_values` before (GPU machines may lag)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def verify_milliseconds(target, lengths=LENGTHS, runs: int = 7) -> dict[int, float]:
    device = target.get_input_embeddings().weight.device
    ids = torch.randint(0, target.config.vocab_size, (1, CONTEXT + max(lengths)), generator=torch.Generator().manual_seed(0))
    ids, name = ids.to(device), cache_argument(target)
    cache = getattr(target(ids[:, :CONTEXT], use_cache=True), name)
    times = {}
    for n in lengths:
        spent = []
        for _ in range(runs):
            synchronize(device)
            started = time.perf_counter()
            target(ids[:, CONTEXT : CONTEXT + n], **{name: cache})
            synchronize(device)
            spent.append(time.perf_counter() - started)
            cache.crop(-n)
        times[n] = statistics.median(spent[2:]) * 1000
    return times


def main() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        target, _ = load_smollm2(dtype=dtype)
        row = " | ".join(f"{ms:.1f}" for ms in verify_milliseconds(target).values())
        print(f"| {str(dtype).removeprefix('torch.')}, {torch.get_num_threads()} thread(s) | {row} |")


if __name__ == "__main__":
    main()
