"""`DSparkDrafter`: the core drafter plus loading and saving in every published layout.

The layout modules translate config fields and tensor names; this module does the
rest once for all of them: finding the checkpoint (a local directory, or a Hub repo
id through huggingface_hub's cache), checking it against the target, sharing the
target's embedding and LM head instead of loading copies, and naming the file, the
field and the values in every error, because the usual mistake is a drafter made
for a different target.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Optional

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..core.calibration import CALIBRATION_FILE, load_calibration
from ..core.config import CheckpointError, DSparkConfig
from ..core.generation import attach_to_target
from ..core.modeling import DraftModel
from . import deepspec, specforge, speculators, zlab

LAYOUTS = (speculators, specforge, deepspec, zlab)  # tried in this order; each recognises its own config.json
LAYOUT_NAMES = {layout.NAME: layout for layout in LAYOUTS}
WRITABLE = [layout.NAME for layout in LAYOUTS if hasattr(layout, "config_dict")]
SHARED_KEYS = ("embed_tokens.weight", "lm_head.weight")
VOCAB_MASK_KEY = "t2d"  # speculators' bool mask of the draft vocabulary, implied by d2t
CHECKPOINT_PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json", CALIBRATION_FILE]


# ------------------------------------------------------------------ finding
def looks_like_path(name_or_path) -> bool:
    """Names a local path rather than a Hub repo id: './x', '/x', '~/x', 'a/b/c', or 'dir/x' with 'dir' present."""
    text = str(name_or_path)
    parent = os.path.dirname(text)
    return (
        isinstance(name_or_path, os.PathLike)
        or text.startswith((".", "/", "~"))
        or text.count("/") > 1
        or (parent != "" and os.path.isdir(parent))
    )


class HubFetchError(CheckpointError):
    """The Hub did not provide a drafter; the fix names the offline switch in the caller's terms."""

    def __init__(self, name: str, cause: Exception):
        self.name, self.cause = name, cause
        super().__init__(self.message())

    def message(self, offline_switch: str = "local_files_only=True") -> str:
        """The error, telling Python users about `local_files_only=True` and CLI users about their flag."""
        return (
            f"Could not fetch draft checkpoint {self.name!r} from the Hugging Face Hub, and there is no local "
            f"directory of that name ({type(self.cause).__name__}: {self.cause}). If this machine is offline, "
            "download it elsewhere and pass the local directory, or make sure it is already in the huggingface_hub "
            f"cache (cache_dir / HF_HOME) and pass {offline_switch}."
        )


def resolve_checkpoint(name_or_path, *, revision=None, token=None, cache_dir=None, local_files_only=False) -> Path:
    """A local directory as is; otherwise a Hub repo id, fetched through huggingface_hub's cache."""
    if os.path.isdir(os.path.expanduser(str(name_or_path))):
        return Path(os.path.expanduser(str(name_or_path)))
    if looks_like_path(name_or_path):
        raise CheckpointError(f"{os.path.abspath(os.path.expanduser(str(name_or_path)))}: no such directory.")
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
        raise HubFetchError(str(name_or_path), err) from err


# ------------------------------------------------------------------ reading
def read_config(path: Path, sample_from_anchor: Optional[bool] = None) -> tuple[DSparkConfig, object]:
    """(config, layout module) of a checkpoint's config.json, whichever layout wrote it."""
    if not path.is_file():
        raise CheckpointError(f"{path}: config.json is missing; a draft checkpoint needs one.")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err}).") from None
    for layout in LAYOUTS:
        if layout.matches(raw):
            return layout.read_config(raw, str(path), sample_from_anchor=sample_from_anchor), layout
    raise CheckpointError(
        f"{path}: field 'architectures' is {raw.get('architectures')!r}; expected a DSpark or DFlash draft "
        f"checkpoint: {', '.join(f'{layout.ARCHITECTURE} ({layout.NAME})' for layout in LAYOUTS)}."
    )


