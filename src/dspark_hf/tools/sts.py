"""Fitting STS temperatures, and the numbers that judge them: ECE, AUC and reliability curves.

STS gives every draft position its own temperature, c'_k = sigmoid(logit(c_k) / T_k), fitted
left to right: T_k is the grid value whose cumulative product prod_{i<=k} c'_i (earlier
positions already calibrated) has the lowest ECE against the observed prefix survival. A
positive temperature keeps the order of confidences at each position.

The fit runs on rounds of greedy generation that verify the whole block, so every position
up to the verified length has an observed outcome (`dspark calibrate` collects them). A
temperature is kept only where it earns its place: a fit that lands on the edge of the grid
is rejected (the ECE there keeps falling as the confidences flatten towards 0.5, which says
the position carries little signal, not that it is calibrated), and so is one that does not
lower the ECE, or that lowers the AUC, on held-out rounds; such positions keep T = 1.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..core.calibration import DEFAULT_BINS, Calibration, apply_temperatures

# Temperatures 0.1 .. 10 in steps of 10^0.01 (about 2.3%); index 100 is exactly 1.
TEMPERATURE_GRID = 10 ** (torch.arange(-100, 101, dtype=torch.float64) / 100)
AUC_TOLERANCE = 0.005  # a held-out AUC drop beyond this rejects a temperature


def _bin_sums(predicted: torch.Tensor, outcomes: torch.Tensor, num_bins: int):
    """Per equal-width bin of `predicted`: count, sum of predictions, sum of outcomes."""
    predicted = predicted.double()
    bins = (predicted * num_bins).long().clamp(0, num_bins - 1)
    count = torch.bincount(bins, minlength=num_bins)
    predicted_sum = torch.bincount(bins, weights=predicted, minlength=num_bins)
    outcome_sum = torch.bincount(bins, weights=outcomes.double(), minlength=num_bins)
    return count, predicted_sum, outcome_sum


def expected_calibration_error(predicted: torch.Tensor, outcomes: torch.Tensor, num_bins: int = DEFAULT_BINS) -> float:
    """sum_b (n_b / N) |mean prediction - outcome rate| over equal-width bins of [0, 1]."""
    _, predicted_sum, outcome_sum = _bin_sums(predicted, outcomes, num_bins)
    return float((predicted_sum - outcome_sum).abs().sum() / len(predicted))


def reliability_curve(predicted: torch.Tensor, outcomes: torch.Tensor, num_bins: int = DEFAULT_BINS):
    """(mean prediction, outcome rate, count) of the non-empty bins: the points of a reliability diagram."""
    count, predicted_sum, outcome_sum = _bin_sums(predicted, outcomes, num_bins)
    filled = count > 0
    return predicted_sum[filled] / count[filled], outcome_sum[filled] / count[filled], count[filled]


def rank_auc(scores: torch.Tensor, outcomes: torch.Tensor) -> Optional[float]:
    """ROC AUC as the Mann-Whitney statistic (ties share their average rank); None with one class only."""
    positives = outcomes.bool()
    num_positive = int(positives.sum())
    num_negative = len(outcomes) - num_positive
    if num_positive == 0 or num_negative == 0:
        return None
    _, group, group_size = torch.unique(scores.double(), return_inverse=True, return_counts=True)
    last_rank = group_size.cumsum(0).double()
    ranks = (last_rank - (group_size - 1) / 2.0)[group]
    return float((ranks[positives].sum() - num_positive * (num_positive + 1) / 2) / (num_positive * num_negative))


@dataclasses.dataclass
class RoundOutcomes:
    """Per round and draft position: the raw confidence, whether it was verified, whether its prefix survived."""

    confidences: torch.Tensor  # [rounds, positions] raw c_k
    observed: torch.Tensor  # [rounds, positions] bool: position k was sent to the target
    survived: torch.Tensor  # [rounds, positions] bool: positions 1..k were all accepted

    @classmethod
    def from_trace(cls, records, num_positions: int) -> "RoundOutcomes":
        """Rounds that drafted a full block with confidences; position k is observed when k <= num_verified."""
        usable = [r for r in records if len(r.confidences) == num_positions]
        positions = torch.arange(1, num_positions + 1)
        verified = torch.tensor([r.num_verified for r in usable], dtype=torch.long)[:, None]
        accepted = torch.tensor([r.num_accepted for r in usable], dtype=torch.long)[:, None]
        return cls(
            confidences=torch.tensor([r.confidences for r in usable], dtype=torch.float64).reshape(-1, num_positions),
            observed=positions <= verified,
            survived=positions <= accepted,
        )

    @property
    def num_rounds(self) -> int:
        return self.confidences.shape[0]

    def position(self, survival: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Predicted prefix survival and the outcome at 0-based position k, on the rounds that observed it."""
        rows = self.observed[:, k]
        return survival[rows, k], self.survived[rows, k]


