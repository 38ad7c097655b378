"""Several processes under `accelerate launch` or `torchrun`; one when a tool runs plainly.

Every process holds the whole drafter and its own frozen target. After each step's
backward passes the gradients are summed over the processes, as DDP does, so every
process takes the same optimizer step from the same weights and they never drift
apart. DDP itself hooks the module's forward, which the trainer never calls: it runs
the drafter's parts (backbone, heads) directly, as inference does.
"""

from __future__ import annotations

import os
import sys

import torch
from accelerate import PartialState
from accelerate.utils import parse_flag_from_env


def process_state(device: str | torch.device | None = None) -> PartialState:
    """This process's rank and count (accelerate's state, shared by the whole process).

    Processes on CPUs talk over gloo, which accelerate picks only when told the run is on
    the CPU; so it is told whenever it is: `--cpu`, `--device cpu`, or no CUDA at all.
    """
    on_cpu = (
        parse_flag_from_env("ACCELERATE_USE_CPU")
        or not torch.cuda.is_available()
        or (device is not None and torch.device(device).type == "cpu")
    )
    return PartialState(cpu=on_cpu)


def leave(state: PartialState) -> None:
    """End a process of a multi-process run once every process has finished its work.

    The process group cannot be torn down cleanly here: once transformers has built a model
    under it, something outside our reach keeps it alive past `destroy_process_group`, so
    gloo's worker threads outlive Python. When one of them drops the last reference to a
    tensor during interpreter shutdown it needs the GIL, and taking the GIL there kills the
    thread inside a noexcept frame: the process aborts ('terminate called without an active
    exception') after its work is done, seen in about 1 of 25 two-process runs. So the
    processes meet at a barrier, flush what they wrote and exit without interpreter shutdown.
    """
    if state.num_processes == 1:
        return
    state.wait_for_everyone()
    state.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def sum_across(values: torch.Tensor, state: PartialState) -> torch.Tensor:
    """`values` summed over every process, in place."""
    if state.num_processes > 1:
        torch.distributed.all_reduce(values)
    return values


def sum_gradients(params: list[torch.nn.Parameter], state: PartialState) -> None:
    """Sum the gradients over the processes in one flat all-reduce.

    Each process divided its losses by the global batch, so the sum is the global batch's
    mean gradient. A parameter that got no gradient here counts as zero, so every process
    still applies the same update.
    """
    if state.num_processes == 1:
        return
    grads = [param.grad if param.grad is not None else torch.zeros_like(param) for param in params]
    flat = sum_across(torch.cat([grad.flatten() for grad in grads]), state)
    for param, grad in zip(params, flat.split([param.numel() for param in params])):
        param.grad = grad.view_as(param)
