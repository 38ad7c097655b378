"""STS calibration: the metrics, the fit on synthetic rounds, the file, and the `calibrate` command."""

from __future__ import annotations

import argparse
import itertools
import json

import pytest
import torch

from conftest import tiny_target, write_bigram_deepspec
from dspark_hf import CheckpointError, DSparkDrafter, RoundRecord
from dspark_hf.core.calibration import CALIBRATION_FILE, Calibration, apply_temperatures
from dspark_hf.tools import sts
from dspark_hf.tools import calibrate as calibrate_command
from test_generation import prompts


# ---------------------------------------------------------------- metrics
def test_ece_by_hand():
    predicted = torch.tensor([0.05, 0.15, 0.95, 0.95])
    outcomes = torch.tensor([0, 0, 1, 0])
    # bins [0, .1), [.1, .2), [.9, 1]: |.05 - 0| + |.15 - 0| + |1.9 - 1|, over 4 predictions
    assert sts.expected_calibration_error(predicted, outcomes, num_bins=10) == pytest.approx(1.1 / 4)
    assert sts.expected_calibration_error(torch.tensor([1.0, 0.0]), torch.tensor([1, 0])) == 0.0


def test_auc_is_the_rank_statistic():
    assert sts.rank_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.75)
    assert sts.rank_auc(torch.tensor([0.5, 0.5]), torch.tensor([0, 1])) == pytest.approx(0.5)  # a tie is half
    assert sts.rank_auc(torch.tensor([0.2, 0.9]), torch.tensor([1, 1])) is None
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 6, (60,), generator=generator).float()  # many ties
    outcomes = torch.rand(60, generator=generator) < 0.4
    pairs = [
        1.0 if p > n else 0.5 if p == n else 0.0
        for p, n in itertools.product(scores[outcomes].tolist(), scores[~outcomes].tolist())
    ]
    assert sts.rank_auc(scores, outcomes) == pytest.approx(sum(pairs) / len(pairs))


def test_temperatures_keep_the_order_within_a_position():
    c = torch.tensor([[0.2, 0.9, 0.5], [0.7, 0.3, 0.99]])
    torch.testing.assert_close(apply_temperatures(c, [1.0, 1.0, 1.0]), c)
    scaled = apply_temperatures(c, [2.0, 0.5])  # the third position has no temperature: unchanged
    assert scaled[0, 0] == pytest.approx(torch.sigmoid(torch.logit(torch.tensor(0.2)) / 2).item())
    assert torch.equal(scaled[:, 2], c[:, 2])
    assert torch.equal(scaled.argsort(dim=0), c.argsort(dim=0))
    assert apply_temperatures(torch.tensor([0.0, 1.0]), [3.0, 3.0]).tolist() == [0.0, 1.0]