def validate_against_target(config: DSparkConfig, target, source: str, layout=deepspec) -> None:
    """Reject a drafter whose shapes or layer ids cannot fit this target; layer ids are named as `layout` writes them."""
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
    field, offset = layout.LAYER_ID_FIELD, layout.LAYER_ID_OFFSET
    lowest, highest = -1 + offset, depth - 2 + offset
    for layer_id in config.target_layer_ids:
        shown = layer_id + offset
        if layer_id == depth - 1:
            raise CheckpointError(
                f"{source}: field '{field}' names {shown}, the target's final layer; its hidden state in "
                f"transformers is taken after the final norm, so it cannot be used. Expected ids in [{lowest}, {highest}]."
            )
        if not -1 <= layer_id <= depth - 2:
            raise CheckpointError(
                f"{source}: field '{field}' contains {shown}, out of range for a target with {depth} layers; "
                f"expected ids in [{lowest}, {highest}] ({lowest} is the embedding output)."
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
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
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


def weight_names(directory: Path) -> set[str]:
    """The tensor names stored in a checkpoint, read from the file headers only."""
    names = set()
    for path in _weight_files(directory):
        with _open(path) as handle:
            names |= set(handle.keys())
    return names


def check_draft_vocabulary(state: dict, config: DSparkConfig, source: str) -> None:
    """d2t must map each draft index to a distinct target id, in increasing order; t2d, if present, must agree."""
    d2t = state["d2t"]
    ids = torch.arange(len(d2t)) + d2t
    if ids.min() < 0 or ids.max() >= config.vocab_size or not bool((ids[1:] > ids[:-1]).all()):
        raise CheckpointError(
            f"{source}: 'd2t' maps draft indices to target ids {ids[:4].tolist()}...; expected increasing ids in "
            f"[0, {config.vocab_size}) (target id = draft index + d2t[draft index])."
        )
    mask = state.pop(VOCAB_MASK_KEY, None)
    if mask is not None and (mask.shape != (config.vocab_size,) or not torch.equal(mask.nonzero()[:, 0], ids)):
        raise CheckpointError(f"{source}: 't2d' does not mark the same target ids as 'd2t'.")


def read_state_dict(directory: Path, expected: dict[str, torch.Size], target, check_shared_weights: bool) -> dict:
    """Read exactly the drafter's own tensors; skip (and optionally check) copies of the target's V x d tables."""
    shared = {
        "embed_tokens.weight": target.get_input_embeddings().weight,
        "lm_head.weight": target.get_output_embeddings().weight,
    }
    state, origin = {}, {}
    for path in _weight_files(directory):
        with _open(path) as handle:
            for key in handle.keys():
                if key in SHARED_KEYS and key not in expected:
                    if check_shared_weights:
                        _check_shared_copy(handle, key, path, shared[key])
                    continue
                if key == VOCAB_MASK_KEY and "d2t" not in expected:
                    continue  # a full-vocabulary mask: nothing to map
                try:
                    state[key] = handle.get_tensor(key)
                except (SafetensorError, OSError, ValueError) as err:
                    raise CheckpointError(f"{path}: tensor '{key}' cannot be read ({err}).") from None
                origin[key] = path
    if "d2t" in expected and "d2t" not in state:
        raise CheckpointError(
            f"{directory}: the config prunes the draft vocabulary to {expected['d2t'][0]} tokens, but the weights "
            "have no 'd2t' (draft index -> target id offsets), so draft tokens cannot be mapped to the target's."
        )
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected) - {VOCAB_MASK_KEY})
    if missing or unexpected:
        where = ", ".join(sorted({str(p) for p in origin.values()})) or str(directory)
        raise CheckpointError(
            f"{where}: weights do not match the configuration. Missing: {missing or 'none'}. "
            f"Unexpected: {unexpected or 'none'}."
        )
    for key, tensor in state.items():
        if key != VOCAB_MASK_KEY and tensor.shape != expected[key]:
            raise CheckpointError(
                f"{origin[key]}: '{key}' has shape {list(tensor.shape)}; the configuration expects {list(expected[key])}."
            )
    return state


def placement(target) -> torch.device:
    """The LM head's device: the drafter's logits go through it every round, and target features
    from other devices of a `device_map` spread are moved here as they arrive."""
    return target.get_output_embeddings().weight.device


