"""T_verify(n) of the default target, fp32 and bf16: one forward over n new tokens after a 256-token cache (CPU).

    OMP_NUM_THREADS=1 python scripts/verify_costs.py; OMP_NUM_THREADS=2 python scripts/verify_costs.py

Prints the median of 5 timed forwards after 2 warm-ups, in ms, for n = 1, 2, 4, 8, 16, 32.
"""

from __future__ import annotations

import statistics
import time

import torch

from dspark_hf.tools.targets import load_smollm2

CONTEXT, LENGTHS = 256, (1, 2, 4, 8, 16, 32)


@torch.no_grad()
def verify_milliseconds(target) -> dict[int, float]:
    ids = torch.randint(0, target.config.vocab_size, (1, CONTEXT + max(LENGTHS)), generator=torch.Generator().manual_seed(0))
    cache = target(ids[:, :CONTEXT], use_cache=True).cache
    times = {}
    for n in LENGTHS:
        runs = []
        for _ in range(7):
            started = time.perf_counter()
            target(ids[:, CONTEXT : CONTEXT + n], cache=cache)
            runs.append(time.perf_counter() - started)
            cache.crop(-n)
        times[n] = statistics.median(runs[2:]) * 1000
    return times


def main() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        target, _ = load_smollm2(dtype=dtype)
        row = " | ".join(f"{ms:.1f}" for ms in verify_milliseconds(target).values())
        print(f"| {str(dtype).removeprefix('torch.')}, {torch.get_num_threads()} thread(s) | {row} |")


if __name__ == "__main__":
    main()
