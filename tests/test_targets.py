"""Loading for the tools: paths checked before any model loads, and one thread choice for the CLI and the
Python API, so that both find the same cost table."""

from __future__ import annotations

import argparse

import pytest
import torch

import dspark_hf
from dspark_hf import CheckpointError
from dspark_hf.tools import options, targets


def test_a_missing_drafter_directory_is_named_before_the_target_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(targets, "load_target", lambda *args, **kwargs: pytest.fail("the target loaded first"))
    with pytest.raises(CheckpointError, match=rf"^{tmp_path}/nope: no such directory \(--drafter\)\.$"):
        targets.load_pair("smollm2", str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match=r"/no/such/target: no such directory \(--target\)\.$"):
        targets.load_pair("/no/such/target", str(tmp_path))


@pytest.fixture()
def two_cores_one_busy(monkeypatch):
    """A 2-core machine with 1.2 cores busy, no OMP_NUM_THREADS, torch at its default of 2; one thread after."""
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(targets, "busy_cores", lambda: 1.2)  # the one thread choice, options.apply_threads included
    monkeypatch.setattr(targets.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(1)  # the suite's setting (conftest)


def test_load_default_chooses_threads_as_the_cli_does(two_cores_one_busy, monkeypatch):
    monkeypatch.setattr(targets, "load_pair", lambda *args, **kwargs: None)
    dspark_hf.load_default()
    api_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    options.apply_threads(argparse.Namespace(threads=None))
    assert api_threads == torch.get_num_threads() == 1  # the idle core only, in both
    dspark_hf.load_default(threads=2)
    assert torch.get_num_threads() == 2