# ------------------------------------------------------------------ the public class
class DSparkDrafter(DraftModel):
    """A DSpark or DFlash drafter bound to the target whose embedding and LM head it shares.

        drafter = DSparkDrafter.from_pretrained("deepseek-ai/dspark_qwen3_4b_block7", target)
        target.generate(**inputs, assistant_model=drafter)
    """

    def __init__(self, config: DSparkConfig, target):
        # It speaks the target's tokenizer; transformers' pipelines compare the two configs' special tokens.
        super().__init__(config.with_tokens_of(target.config), target)

    @classmethod
    def from_pretrained(
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
        sample_from_anchor: Optional[bool] = None,
    ) -> "DSparkDrafter":
        """Load a drafter in any supported layout (Hub repo id or local directory) and attach it to `target`.

        Layouts: DeepSpec, z-lab DFlash, speculators (dspark / dflash) and SpecForge,
        recognised from config.json. The drafter takes the target's dtype unless `dtype`
        says otherwise, and sits on the device of the target's LM head.
        `check_shared_weights=False` skips comparing stored embedding / LM-head copies
        with the target's. `sample_from_anchor` sets the block convention of a speculators
        or SpecForge checkpoint (True: slot k-1 predicts the token k after the anchor;
        False: the 1+N layout), overriding what its config says or lacks.
        """
        directory = resolve_checkpoint(
            name_or_path, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only
        )
        source = str(directory / "config.json")
        config, layout = read_config(directory / "config.json", sample_from_anchor=sample_from_anchor)
        depth = target.config.get_text_config().num_hidden_layers
        stored = weight_names(directory)
        config = dataclasses.replace(
            config,
            num_target_layers=depth if config.num_target_layers is None else config.num_target_layers,
            # speculators labels Llama-type layers without saying whether they carry q/k norms: the weights tell.
            qk_norm=config.qk_norm and any(name.endswith("self_attn.q_norm.weight") for name in stored),
        )
        validate_against_target(config, target, source, layout)
        # Shapes only: weights initialised and then overwritten would cost an 8B-sized drafter a minute of CPU and
        # a float32 copy of itself beside the checkpoint's tensors.
        with torch.device("meta"):
            drafter = cls(config, target)
        expected = {key: value.shape for key, value in drafter.state_dict().items()}
        state = read_state_dict(directory, expected, target, check_shared_weights)
        if config.pruned:
            check_draft_vocabulary(state, config, source)
        drafter.load_state_dict(state, assign=True)
        drafter.rotary = type(drafter.rotary)(config)  # computed from the config, not stored
        drafter.to(device=placement(target), dtype=dtype or target.get_input_embeddings().weight.dtype).eval()
        drafter.name_or_path = str(name_or_path)
        drafter.calibration = load_calibration(directory, config.num_draft_tokens)  # STS temperatures, if calibrated
        attach_to_target(target)
        return drafter

    def save_pretrained(
        self, save_directory, *, format: str = "deepspec", include_shared_weights: bool = False, dtype=None,
        max_shard_size: int | str = "5GB",
    ) -> None:
        """Write config.json and model.safetensors in a published layout: 'deepspec' or 'speculators'.

        Weights over `max_shard_size` go into several safetensors files with the usual
        model.safetensors.index.json, as transformers writes them.

        `include_shared_weights` adds copies of the target's embedding and LM head, which
        DeepSpec's own loader expects; `dtype` casts the stored tensors. A pruned draft
        vocabulary is stored as speculators stores it, in both layouts: `lm_head.weight`
        [draft vocab, d], `d2t` (target id = draft index + d2t) and the mask `t2d`.
        """
        if format not in WRITABLE:
            raise ValueError(f"format is {format!r}; expected one of {WRITABLE}.")
        layout = LAYOUT_NAMES[format]
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        target_config = self.target.config.get_text_config().to_dict()
        target_config["architectures"] = self.target.config.architectures or [type(self.target).__name__]
        (directory / "config.json").write_text(json.dumps(layout.config_dict(self.config, target_config), indent=2))
        dtype = dtype or self.dtype
        tensors = {
            key: value.detach().to("cpu", dtype if value.is_floating_point() else value.dtype).contiguous()
            for key, value in self.state_dict().items()
        }
        if self.config.pruned:
            mask = torch.zeros(self.config.vocab_size, dtype=torch.bool)
            mask[self.draft_token_ids().cpu()] = True
            tensors[VOCAB_MASK_KEY] = mask
        if include_shared_weights:
            tensors["embed_tokens.weight"] = self.embed_tokens.weight.detach().to("cpu", dtype).clone()
            if not self.config.pruned:
                tensors["lm_head.weight"] = self.target_lm_head.weight.detach().to("cpu", dtype).clone()
        split = split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_size)
        for filename, names in split.filename_to_tensors.items():
            temporary = directory / (filename + ".tmp")
            save_file({name: tensors[name] for name in names}, str(temporary), metadata={"format": "pt"})
            os.replace(temporary, directory / filename)
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
            (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        else:  # a stale index would point the loader at an earlier save's shards
            (directory / "model.safetensors.index.json").unlink(missing_ok=True)
