"""Time on the device's clock: the helpers that time rounds, whole generate() calls and profiled passes."""

from __future__ import annotations

import time
from typing import Callable

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that the host's clock measures it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of one `run()`, queued GPU work included (for profiling; a round uses Stopwatch marks)."""
    synchronize(device)
    started = time.perf_counter()
    run()
    synchronize(device)
    return time.perf_counter() - started


class Stopwatch:
    """Marks on the device's clock: CUDA events where there is CUDA, read only when asked; else the host's clock.

    A mark never waits for the device, so marking inside a round costs no host sync."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, start, end) -> float:
        """Seconds between two marks; on CUDA this waits for the work queued before `end`."""
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1000
