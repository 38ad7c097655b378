"""scripts/gpu_drafter.sh at toy size on the CPU: every stage runs and the drafter comes back in loadable shards;
and the target reaches a machine without a package index as the GGUF scripts/gpu_pack.sh carries there."""

import gzip
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from dspark_hf import DSparkDrafter
from dspark_hf.tools import targets
from dspark_hf.tools.targets import load_target
from dspark_hf.tools.training.data import load_sequences

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "src" / "dspark_hf" / "assets" / "smollm2_dspark"


@pytest.mark.slow
@pytest.mark.parametrize("init", ["", str(SHIPPED)], ids=["fresh", "continued"])
def test_gpu_drafter_script_runs_at_toy_size(tmp_path, init):
    """Fresh: the run's own answers only. Continued: the shipped drafter, and data carried from here (.gpu/data as
    scripts/gpu_pack.sh packs it): three earlier answers to train on too, and two prompts not to write again."""
    out, data = tmp_path / "out", tmp_path / "data"
    earlier = load_sequences(ROOT / "data" / "smollm2" / "magpie" / "shard-00000.jsonl.gz")[:3]
    data.mkdir()
    with gzip.open(data / "train.jsonl.gz", "wt") as sink:
        sink.writelines(json.dumps(record) + "\n" for record in earlier)
    with gzip.open(data / "prompts.jsonl.gz", "wt") as sink:
        sink.writelines(json.dumps({"turns": [text]}) + "\n" for text in ("What is 2 + 2?", "Write hello world."))
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(pathlib.Path.home()), "INIT": init,
           "DATA": str(data) if init else ""}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_drafter.sh"), str(out), "--toy"],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]

    stages = [json.loads(line)["stage"] for line in (out / "stages.jsonl").read_text().splitlines()]
    assert stages == ["synthesize", "regenerate", "train", "done"]
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 4 and len(load_sequences(out / "answers")) == 4
    assert json.loads((out / "synthesize.json").read_text())["excluded"] == (2 if init else 0)
    assert json.loads((out / "train.json").read_text().splitlines()[-1])["sequences"] == (7 if init else 4)
    assert all(path.stat().st_size <= 16 * 10**6 for path in (out / "drafter").glob("*.safetensors"))
    target, _ = load_target("smollm2", tokenizer=False)
    drafter = DSparkDrafter.from_pretrained(out / "drafter", target)
    assert drafter.config.block_size == 7
    if init:  # continued: the shipped drafter's draft vocabulary is kept, its weights moved on
        shipped = DSparkDrafter.from_pretrained(init, target)
        assert torch.equal(drafter.draft_token_ids(), shipped.draft_token_ids())
        assert any(not torch.equal(a, b) for a, b in zip(drafter.parameters(), shipped.parameters()))


def test_a_carried_gguf_is_converted_without_reaching_an_index(tmp_path, monkeypatch):
    def no_index(directory):
        raise AssertionError("reached for the package index")

    converted = []

    def convert(gguf_path, out_dir):
        converted.append(gguf_path)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(targets, "_download_gguf", no_index)
    monkeypatch.setattr(targets, "_convert_gguf", convert)
    carried = tmp_path / "smollm2.gguf"
    carried.write_bytes(b"GGUF")
    model_dir = targets.ensure_smollm2(tmp_path / "cache", gguf=carried)
    assert converted == [carried] and model_dir == tmp_path / "cache" / targets.SMOLLM2_DIRNAME
    assert targets.ensure_smollm2(tmp_path / "cache", gguf=carried) == model_dir and len(converted) == 1
