"""Sequential Temperature Scaling (STS) of draft confidences: applying the temperatures, and their file.

A drafter's raw confidences c_k are over-confident, and the cost-aware scheduler
multiplies them into prefix survival chances a_k = prod_{i<=k} c_i, so errors
compound along the block. STS gives every position its own temperature,
c'_k = sigmoid(logit(c_k) / T_k). `dspark calibrate` fits them (see
`dspark_hf.tools.sts`) and writes `dspark_calibration.json` next to the drafter,
where `from_pretrained` finds it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional, Sequence

import torch

from .config import CheckpointError

CALIBRATION_FILE = "dspark_calibration.json"
DEFAULT_BINS = 10  # equal-width bins of the ECE the file reports


def apply_temperatures(confidences: torch.Tensor, temperatures: Sequence[float]) -> torch.Tensor:
    """c'_k = sigmoid(logit(c_k) / T_k) along the last axis; positions past the list keep c_k."""
    count = min(confidences.shape[-1], len(temperatures))
    # A tensor already on the confidences' device and dtype is used as it is: no copy from the host per round.
    scale = torch.as_tensor(temperatures[:count], dtype=confidences.dtype, device=confidences.device)
    calibrated = confidences.clone()
    calibrated[..., :count] = torch.sigmoid(torch.logit(confidences[..., :count]) / scale)
    return calibrated


@dataclasses.dataclass
class Calibration:
    """Per-position STS temperatures and the held-out evidence they were fitted on."""

    temperatures: list[float]  # all generation needs; the rest is the report
    decisions: list[str] = dataclasses.field(default_factory=list)  # per position: fitted, edge, no held-out gain
    ece_before: list[Optional[float]] = dataclasses.field(default_factory=list)  # raw prod_{i<=k} c_i
    ece_after: list[Optional[float]] = dataclasses.field(default_factory=list)  # calibrated prod_{i<=k} c'_i
    auc_before: list[Optional[float]] = dataclasses.field(default_factory=list)
    auc: list[Optional[float]] = dataclasses.field(default_factory=list)  # of the calibrated product the scheduler uses
    rounds_per_position: list[int] = dataclasses.field(default_factory=list)  # rounds that verified position k
    survival_rate: list[Optional[float]] = dataclasses.field(default_factory=list)  # share whose first k survived
    num_rounds: int = 0
    num_bins: int = DEFAULT_BINS
    source: dict = dataclasses.field(default_factory=dict)

    def apply(self, confidences: torch.Tensor) -> torch.Tensor:
        return apply_temperatures(confidences, self.temperatures)

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2))


def load_calibration(directory: Path, num_positions: int) -> Optional[Calibration]:
    """The drafter directory's calibration file, or None when it has none."""
    path = Path(directory) / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        fields = {field.name for field in dataclasses.fields(Calibration)}
        calibration = Calibration(**{key: value for key, value in raw.items() if key in fields})
        temperatures = [float(t) for t in calibration.temperatures]
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: not a valid calibration file ({err}).") from None
    if len(temperatures) != num_positions or min(temperatures) <= 0:
        raise CheckpointError(
            f"{path}: field 'temperatures' must hold {num_positions} positive values (one per draft position); "
            f"got {temperatures}. Run `dspark calibrate` again for this drafter."
        )
    calibration.temperatures = temperatures
    return calibration
