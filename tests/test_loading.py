"""Loading: both formats, the Hub cache path offline, sharing, dtype, and every rejection."""

from __future__ import annotations

import gc
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import MASK_ID, VOCAB, drafter_config, tiny_target, write_bigram_deepspec, write_deepspec, write_zlab
from dspark_hf import CheckpointError, DSparkDrafter
from dspark_hf.core.config import zlab_default_layer_ids
from dspark_hf.formats import deepspec, zlab
from dspark_hf.formats.loader import read_config


def count_vocab_tables(vocab: int, width: int) -> int:
    # type(), not isinstance(): isinstance reads __class__, and torch.distributed.reduce_op warns when read
    return sum(
        1 for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor) and tuple(obj.shape) == (vocab, width)
    )


def test_shares_embedding_and_lm_head_without_a_copy(tmp_path):
    target = tiny_target("qwen3", seed=11)
    path = write_deepspec(target, tmp_path / "d")  # the file carries embed_tokens / lm_head copies
    assert {"embed_tokens.weight", "lm_head.weight"} <= set(load_file(path / "model.safetensors"))
    gc.collect()
    before = count_vocab_tables(VOCAB, 32)
    drafter = DSparkDrafter.from_pretrained(path, target)
    gc.collect()
    assert count_vocab_tables(VOCAB, 32) == before
    assert drafter.embed_tokens is target.get_input_embeddings()
    assert drafter.target_lm_head is target.get_output_embeddings()
    assert not any(tuple(t.shape) == (VOCAB, 32) for t in drafter.state_dict().values())


def test_dtype_follows_target_unless_told(tmp_path):
    target = tiny_target("llama").to(torch.bfloat16)
    path = write_deepspec(tiny_target("llama"), tmp_path / "d")
    assert DSparkDrafter.from_pretrained(path, target).dtype == torch.bfloat16
    assert DSparkDrafter.from_pretrained(path, target, dtype=torch.float32).dtype == torch.float32