# ---------------------------------------------------------- synthetic fit
def overconfident_rounds(rounds: int, positions: int, sharpness: float, seed: int = 0) -> sts.RoundOutcomes:
    """Rounds whose true per-position acceptance chance is p, reported as sigmoid(sharpness * logit(p)).

    Acceptance stops at the first rejection, and some rounds verify fewer positions,
    as a length budget would make them.
    """
    generator = torch.Generator().manual_seed(seed)
    true_logits = 1.2 + 1.3 * torch.randn(rounds, positions, generator=generator, dtype=torch.float64)
    accepted = torch.rand(rounds, positions, generator=generator, dtype=torch.float64) < torch.sigmoid(true_logits)
    verified = torch.randint(1, positions + 1, (rounds, 1), generator=generator)
    verified[: rounds // 2] = positions
    index = torch.arange(1, positions + 1)
    return sts.RoundOutcomes(
        confidences=torch.sigmoid(sharpness * true_logits),
        observed=index <= verified,
        survived=torch.cumprod(accepted.long(), dim=1).bool(),
    )


def test_sts_repairs_an_overconfident_predictor():
    outcomes = overconfident_rounds(rounds=30000, positions=5, sharpness=2.5)
    calibration = sts.calibrate(outcomes)
    assert all(ece > 0.04 for ece in calibration.ece_before)
    assert all(ece < 0.02 for ece in calibration.ece_after)
    assert all(2.0 < t < 3.1 for t in calibration.temperatures)  # the sharpening undone
    # position 1 alone: a monotone map leaves the ranking, hence the AUC, as it was
    assert calibration.auc[0] == pytest.approx(calibration.auc_before[0])
    assert calibration.rounds_per_position[0] == 30000 > calibration.rounds_per_position[-1]


def test_a_calibrated_predictor_keeps_temperatures_near_one():
    calibration = sts.calibrate(overconfident_rounds(rounds=30000, positions=3, sharpness=1.0, seed=1))
    assert all(0.85 < t < 1.15 for t in calibration.temperatures)
    assert all(ece < 0.02 for ece in calibration.ece_after)


def test_outcomes_from_trace():
    def record(confidences, verified, accepted):
        return RoundRecord(
            position=0, source="dspark" if confidences else "none", draft_ids=[1] * len(confidences),
            confidences=confidences, calibrated=confidences, budget=3, num_verified=verified, cut="whole",
            num_accepted=accepted, committed_ids=[1], draft_seconds=0.0, verify_seconds=0.0,
        )

    outcomes = sts.RoundOutcomes.from_trace(
        [record([0.9, 0.8, 0.7], 3, 1), record([0.6, 0.5, 0.4], 2, 2), record([], 0, 0)], num_positions=3
    )
    assert outcomes.num_rounds == 2  # a round that drafted nothing is no observation
    assert outcomes.observed.tolist() == [[True, True, True], [True, True, False]]
    assert outcomes.survived.tolist() == [[True, False, False], [True, True, False]]
    predicted, survived = outcomes.position(sts.prefix_survival(outcomes.confidences), 1)
    assert predicted.tolist() == pytest.approx([0.72, 0.3]) and survived.tolist() == [False, True]


# ------------------------------------------------------ file and loading
def test_calibration_file_is_loaded_and_used_by_the_scheduler(tmp_path):
    target = tiny_target("qwen3")
    path = write_bigram_deepspec(target, tmp_path / "d", block_size=5)
    assert DSparkDrafter.from_pretrained(path, target).calibration is None
    Calibration([50.0] * 5).save(path / CALIBRATION_FILE)  # every calibrated confidence is about 0.5
    drafter = DSparkDrafter.from_pretrained(path, target)
    assert drafter.calibration.temperatures == [50.0] * 5
    target.generate(prompts(1)[0], max_new_tokens=20, do_sample=False, assistant_model=drafter,
                    assistant_confidence_threshold=0.55)
    # the threshold reads calibrated confidences; the trace keeps the raw ones
    assert all(r.num_verified == 0 for r in drafter.last_trace)
    assert max(r.confidences[0] for r in drafter.last_trace if r.confidences) > 0.55


@pytest.mark.parametrize("temperatures", [None, [1.0, 2.0], [1.0, 1.0, 1.0, 1.0, -1.0]])
def test_a_bad_calibration_file_is_refused(temperatures, tmp_path):
    target = tiny_target("qwen3")
    path = write_bigram_deepspec(target, tmp_path / "d", block_size=5)
    if temperatures is None:
        (path / CALIBRATION_FILE).write_text("{not json")
    else:
        Calibration(temperatures).save(path / CALIBRATION_FILE)
    with pytest.raises(CheckpointError, match=CALIBRATION_FILE):
        DSparkDrafter.from_pretrained(path, target)


# ---------------------------------------------------------- the command
class CharacterTokenizer:
    """Enough of a tokenizer for `render_prompt`: no chat template, one id per character."""

    chat_template = None

    def __call__(self, text):
        return {"input_ids": [ord(ch) % 20 for ch in text[:12]]}


def test_calibrate_command_writes_json_table_and_diagram(tmp_path, monkeypatch, capsys, quiet_machine):
    monkeypatch.setenv("DSPARK_HF_CACHE", str(tmp_path / "cache"))
    target = tiny_target("qwen3")
    path = write_bigram_deepspec(target, tmp_path / "d", block_size=5)
    drafter = DSparkDrafter.from_pretrained(path, target)
    drafter.generation_config.dspark_scheduler = "cost"  # the command must still verify whole blocks
    monkeypatch.setattr(calibrate_command, "load_pair_from_args", lambda *args: (target, CharacterTokenizer(), drafter))
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"turns": [f"question {i}: why?"]}) + "\n" for i in range(6)))

    parser = argparse.ArgumentParser()
    calibrate_command.add_arguments(parser)
    args = parser.parse_args(
        ["--drafter", str(path), "--prompts", str(prompt_file), "--skip", "1", "--limit", "4", "--max-new-tokens", "30",
         "--profile-costs"]
    )
    args.func(args)

    result = json.loads((path / CALIBRATION_FILE).read_text())
    assert len(result["temperatures"]) == 5 and result["num_rounds"] > 10
    assert result["rounds_per_position"][0] == result["num_rounds"]  # whole blocks verified
    assert result["source"]["num_prompts"] == 4
    table = (path / calibrate_command.REPORT_FILE).read_text()
    assert table.count("\n| ") == 2 + 5 and "ECE before" in capsys.readouterr().out  # header, rule, positions
    assert (path / calibrate_command.DIAGRAM_FILE).stat().st_size > 1000
    assert list((tmp_path / "cache" / "cost_tables").glob("*.json"))
    assert DSparkDrafter.from_pretrained(path, target).calibration.temperatures == result["temperatures"]


def test_fits_on_the_grid_edge_or_without_held_out_gain_are_rejected():
    outcomes = overconfident_rounds(rounds=20000, positions=3, sharpness=2.5, seed=2)
    # position 2 carries no signal: its confidence is noise, so flattening it keeps lowering the ECE
    noise = torch.rand(outcomes.num_rounds, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    outcomes.confidences[:, 1] = 0.05 + 0.9 * noise
    held_out = overconfident_rounds(rounds=20000, positions=3, sharpness=1.0, seed=3)  # already calibrated
    held_out.confidences[:, 1] = outcomes.confidences[:, 1]
    temperatures, decisions = sts.fit_temperatures(outcomes)
    assert decisions[1] == "edge" and temperatures[1] == 1.0
    # the fit undoes a 2.5x sharpening that the held-out rounds do not have: no gain there, so T stays 1
    calibration = sts.calibrate(outcomes, held_out)
    assert calibration.decisions[0] == "no held-out gain" and calibration.temperatures[0] == 1.0
    assert all(after <= before + 1e-12 for before, after in zip(calibration.ece_before, calibration.ece_after))
    # the same rounds checked on rounds like them: the temperature is kept
    kept = sts.calibrate(outcomes, overconfident_rounds(rounds=20000, positions=3, sharpness=2.5, seed=4))
    assert kept.decisions[0] == "fitted" and 2.0 < kept.temperatures[0] < 3.1