def prefix_survival(confidences: torch.Tensor) -> torch.Tensor:
    """a_k = prod_{i<=k} c_i: the chance that the first k draft tokens are all accepted."""
    return torch.cumprod(confidences, dim=-1)


def _position_error(outcomes: RoundOutcomes, prefix: torch.Tensor, k: int, temperature: float, num_bins: int):
    """(ECE, AUC) at 0-based position k of prod_{i<=k} c'_i, with earlier positions' product `prefix`."""
    rows = outcomes.observed[:, k]
    predicted = prefix[rows] * torch.sigmoid(torch.logit(outcomes.confidences[rows, k]) / temperature)
    survived = outcomes.survived[rows, k]
    return expected_calibration_error(predicted, survived, num_bins), rank_auc(predicted, survived)


def fit_temperatures(
    outcomes: RoundOutcomes,
    held_out: Optional[RoundOutcomes] = None,
    grid: torch.Tensor = TEMPERATURE_GRID,
    num_bins: int = DEFAULT_BINS,
) -> tuple[list[float], list[str]]:
    """STS: for k = 1, 2, ... pick T_k minimising the ECE of prod_{i<=k} c'_i, earlier T_i fixed.

    Returns the temperatures and, per position, why it has its value: "fitted", "edge"
    (the best value was the grid's end: rejected), "no held-out gain" (rejected), or
    "unobserved". Rejected positions keep T = 1.
    """
    temperatures, decisions = [], []
    fit_prefix = torch.ones(outcomes.num_rounds, dtype=torch.float64)
    check_prefix = None if held_out is None else torch.ones(held_out.num_rounds, dtype=torch.float64)
    for k in range(outcomes.confidences.shape[1]):
        temperature, decision = 1.0, "unobserved"
        if outcomes.observed[:, k].any():
            errors = [_position_error(outcomes, fit_prefix, k, t, num_bins)[0] for t in grid.tolist()]
            best = min(range(len(errors)), key=errors.__getitem__)
            temperature, decision = float(grid[best]), "fitted"
            if best in (0, len(grid) - 1):
                temperature, decision = 1.0, "edge"
            elif held_out is not None and held_out.observed[:, k].any():
                ece, auc = _position_error(held_out, check_prefix, k, temperature, num_bins)
                raw_ece, raw_auc = _position_error(held_out, check_prefix, k, 1.0, num_bins)
                worse_auc = auc is not None and raw_auc is not None and auc < raw_auc - AUC_TOLERANCE
                if ece >= raw_ece or worse_auc:
                    temperature, decision = 1.0, "no held-out gain"
        temperatures.append(temperature)
        decisions.append(decision)
        fit_prefix = fit_prefix * torch.sigmoid(torch.logit(outcomes.confidences[:, k]) / temperature)
        if held_out is not None:
            check_prefix = check_prefix * torch.sigmoid(torch.logit(held_out.confidences[:, k]) / temperature)
    return temperatures, decisions


def calibrate(
    outcomes: RoundOutcomes,
    held_out: Optional[RoundOutcomes] = None,
    num_bins: int = DEFAULT_BINS,
    source: Optional[dict] = None,
) -> Calibration:
    """Fit STS on `outcomes`, check each position on `held_out`, and report ECE and AUC per position
    before and after on the held-out rounds (on `outcomes` when there are none)."""
    temperatures, decisions = fit_temperatures(outcomes, held_out, num_bins=num_bins)
    outcomes = held_out if held_out is not None else outcomes
    before = prefix_survival(outcomes.confidences)
    after = prefix_survival(apply_temperatures(outcomes.confidences, temperatures))
    report: dict[str, list] = {key: [] for key in ("ece_before", "ece_after", "auc_before", "auc", "survival_rate")}
    counts = []
    for k in range(len(temperatures)):
        raw, survived = outcomes.position(before, k)
        calibrated, _ = outcomes.position(after, k)
        counts.append(len(survived))
        seen = len(survived) > 0
        report["ece_before"].append(expected_calibration_error(raw, survived, num_bins) if seen else None)
        report["ece_after"].append(expected_calibration_error(calibrated, survived, num_bins) if seen else None)
        report["auc_before"].append(rank_auc(raw, survived))
        report["auc"].append(rank_auc(calibrated, survived))
        report["survival_rate"].append(float(survived.double().mean()) if seen else None)
    return Calibration(
        temperatures=temperatures,
        decisions=decisions,
        rounds_per_position=counts,
        num_rounds=outcomes.num_rounds,
        num_bins=num_bins,
        source=source or {},
        **report,
    )
