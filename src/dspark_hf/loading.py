"""Finding, checking and reading draft checkpoints; writing them back in DeepSpec layout.

Every rejection names the file, the field and both values, because the usual
mistake is a drafter made for a different target.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .calibration import CALIBRATION_FILE, load_calibration
from .config import CheckpointError, DSparkConfig

SHARED_KEYS = ("embed_tokens.weight", "lm_head.weight")
CHECKPOINT_PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json", CALIBRATION_FILE]


def resolve_checkpoint(name_or_path, *, revision=None, token=None, cache_dir=None, local_files_only=False) -> Path:
    """A local directory as is; otherwise a Hub repo id, fetched through huggingface_hub's cache."""
    if os.path.isdir(name_or_path):
        return Path(name_or_path)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(
            snapshot_download(
                repo_id=str(name_or_path),
                revision=revision,
                token=token,
                cache_dir=cache_dir,
                local_files_only=local_files_only,
                allow_patterns=CHECKPOINT_PATTERNS,
            )
        )
    except HFValidationError:
        raise CheckpointError(
            f"{name_or_path!r} is neither an existing local directory nor a valid Hub repo id (like 'org/name')."
        ) from None
    except Exception as err:  # network, auth, missing repo: all end the same way for the user
        raise CheckpointError(
            f"Could not fetch draft checkpoint {name_or_path!r} from the Hugging Face Hub ({type(err).__name__}: {err}). "
            "If this machine is offline, download it elsewhere and pass the local directory, or make sure it is "
            "already in the huggingface_hub cache (cache_dir / HF_HOME) and pass local_files_only=True."
        ) from err


def validate_against_target(config: DSparkConfig, target, source: str) -> None:
    """Reject a drafter whose shapes or layer ids cannot fit this target."""
    text = target.config.get_text_config()
    embedding = target.get_input_embeddings().weight
    checks = [
        ("hidden_size", config.hidden_size, text.hidden_size),
        ("vocab_size", config.vocab_size, embedding.shape[0]),
        ("num_target_layers", config.num_target_layers, text.num_hidden_layers),
    ]
    for field, mine, theirs in checks:
        if mine != theirs:
            raise CheckpointError(
                f"{source}: field '{field}' is {mine} but the target ({type(target).__name__}) has {theirs}; "
                "this drafter was made for a different target model."
            )
    depth = text.num_hidden_layers
    for layer_id in config.target_layer_ids:
        if layer_id == depth - 1:
            raise CheckpointError(
                f"{source}: field 'target_layer_ids' names layer {layer_id}, the target's final layer; its hidden "
                "state in transformers is taken after the final norm, so it cannot be used. Expected ids in "
                f"[-1, {depth - 2}]."
            )
        if not -1 <= layer_id <= depth - 2:
            raise CheckpointError(
                f"{source}: field 'target_layer_ids' contains {layer_id}, out of range for a target with {depth} "
                f"layers; expected ids in [-1, {depth - 2}] (-1 is the embedding output)."
            )
    if not 0 <= config.mask_token_id < config.vocab_size:
        raise CheckpointError(
            f"{source}: field 'mask_token_id' is {config.mask_token_id}; expected a token id in [0, {config.vocab_size})."
        )


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as err:
            raise CheckpointError(f"{index}: not a valid safetensors index ({err}).") from None
        return [directory / shard for shard in shards]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no model.safetensors (or sharded *.safetensors) in the checkpoint.")
    return files


def _open(path: Path):
    if not path.is_file():
        raise CheckpointError(f"{path}: weight file is missing.")
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file, it may be truncated or corrupt ({err}).") from None


