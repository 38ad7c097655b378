"""Facts about this machine that the cost tables and the tools both key on: where dspark_hf keeps what it
measures or converts, the CPU's name, and how busy its cores are. Standard library only."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from pathlib import Path
from typing import Optional

CACHE_ENV_VAR = "DSPARK_HF_CACHE"


def cache_root() -> Path:
    """Where dspark_hf keeps what it measures or converts: `$DSPARK_HF_CACHE`, else `~/.cache/dspark_hf`."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "dspark_hf"


def cpu_model() -> str:
    """The CPU's marketing name where Linux tells it; platform.processor() is often empty."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (a container or `taskset` may allow fewer than the machine has)."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def cpu_ticks(cpus: set[int]) -> Optional[tuple[int, int]]:
    """(all, idle + iowait) ticks since boot summed over `cpus`, from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            lines = [line.split() for line in stat if line.startswith("cpu") and line[3].isdigit()]
        rows = [[int(value) for value in fields[1:]] for fields in lines if int(fields[0][3:]) in cpus]
    except (OSError, ValueError, IndexError):
        return None
    if not rows:
        return None
    return sum(sum(row) for row in rows), sum(row[3] + row[4] for row in rows)


def busy_cores(seconds: float = 0.2) -> float:
    """Of the CPUs this process may use, how many other processes keep busy now: /proc/stat over `seconds` while
    this one sleeps (the 1-minute load average where there is no /proc/stat). A live sample, not the load
    average, which still counts for a minute a job that has ended."""
    others = OtherProcesses()
    if others.ticks is None:
        return os.getloadavg()[0]
    time.sleep(seconds)
    return others.busy_cores()


@dataclasses.dataclass
class OtherProcesses:
    """How many of this process's CPUs *other* processes kept busy from construction to `busy_cores()`: the
    CPUs' busy share minus this process's own CPU time. A timing made beside another job says little about
    a quiet machine, so the cost tables are kept on disk only when this is small."""

    cpus: set[int] = dataclasses.field(default_factory=usable_cpus)

    def __post_init__(self):
        self.ticks, self.own, self.wall = cpu_ticks(self.cpus), time.process_time(), time.perf_counter()

    def busy_cores(self) -> float:
        ticks, wall = cpu_ticks(self.cpus), time.perf_counter() - self.wall
        if self.ticks is None or ticks is None or wall <= 0:
            return 0.0  # nothing to read: taken as quiet, as before this was measured
        all_busy = (1 - (ticks[1] - self.ticks[1]) / max(1, ticks[0] - self.ticks[0])) * len(self.cpus)
        return max(0.0, all_busy - (time.process_time() - self.own) / wall)
