"""The cost-aware scheduler: its math, its setting, its cost table, and that it stays lossless."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types

import pytest
import torch
from transformers import GenerationConfig

from conftest import tiny_target, write_deepspec
from dspark_hf import DSparkDrafter
from dspark_hf.core import costs
from dspark_hf.core.costs import cost_table_path, profile_costs
from dspark_hf.core.machine import OtherProcesses, busy_cores
from dspark_hf.core.modeling import ContextCache
from dspark_hf.core.ngram import MAX_PROPOSAL_TOKENS
from dspark_hf.core.sampling import DraftTokenChooser
from dspark_hf.core.scheduling import CostTable, DraftingGate, cost_aware_length, threshold_length
from reference_drafting import assert_rounds_match, reference_rounds
from test_generation import assert_trace_matches_output, build, prompts
from test_sampling import SMALL_VOCAB, chi_square, chi_square_critical, exact_joint


def linear_table(draft: float, base: float, per_token: float) -> CostTable:
    """T_draft, and T_verify(n) = base + per_token * (n - 1) for n = 1..16."""
    return CostTable(draft, tuple(base + per_token * n for n in range(16)))


TABLES = {
    # a GPU: free drafting, verifying 8 tokens costs what 1 does -> whole blocks, never skips
    "flat": linear_table(0.0, 1.0, 0.0),
    # a device that runs out of compute past 3 tokens: verify lengths of 2 at most
    "short": CostTable(0.0, (1.0, 1.1, 1.2) + tuple(4.0 + n for n in range(13))),
    # drafting costs ten forwards -> after the first round only probes draft
    "skip": linear_table(10.0, 1.0, 0.0),
    # a rejection in a round that verified anything makes the next round skip: skipping follows acceptance
    "graded": linear_table(0.0, 1.0, 0.2),
}
HALF_FORWARD_PER_TOKEN = linear_table(0.0, 1.0, 0.5)  # a compute-bound CPU


def cost_config(**fields) -> GenerationConfig:
    return GenerationConfig(dspark_scheduler="cost", **fields)


def simulate_costs(monkeypatch, target, drafter, table: CostTable) -> None:
    """Make the clock generation reads tick as `table` says: T_draft per draft pass, T_verify(n) per forward.

    The drafting gate prices rounds by the clock; with this, what it sees is the table."""
    clock = types.SimpleNamespace(now=0.0)
    ticking = types.SimpleNamespace(perf_counter=lambda: clock.now)
    for module in ("generation", "timing"):  # the gate's host clock, and the round records' Stopwatch
        monkeypatch.setattr(f"dspark_hf.core.{module}.time", ticking)
    draft, forward = drafter.draft, target.forward

    def timed_draft(*args, **kwargs):
        clock.now += table.draft_seconds
        return draft(*args, **kwargs)

    def timed_forward(input_ids=None, **kwargs):
        clock.now += table.verify(min(input_ids.shape[1], len(table.verify_seconds)))
        return forward(input_ids=input_ids, **kwargs)

    monkeypatch.setattr(drafter, "draft", timed_draft)
    monkeypatch.setattr(target, "forward", timed_forward)
    drafter.cost_table = table


# ------------------------------------------------------------- pure math
def test_flat_costs_verify_every_confident_token():
    c = torch.tensor([0.9, 0.8, 0.7, 0.6])
    assert cost_aware_length(c, TABLES["flat"], 4) == 4
    assert cost_aware_length(c, TABLES["flat"], 2) == 2  # the cap (num_assistant_tokens, max_length budget)
    assert cost_aware_length(None, HALF_FORWARD_PER_TOKEN, 3) == 3  # no confidence head: nothing to weigh


def test_length_follows_expected_tokens_per_second():
    # T_verify(n) = 1 + 0.5 (n - 1): E(0)/cost = 1; E(1)/cost = 1.9/1.5 = 1.27; E(2)/cost = (1.9+0.72)/2 = 1.31;
    # E(3)/cost = (2.62 + 0.36) / 2.5 = 1.19 does not improve -> 2
    c = torch.tensor([0.9, 0.8, 0.5, 0.99])
    assert cost_aware_length(c, HALF_FORWARD_PER_TOKEN, 4) == 2
    assert cost_aware_length(torch.tensor([0.4, 0.99]), HALF_FORWARD_PER_TOKEN, 2) == 0  # 1.4/1.5 < 1


def test_walk_looks_ahead_with_the_current_confidence_only():
    # Verifying 1 draft token costs what 3 do (a CPU's step from one token to several). Position 1 alone does
    # not pay (1.9 tokens in 2 s < 1 token/s), but three tokens at c_1 = 0.9 each would (3.44 in 2 s): x_1 is kept.
    step = CostTable(0.0, (1.0, 2.0, 2.0, 2.0))
    assert cost_aware_length(torch.tensor([0.9, 0.9, 0.9]), step, 3) == 3
    # With c_1 = 0.3 even three would not (1.39 in 2 s): nothing is verified, whatever c_2 and c_3 say --
    # reading them would make the decision about x_1 depend on x_1, which they are computed from.
    assert cost_aware_length(torch.tensor([0.3, 0.99, 0.99]), step, 3) == 0
    # the walk still stops at the first position that does not pay: with each token past the step costing 0.5 s,
    # x_2 at c_2 = 0.2 brings 0.18 tokens for 0.5 s (2.08 / 2.5 < 1.9 / 2), and anything longer is worse
    rising = CostTable(0.0, (1.0, 2.0, 2.5, 3.0))
    assert cost_aware_length(torch.tensor([0.9, 0.2, 0.99]), rising, 3) == 1


def test_decision_never_reads_later_confidences():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        c = torch.rand(6, generator=generator)
        length = cost_aware_length(c, HALF_FORWARD_PER_TOKEN, 6)
        changed = c.clone()
        changed[length + 1 :] = torch.rand(len(c) - length - 1, generator=generator)
        assert cost_aware_length(changed, HALF_FORWARD_PER_TOKEN, 6) == length


def test_gate_skips_when_drafted_rounds_lose_to_plain_decoding():
    gate = DraftingGate(TABLES["graded"], window=2, probe_every=3)
    assert gate.should_draft()  # no history yet
    gate.record(drafted=True, num_committed=1, seconds=1.4)  # 1 token in 1.4 s < the table's 1 token/s
    assert not gate.should_draft()
    for _ in range(3):
        assert not gate.should_draft()
        gate.record(drafted=False, num_committed=1, seconds=1.0)
    assert gate.should_draft()  # probe
    gate.record(drafted=True, num_committed=3, seconds=1.4)  # window: 4 tokens in 2.8 s
    assert gate.should_draft()
    gate.record(drafted=True, num_committed=1, seconds=1.0)  # 1 token in 1 s: a tie with plain decoding drafts
    assert gate.should_draft()


def test_gate_notices_a_machine_that_got_busier():
    """The table was profiled on an idle machine; under load a verify round takes 8x longer, a plain step 1.3x."""
    gate = DraftingGate(HALF_FORWARD_PER_TOKEN, window=2, probe_every=4)
    gate.record(drafted=True, num_committed=3, seconds=2.5)  # as profiled: 3 tokens in 2.5 s beats 1 token/s
    assert gate.should_draft()
    gate.record(drafted=True, num_committed=3, seconds=20.0)
    gate.record(drafted=True, num_committed=3, seconds=20.0)  # loaded: 6 tokens in 40 s
    assert not gate.should_draft()
    for _ in range(4):
        gate.record(drafted=False, num_committed=1, seconds=1.3)  # plain steps, measured under the same load
    assert gate.should_draft()  # the probe
    gate.record(drafted=True, num_committed=3, seconds=2.6)  # load gone: drafting pays again against 1.3 s steps
    gate.record(drafted=True, num_committed=3, seconds=2.6)
    assert gate.should_draft()


def test_cost_table_rejects_nonsense():
    with pytest.raises(ValueError):
        CostTable(0.1, ())
    with pytest.raises(ValueError):
        CostTable(0.1, (1.0, 0.0))
    assert HALF_FORWARD_PER_TOKEN.rate(3.0, 2, drafted=True) == pytest.approx(1.5)  # 3 tokens in 2.0 s


# --------------------------------------------------- lossless generation
@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("block_size", [2, 5, 8])
def test_greedy_equals_plain_generate(table, block_size, tmp_path, monkeypatch):
    target = tiny_target("qwen3")
    drafter = build(target, tmp_path, "bigram", block_size=block_size)
    simulate_costs(monkeypatch, target, drafter, TABLES[table])
    drafter.generation_config.dspark_scheduler = "cost"
    rounds = []
    for i, prompt in enumerate(prompts(4, seed=block_size)):
        new_tokens = 4 + 13 * i
        expected = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False)
        produced = target.generate(prompt, max_new_tokens=new_tokens, do_sample=False, assistant_model=drafter)
        assert produced.tolist() == expected.tolist()
        assert_trace_matches_output(drafter, prompt, produced)
        timings = [r.draft_seconds + r.verify_seconds for r in drafter.last_trace]
        reference = reference_rounds(target, drafter, prompt, expected, costs=TABLES[table], timings=timings)
        assert_rounds_match(drafter.last_trace, reference)
        rounds += drafter.last_trace
    skipped = [r for r in rounds if not r.draft_ids]
    assert all(r.num_verified == 0 and len(r.committed_ids) == 1 for r in skipped)
    verified = [r.num_verified for r in rounds if r.draft_ids]
    if table == "flat":
        assert len(skipped) <= 4 and max(verified) == block_size  # only the last rounds of each prompt draft nothing
    if table == "short":
        assert max(verified) <= 2 and any(n > 0 for n in verified)
    if table == "skip":
        assert len(skipped) > len(verified)


def fresh_draft(drafter, sequence: torch.Tensor, position: int):
    """The block the drafter proposes after `sequence[position]` from a context built in one target pass."""
    hidden = drafter.target(sequence[:, :position], output_hidden_states=True).hidden_states
    context = ContextCache()
    layers = [hidden[i] for i in drafter.config.hidden_state_indices]
    context.append(drafter.context_kv(layers, torch.arange(position)[None]))
    chooser = DraftTokenChooser(sequence[:, : position + 1], None, do_sample=False)
    return drafter.draft(int(sequence[0, position]), position, context, chooser)


@torch.no_grad()
def test_drafting_resumes_with_the_right_context_after_skipped_rounds(tmp_path, monkeypatch):
    """Skipped rounds still feed the context cache: the next draft equals one made from scratch."""
    target = tiny_target("qwen3")
    drafter = build(target, tmp_path, "bigram", block_size=5)
    simulate_costs(monkeypatch, target, drafter, TABLES["skip"])
    prompt = prompts(1, seed=4)[0]
    config = cost_config(max_new_tokens=60, do_sample=False)
    output = target.generate(prompt, generation_config=config, assistant_model=drafter)
    trace = drafter.last_trace
    resumed = [r for before, r in zip(trace, trace[1:]) if r.draft_ids and not before.draft_ids]
    assert len(resumed) >= 2
    for record in resumed:
        block = fresh_draft(drafter, output, record.position)
        assert record.draft_ids == block.draft_ids.tolist()
        torch.testing.assert_close(torch.tensor(record.confidences), block.confidences, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # Monte Carlo; test_exact_sampling enumerates the cost scheduler's law exactly
@pytest.mark.parametrize("table", ["graded", "skip"])
def test_sampled_output_has_the_target_distribution(table, tmp_path, monkeypatch):
    """The first three tokens of six: round 1 verifies up to a whole block, round 2 depends on round 1."""
    target = tiny_target("qwen3", vocab=SMALL_VOCAB, seed=7, layers=3)
    path = write_deepspec(target, tmp_path / "d", mask_token_id=SMALL_VOCAB - 1, markov_rank=4, block_size=4)
    drafter = DSparkDrafter.from_pretrained(path, target)
    simulate_costs(monkeypatch, target, drafter, TABLES[table])
    config = cost_config(do_sample=True, temperature=0.8, top_k=4, max_new_tokens=6)
    prompt = torch.tensor([[1, 3, 0, 2]])
    length, samples = 3, 1000
    torch.manual_seed(0)
    counts, lengths, skipped = {}, set(), 0
    for _ in range(samples):
        out = target.generate(prompt, generation_config=config, assistant_model=drafter)
        key = tuple(out[0, prompt.shape[1] : prompt.shape[1] + length].tolist())
        counts[key] = counts.get(key, 0) + 1
        lengths |= {r.num_verified for r in drafter.last_trace if r.draft_ids}
        skipped += sum(not r.draft_ids for r in drafter.last_trace)
    assert skipped > 0
    if table == "graded":
        assert len(lengths) >= 2  # the verify length followed the confidences
    stat, dof = chi_square(counts, exact_joint(target, prompt, length, 0.8, 4), samples)
    print(f"chi2={stat:.1f} dof={dof} critical={chi_square_critical(dof):.1f} lengths={sorted(lengths)}")
    assert stat < chi_square_critical(dof)


# ------------------------------------------------------- the setting
def test_scheduler_setting_precedence(tmp_path, monkeypatch):
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram", block_size=7)
    simulate_costs(monkeypatch, target, drafter, TABLES["skip"])
    prompt = prompts(1, seed=3)[0]

    def skipped_rounds(config=None) -> int:
        config = config or GenerationConfig(max_new_tokens=30, do_sample=False)
        target.generate(prompt, generation_config=config, assistant_model=drafter)
        return sum(not r.draft_ids for r in drafter.last_trace[:-1])

    assert skipped_rounds() == 0  # the tests' default: threshold scheduler (conftest)
    drafter.generation_config.dspark_scheduler = "cost"
    assert skipped_rounds() > 0
    assert skipped_rounds(GenerationConfig(max_new_tokens=30, dspark_scheduler="threshold")) == 0
    drafter.generation_config.dspark_scheduler = "threshold"
    assert skipped_rounds(cost_config(max_new_tokens=30)) > 0
    assert skipped_rounds(GenerationConfig(max_new_tokens=30, do_sample=False)) == 0
    target.generate(prompt, max_new_tokens=30, do_sample=False, assistant_model=drafter, dspark_scheduler="cost")
    assert drafter.last_scheduler == "cost"  # a generate() kwarg like the other scheduler fields
    with pytest.raises(ValueError, match="dspark_scheduler"):
        target.generate(prompt, generation_config=GenerationConfig(max_new_tokens=3, dspark_scheduler="fast"),
                        assistant_model=drafter)


def test_cost_table_must_cover_the_block(tmp_path):
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram", block_size=7)
    drafter.cost_table = CostTable(0.1, (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="cost table"):
        target.generate(prompts(1)[0], generation_config=cost_config(max_new_tokens=5), assistant_model=drafter)


# --------------------------------------------------------- profiling
def test_profiled_once_then_read_from_disk(tmp_path, monkeypatch, quiet_machine):
    monkeypatch.setenv("DSPARK_HF_CACHE", str(tmp_path / "cache"))
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram", block_size=4)
    prompt = prompts(1)[0]
    # the first cost-scheduled generate() profiles this device and stores the table
    target.generate(prompt, generation_config=cost_config(max_new_tokens=8, do_sample=False), assistant_model=drafter)
    path = cost_table_path(drafter)
    stored = json.loads(path.read_text())
    assert path.parent == tmp_path / "cache" / "cost_tables"
    # T_verify(1..5) for the block, then up to the longest n-gram proposal (measured at a few lengths, interpolated)
    assert len(stored["verify_seconds"]) == MAX_PROPOSAL_TOKENS + 1 and stored["draft_seconds"] > 0
    assert stored["key"]["device"] == "cpu" and stored["key"]["drafter_dtype"] == "torch.float32"
    assert drafter.cost_table.verify_seconds == tuple(stored["verify_seconds"])
    # a fresh drafter reads the file instead of measuring; refresh=True measures again
    again = build(target, tmp_path / "again", "bigram", block_size=4)
    monkeypatch.setattr("dspark_hf.core.costs.measure_costs", lambda drafter: TABLES["flat"])
    assert profile_costs(again) == drafter.cost_table
    assert profile_costs(again, refresh=True) == TABLES["flat"] == again.cost_table
    # another thread count is another table, and so is another dtype
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert cost_table_path(again) != path
    finally:
        torch.set_num_threads(threads)
    assert cost_table_path(again) == path
    assert cost_table_path(again.to(torch.bfloat16)) != path


@pytest.mark.parametrize("table, chosen", [("flat", "threshold"), ("graded", "cost")])
def test_auto_picks_the_cost_scheduler_where_verifying_a_block_is_dear(table, chosen, tmp_path, monkeypatch):
    monkeypatch.setattr("dspark_hf.core.scheduling.DEFAULT_SCHEDULER", "auto")  # the package default
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram", block_size=5)
    assert drafter.generation_config.dspark_scheduler == "auto"
    drafter.cost_table = TABLES[table]  # graded: T_verify(6) = 2.0 s against 1.0 s for one token
    target.generate(prompts(1)[0], max_new_tokens=12, do_sample=False, assistant_model=drafter)
    assert drafter.last_scheduler == chosen


def test_first_profile_is_announced(tmp_path, monkeypatch, capsys, quiet_machine):
    monkeypatch.setenv("DSPARK_HF_CACHE", str(tmp_path / "cache"))
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram", block_size=4)
    profile_costs(drafter)
    assert "profiling verify and draft costs" in capsys.readouterr().err
    profile_costs(drafter)
    assert capsys.readouterr().err == ""  # cached: said once


def test_a_table_timed_beside_another_job_serves_this_process_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DSPARK_HF_CACHE", str(tmp_path / "cache"))
    target = tiny_target("llama")
    drafter = build(target, tmp_path, "bigram", block_size=4)
    path, others = cost_table_path(drafter), {"busy": 1.0}
    monkeypatch.setattr(costs, "OtherProcesses", lambda: types.SimpleNamespace(busy_cores=lambda: others["busy"]))
    monkeypatch.setattr(costs, "measure_costs", lambda drafter: TABLES["graded"])
    assert profile_costs(drafter) == TABLES["graded"] == drafter.cost_table  # this process uses it
    assert not path.exists()
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 2 and "other processes kept 1.0 cores busy meanwhile" in said[1]
    others["busy"] = 0.2  # the next process, on a quiet machine, measures again and keeps that table
    monkeypatch.setattr(costs, "measure_costs", lambda drafter: TABLES["flat"])
    assert profile_costs(drafter) == TABLES["flat"]
    assert json.loads(path.read_text())["other_busy_cores"] == 0.2 and "busy" not in capsys.readouterr().err
    assert profile_costs(drafter) == TABLES["flat"]  # read from disk


def test_other_processes_counts_a_spinning_process_and_not_this_one():
    """What keeps a busy-machine table off the disk, on the real /proc/stat: this process's own work is not
    counted, another process's is."""
    if busy_cores(0.3) > 0.3 or len(OtherProcesses().cpus) < 2:
        pytest.skip("needs two idle cores: one for this process, one for the spinner")
    own = OtherProcesses()
    spun = time.perf_counter() + 0.5
    while time.perf_counter() < spun:
        pass
    busy_own = own.busy_cores()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        beside = OtherProcesses()
        time.sleep(0.5)
        busy_beside = beside.busy_cores()
    finally:
        spinner.kill()
        spinner.wait()
    assert busy_own < 0.4 < 0.6 < busy_beside < 1.4


def test_a_confidence_exactly_on_the_threshold_is_verified():
    """The cut is before the first c_k *below* the threshold: c_k == threshold keeps x_k."""
    assert threshold_length([0.9, 0.5, 0.3], 0.5, num_drafted=3, cap=3) == 2
    assert threshold_length([0.5, 0.5], 0.5, num_drafted=2, cap=2) == 2
    assert threshold_length([0.49999, 0.9], 0.5, num_drafted=2, cap=2) == 0