def _check_shared_copy(handle, key: str, path: Path, shared: torch.Tensor) -> None:
    """Compare a few rows of a stored embedding/LM-head copy with the target's, without loading the V x d tensor."""
    vocab = shared.shape[0]
    stored = handle.get_slice(key)
    if list(stored.get_shape()) != list(shared.shape):
        raise CheckpointError(
            f"{path}: '{key}' has shape {stored.get_shape()} but the target's has {list(shared.shape)}; "
            "this drafter was made for a different target model."
        )
    for row in sorted({0, vocab // 3, (2 * vocab) // 3, vocab - 1}):
        theirs = shared[row].detach().float().cpu()
        mine = stored[row : row + 1][0].float()
        if not torch.allclose(mine, theirs, rtol=2e-2, atol=2e-2 * float(theirs.abs().max()) + 1e-6):
            raise CheckpointError(
                f"{path}: '{key}' row {row} differs from the target's; this drafter was trained for a different "
                "target. Pass check_shared_weights=False to load it anyway."
            )


def read_state_dict(directory: Path, expected: dict[str, torch.Size], target, check_shared_weights: bool) -> dict:
    """Read exactly the drafter's own tensors; skip (and optionally check) the embedding/LM-head copies."""
    shared = {
        "embed_tokens.weight": target.get_input_embeddings().weight,
        "lm_head.weight": target.get_output_embeddings().weight,
    }
    state, origin = {}, {}
    for path in _weight_files(directory):
        with _open(path) as handle:
            for key in handle.keys():
                if key in SHARED_KEYS:
                    if check_shared_weights:
                        _check_shared_copy(handle, key, path, shared[key])
                    continue
                try:
                    state[key] = handle.get_tensor(key)
                except (SafetensorError, OSError, ValueError) as err:
                    raise CheckpointError(f"{path}: tensor '{key}' cannot be read ({err}).") from None
                origin[key] = path
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        where = ", ".join(sorted({str(p) for p in origin.values()})) or str(directory)
        raise CheckpointError(
            f"{where}: weights do not match the configuration. Missing: {missing or 'none'}. "
            f"Unexpected: {unexpected or 'none'}."
        )
    for key, tensor in state.items():
        if tensor.shape != expected[key]:
            raise CheckpointError(
                f"{origin[key]}: '{key}' has shape {list(tensor.shape)}; the configuration expects {list(expected[key])}."
            )
    return state


def placement(target) -> torch.device:
    """The LM head's device: the drafter's logits go through it every round, and target features
    from other devices of a `device_map` spread are moved here as they arrive."""
    return target.get_output_embeddings().weight.device


def load_drafter(
    cls,
    name_or_path,
    target,
    *,
    revision: Optional[str] = None,
    token=None,
    cache_dir=None,
    local_files_only: bool = False,
    dtype: Optional[torch.dtype] = None,
    check_shared_weights: bool = True,
):
    directory = resolve_checkpoint(
        name_or_path, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only
    )
    config = DSparkConfig.from_json_file(directory / "config.json")
    validate_against_target(config, target, str(directory / "config.json"))
    drafter = cls(config, target)
    expected = {key: value.shape for key, value in drafter.state_dict().items()}
    drafter.load_state_dict(read_state_dict(directory, expected, target, check_shared_weights))
    dtype = dtype or target.get_input_embeddings().weight.dtype
    drafter.to(device=placement(target), dtype=dtype).eval()
    drafter.name_or_path = str(name_or_path)
    drafter.calibration = load_calibration(directory, config.num_draft_tokens)  # STS temperatures, if calibrated
    return drafter


def save_drafter(drafter, save_directory, *, include_shared_weights: bool = False, dtype=None) -> None:
    """DeepSpec layout: config.json (target config + drafter fields) and model.safetensors without prefixes."""
    directory = Path(save_directory)
    directory.mkdir(parents=True, exist_ok=True)
    target_config = drafter.target.config.get_text_config().to_dict()
    (directory / "config.json").write_text(json.dumps(drafter.config.to_deepspec_dict(target_config), indent=2))
    dtype = dtype or drafter.dtype
    tensors = {key: value.detach().to("cpu", dtype).contiguous() for key, value in drafter.state_dict().items()}
    if include_shared_weights:
        tensors["embed_tokens.weight"] = drafter.embed_tokens.weight.detach().to("cpu", dtype).clone()
        tensors["lm_head.weight"] = drafter.lm_head.weight.detach().to("cpu", dtype).clone()
    temporary = directory / "model.safetensors.tmp"
    save_file(tensors, str(temporary), metadata={"format": "pt"})
    os.replace(temporary, directory / "model.safetensors")
