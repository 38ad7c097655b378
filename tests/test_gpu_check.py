"""scripts/gpu_check.sh at toy size on the CPU: every step runs and the report is complete.

A GPU slot is short and rare; the check must not meet its first bug there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_check(out: Path, *options: str) -> dict:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    command = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--toy", "--device", "cpu"]
    subprocess.run([*command, "--dtype", "float32", *options], check=True, env=env, cwd=ROOT, timeout=900)
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["errors"] == {}
    assert "| T_verify(n) ms |" in (out / "gpu_check.md").read_text()
    return report


def test_gpu_check_reports_every_measure(tmp_path):
    report = run_check(tmp_path, "--no-compile")
    assert list(report["verify_ms"]) == [str(n) for n in range(1, 17)]
    assert all(ms > 0 for ms in report["verify_ms"].values())
    assert report["draft_pass_ms"] > 0 and report["glue_us_per_round"] > 0
    decoding = report["decoding"]
    assert decoding["dspark_rounds"] > 0 and decoding["dspark_tokens_per_round"] >= 1
    assert decoding["verified_per_round"] > 4  # whole blocks of 7, but for the last rounds before max_length
    assert decoding["host_ms_per_round"] is not None and decoding["plain_tokens_per_s"] > 0
    assert "syncs" not in report  # counted on CUDA only


@pytest.mark.slow  # inductor compiles the draft pass: about a minute on a CPU
@pytest.mark.skipif(not shutil.which("g++"), reason="no C++ compiler for inductor")
def test_gpu_check_compiles_the_draft_pass(tmp_path):
    report = run_check(tmp_path)
    assert report["compiled_draft_pass_ms"] > 0 and report["compile_seconds"] > 0
    assert report["compiled_decoding"]["dspark_rounds"] > 0