def test_save_and_reload_round_trip(tmp_path):
    target = tiny_target("llama")
    drafter = DSparkDrafter.from_pretrained(write_bigram_deepspec(target, tmp_path / "a"), target)
    drafter.save_pretrained(tmp_path / "b")
    again = DSparkDrafter.from_pretrained(tmp_path / "b", target)
    for key, value in drafter.state_dict().items():
        assert torch.equal(value, again.state_dict()[key])
    assert again.config == drafter.config
    raw = json.loads((tmp_path / "b" / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3DSparkModel"] and raw["model_type"] == "qwen3"
    # nothing that describes the target's own files leaks into the drafter's config (the stored dtype above all)
    assert not {"dtype", "torch_dtype", "_name_or_path", "_model_name_or_path", "id2label", "label2id"} & set(raw)
    assert "embed_tokens.weight" not in load_file(tmp_path / "b" / "model.safetensors")


def test_save_in_shards_under_a_size_limit_and_reload(tmp_path):
    target = tiny_target("llama")
    drafter = DSparkDrafter.from_pretrained(write_bigram_deepspec(target, tmp_path / "a"), target)
    drafter.save_pretrained(tmp_path / "b", max_shard_size=4096)
    shards = sorted((tmp_path / "b").glob("*.safetensors"))
    index = json.loads((tmp_path / "b" / "model.safetensors.index.json").read_text())
    tensors_in = {path.name: list(index["weight_map"].values()).count(path.name) for path in shards}
    assert len(shards) > 2  # a shard holds weights up to the limit (+ its header), or one tensor over it
    assert all(path.stat().st_size <= 4096 + 1024 or tensors_in[path.name] == 1 for path in shards)
    assert set(index["weight_map"]) == set(drafter.state_dict())
    again = DSparkDrafter.from_pretrained(tmp_path / "b", target)
    for key, value in drafter.state_dict().items():
        assert torch.equal(value, again.state_dict()[key])
    drafter.save_pretrained(tmp_path / "b")  # one file again: the stale index goes with it
    assert not (tmp_path / "b" / "model.safetensors.index.json").exists()
    assert DSparkDrafter.from_pretrained(tmp_path / "b", target).config == drafter.config


def test_config_round_trips_through_the_deepspec_layout():
    target = tiny_target("qwen3")
    for fields in (
        dict(markov_head_type="rnn"),
        dict(markov_rank=0, enable_confidence_head=False),
        dict(enable_confidence_head=False),
    ):
        config = drafter_config(target, **fields)
        assert deepspec.read_config(deepspec.config_dict(config, target.config.to_dict()), "config.json") == config


def test_zlab_defaults_and_convention(tmp_path):
    target = tiny_target("qwen3")
    path = write_zlab(target, tmp_path / "z", block_size=6)
    raw = json.loads((path / "config.json").read_text())
    del raw["dflash_config"]["target_layer_ids"]
    (path / "config.json").write_text(json.dumps(raw))
    config, layout = read_config(path / "config.json")
    assert layout is zlab
    assert config.first_draft_index == 1 and config.num_draft_tokens == 5
    assert config.target_layer_ids == zlab_default_layer_ids(4, 1) == [2]
    assert zlab_default_layer_ids(36, 5) == [1, 9, 17, 25, 33]


def make_hub_cache(checkpoint, cache_dir, repo_id="acme/tiny-dspark", commit="0123456789abcdef0123456789abcdef01234567"):
    """The huggingface_hub cache layout: models--org--name/{refs/main, snapshots/<commit>/...}."""
    repo_dir = cache_dir / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    shutil.copytree(checkpoint, repo_dir / "snapshots" / commit)
    return repo_id


def test_hub_repo_id_through_the_local_cache_offline(tmp_path, monkeypatch):
    target = tiny_target("llama")
    repo_id = make_hub_cache(write_bigram_deepspec(target, tmp_path / "ckpt"), tmp_path / "hub")
    drafter = DSparkDrafter.from_pretrained(repo_id, target, cache_dir=tmp_path / "hub", local_files_only=True)
    prompt = torch.tensor([[1, 2, 3]])
    expected = target.generate(prompt, max_new_tokens=12, do_sample=False)
    assert target.generate(prompt, max_new_tokens=12, do_sample=False, assistant_model=drafter).tolist() == expected.tolist()
    # HF_HUB_OFFLINE=1 (read through huggingface_hub's constants) resolves the same snapshot
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    DSparkDrafter.from_pretrained(repo_id, target, cache_dir=tmp_path / "hub")


def test_hub_repo_missing_offline_is_a_clear_error(tmp_path, monkeypatch):
    target = tiny_target("llama")
    with pytest.raises(CheckpointError, match="Could not fetch draft checkpoint 'acme/not-cached'.*offline") as error:
        DSparkDrafter.from_pretrained("acme/not-cached", target, cache_dir=tmp_path, local_files_only=True)
    assert str(error.value).endswith("pass local_files_only=True.")  # Python's name; the CLI says --local-files-only
    # no network here: a real download attempt fails the same, clear way
    with pytest.raises(CheckpointError, match="Could not fetch"):
        DSparkDrafter.from_pretrained("dspark-hf-tests/does-not-exist", target, cache_dir=tmp_path)
    with pytest.raises(CheckpointError, match="neither an existing local directory"):
        DSparkDrafter.from_pretrained("not a valid id!", target, cache_dir=tmp_path)
    # a typo in a local path is called what it is, not sent to the Hub
    (tmp_path / "runs").mkdir()
    for typo in ("./runs/drafterr", str(tmp_path / "runs" / "drafterr"), "~/no/such/drafter", tmp_path / "nope"):
        with pytest.raises(CheckpointError, match="drafterr: no such directory|drafter: no such directory|nope: no such"):
            DSparkDrafter.from_pretrained(typo, target, cache_dir=tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=f"{tmp_path}/runs/drafterr: no such directory"):
        DSparkDrafter.from_pretrained("runs/drafterr", target, cache_dir=tmp_path)


def edit_config(path, **changes):
    raw = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    (path / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(architectures=["LlamaForCausalLM"]), r"'architectures' is \['LlamaForCausalLM'\]; expected"),
        (dict(layer_types=["chunked_attention"]), r"'layer_types' is \['chunked_attention'\]; expected 1 entries"),
        (dict(layer_types=["sliding_attention"]), r"required field 'sliding_window' is missing"),
        (dict(markov_head_type="lstm"), r"'markov_head_type' is 'lstm'; expected one of"),
        (dict(num_target_layers=36), r"'num_target_layers' is 36 but the target .* has 4"),
        (dict(target_layer_ids=[0, 3]), r"'target_layer_ids' names 3, the target's final layer"),
        (dict(target_layer_ids=[0, 7]), r"contains 7, out of range .* expected ids in \[-1, 2\]"),
        (dict(target_layer_ids=[-2, 1]), r"contains -2, out of range"),
        (dict(mask_token_id=VOCAB), rf"'mask_token_id' is {VOCAB}; expected a token id in \[0, {VOCAB}\)"),
        (dict(block_size=None), r"required field 'block_size' is missing"),
    ],
)
def test_config_errors_name_field_and_values(changes, message, tmp_path):
    target = tiny_target("llama")
    path = write_deepspec(target, tmp_path / "d")
    edit_config(path, **changes)
    with pytest.raises(CheckpointError, match=message) as err:
        DSparkDrafter.from_pretrained(path, target)
    assert "config.json" in str(err.value)


