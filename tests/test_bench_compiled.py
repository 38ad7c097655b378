"""The compiled plain-decoding peer in `dspark bench`: a speed-up claimed only against eager decoding can hide that
a user would do better by compiling, so the bench offers that peer and reports its first call apart."""

from __future__ import annotations

import shutil

import pytest
import torch

from conftest import MASK_ID, drafter_config, tiny_target
from dspark_hf import DSparkDrafter
from dspark_hf.core.generation import attach_to_target
from dspark_hf.tools.bench import benchmark, prepare_method, render_markdown


def test_the_compiled_peer_is_transformers_static_cache_under_compile():
    method = prepare_method("plain-compiled", load_drafter=None, target=None)
    kwargs = method.generate_kwargs
    assert kwargs["cache_implementation"] == "static" and kwargs["compile_config"]._compile_all_devices
    assert method.drafter is None


def test_dspark_compiled_is_the_drafters_defaults_over_the_same_compiled_target():
    drafter = object()
    method = prepare_method("dspark-compiled", load_drafter=lambda *_: drafter, target=None)
    peer = prepare_method("plain-compiled", load_drafter=None, target=None).generate_kwargs
    kwargs = method.generate_kwargs
    assert kwargs["assistant_model"] is drafter and method.drafter is drafter
    assert {k: v for k, v in kwargs.items() if k != "assistant_model"}.keys() == peer.keys()
    assert kwargs["cache_implementation"] == "static" and kwargs["compile_config"]._compile_all_devices


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


@pytest.mark.slow  # inductor compiles the target's forward once per verify length: about a minute on a CPU
@pytest.mark.skipif(not shutil.which("g++"), reason="no C++ compiler for inductor")
def test_dspark_over_a_compiled_static_cache_target_is_plain_decoding():
    """transformers' assisted loop compiles the target when given a static cache and a compile config; the DSpark
    round must crop and extend that cache as it does a dynamic one (fp32: token for token)."""
    target = tiny_target("qwen3", seed=2)
    torch.manual_seed(0)
    drafter = DSparkDrafter(drafter_config(target), target)
    attach_to_target(target)
    kwargs = prepare_method("dspark-compiled", load_drafter=lambda *_: drafter, target=target).generate_kwargs
    for prompt in ([5, 6, 7, 8], [9, 3, 2, 11, 12, 4, 5]):
        ids = torch.tensor([prompt])
        expected = target.generate(ids, max_new_tokens=30, do_sample=False)
        assert target.generate(ids, max_new_tokens=30, do_sample=False, **kwargs).tolist() == expected.tolist()
        assert drafter.last_trace  # the drafter ran the rounds
