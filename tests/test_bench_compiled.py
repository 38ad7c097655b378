"""The compiled plain-decoding peer in `dspark bench`: a speed-up claimed only against eager decoding can hide that
a user would do better by compiling, so the bench offers that peer and reports its first call apart."""

from __future__ import annotations

import shutil

import pytest
import torch

from conftest import MASK_ID, tiny_target
from dspark_hf.tools.bench import benchmark, prepare_method, render_markdown


def test_the_compiled_peer_is_transformers_static_cache_under_compile():
    method = prepare_method("plain-compiled", load_drafter=None, target=None)
    kwargs = method.generate_kwargs
    assert kwargs["cache_implementation"] == "static" and kwargs["compile_config"]._compile_all_devices
    assert method.drafter is None


@pytest.mark.slow  # inductor compiles the target's forward: about a minute on a CPU
@pytest.mark.skipif(not shutil.which("g++"), reason="no C++ compiler for inductor")
def test_bench_reports_speedups_against_the_compiled_peer_and_its_compile_time():
    target = tiny_target("qwen3")
    generator = torch.Generator().manual_seed(0)
    prompt_sets = {"set": [torch.randint(0, MASK_ID, (n,), generator=generator).tolist() for n in (5, 9)]}
    report = benchmark(target, prompt_sets, ["plain", "plain-compiled"], max_new_tokens=8, progress=False)
    rows = {row["method"]: row for row in report["results"]}
    assert rows["plain-compiled"]["greedy_mismatches"] == 0
    assert rows["plain-compiled"]["speedup_vs_compiled"] == 1.0 and rows["plain"]["speedup_vs_compiled"] > 0
    first = report["first_call_seconds"]
    assert first["plain-compiled"] > first["plain"]  # the compile
    assert "Speed-up against plain-compiled (median)" in render_markdown(report)