def test_drafter_for_a_different_target_is_rejected(tmp_path):
    target = tiny_target("llama")
    wider = tiny_target("llama", vocab=VOCAB + 8)
    path = write_deepspec(wider, tmp_path / "wide", mask_token_id=MASK_ID)
    with pytest.raises(CheckpointError, match=rf"'vocab_size' is {VOCAB + 8} but the target .* has {VOCAB}"):
        DSparkDrafter.from_pretrained(path, target)
    # same shapes, other weights: caught by comparing the stored embedding copy
    lookalike = tiny_target("llama", seed=99)
    path = write_deepspec(lookalike, tmp_path / "look")
    with pytest.raises(CheckpointError, match="'embed_tokens.weight' row 0 differs .* check_shared_weights=False"):
        DSparkDrafter.from_pretrained(path, target)
    DSparkDrafter.from_pretrained(path, target, check_shared_weights=False)


def test_hidden_size_mismatch(tmp_path):
    target = tiny_target("llama")
    raw_dir = write_deepspec(target, tmp_path / "d")
    edit_config(raw_dir, hidden_size=48)
    with pytest.raises(CheckpointError, match="'hidden_size' is 48 but the target .* has 32"):
        DSparkDrafter.from_pretrained(raw_dir, target)


def test_weight_errors(tmp_path):
    target = tiny_target("llama")
    path = write_deepspec(target, tmp_path / "d")
    weights = load_file(path / "model.safetensors")

    missing = dict(weights)
    del missing["fc.weight"]
    save_file(missing, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model.safetensors: weights do not match .* Missing: \['fc.weight'\]"):
        DSparkDrafter.from_pretrained(path, target)

    extra = dict(weights, **{"layers.9.mlp.up_proj.weight": torch.zeros(2, 2)})
    save_file(extra, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"Unexpected: \['layers.9.mlp.up_proj.weight'\]"):
        DSparkDrafter.from_pretrained(path, target)

    wrong = dict(weights, **{"fc.weight": torch.zeros(32, 5)})
    save_file(wrong, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'fc.weight' has shape \[32, 5\]; the configuration expects \[32, 64\]"):
        DSparkDrafter.from_pretrained(path, target)


def test_broken_files(tmp_path):
    target = tiny_target("llama")
    path = write_deepspec(target, tmp_path / "d")
    blob = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        DSparkDrafter.from_pretrained(path, target)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        DSparkDrafter.from_pretrained(path, target)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        DSparkDrafter.from_pretrained(path, target)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        DSparkDrafter.from_pretrained(path, target)


def test_loading_never_runs_checkpoint_code(tmp_path):
    """A z-lab auto_map pointing at remote code is ignored: nothing from the checkpoint is imported."""
    target = tiny_target("qwen3")
    path = write_zlab(target, tmp_path / "z")
    (path / "dflash.py").write_text("raise SystemExit('checkpoint code ran')\n")
    drafter = DSparkDrafter.from_pretrained(path, target)
    assert drafter.config.source_format == "zlab"


def test_drafter_is_not_a_general_model(tmp_path):
    target = tiny_target("llama")
    drafter = DSparkDrafter.from_pretrained(write_deepspec(target, tmp_path / "d"), target)
    with pytest.raises(TypeError, match="assistant_model"):
        drafter.generate(torch.tensor([[1, 2]]))
