"""Every published layout: read against real library outputs, and drafting rounds identical across layouts.

The layout writers here are written by hand from the layouts' descriptions, not with
dspark_hf's own writers, so a reader that agrees with them agrees with the format and
not merely with our exporter. `fixtures/speculators` holds checkpoints written by the
real `speculators==0.9.0` library with reference outputs of its own modules.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3Config

from conftest import MASK_ID, VOCAB, tiny_target, write_bigram_deepspec, write_deepspec, write_zlab
from dspark_hf import CheckpointError, DSparkDrafter
from dspark_hf.core.modeling import ContextCache
from dspark_hf.core.sampling import DraftTokenChooser
from dspark_hf.tools.cli import main as dspark_main
from test_generation import prompts

FIXTURES = Path(__file__).parent / "fixtures" / "speculators"
THRESHOLDS = (0.0, 0.5)


# ------------------------------------------------------------------ layouts written by hand
def read(directory: Path) -> tuple[dict, dict]:
    return json.loads((directory / "config.json").read_text()), load_file(directory / "model.safetensors")


def write(directory: Path, config: dict, tensors: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file({key: value.contiguous() for key, value in tensors.items()}, str(directory / "model.safetensors"))
    return directory


def own_tensors(tensors: dict) -> dict:
    return {key: value for key, value in tensors.items() if key not in ("embed_tokens.weight", "lm_head.weight")}


def layer_diff(raw: dict, **extra) -> dict:
    """transformer_layer_config as speculators writes it: a diff against Qwen3Config's defaults."""
    defaults = Qwen3Config().to_dict()
    fields = {key: raw[key] for key in ("hidden_size", "intermediate_size", "num_attention_heads",
                                        "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps",
                                        "max_position_embeddings", "rope_parameters")}
    fields.update(num_hidden_layers=raw["num_hidden_layers"], **extra)
    return {"model_type": "qwen3", **{k: v for k, v in fields.items() if defaults.get(k) != v}}


def as_speculators(source: Path, out: Path, anchor_first=True, keep_field=True, **layer_extra) -> Path:
    raw, tensors = read(source)
    kind = "dspark" if raw.get("markov_rank", 0) or raw.get("enable_confidence_head") or anchor_first else "dflash"
    dflash = raw.get("dflash_config", {})
    layer_ids = raw.get("target_layer_ids", dflash.get("target_layer_ids"))
    config = {
        "architectures": ["DSparkDraftModel" if kind == "dspark" else "DFlashDraftModel"],
        "auto_map": {"": "config.DSparkSpeculatorConfig"},
        "speculators_model_type": kind,
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer_diff(raw, **layer_extra),
        "aux_hidden_state_layer_ids": [i + 1 for i in layer_ids],
        "block_size": raw["block_size"],
        "mask_token_id": raw.get("mask_token_id", dflash.get("mask_token_id")),
        "draft_vocab_size": raw["vocab_size"],
        "target_hidden_size": None,
        "sliding_window_non_causal": True,
        "markov_rank": raw.get("markov_rank", 0),
        "markov_head_type": raw.get("markov_head_type", "vanilla"),
        "enable_confidence_head": raw.get("enable_confidence_head", False),
        "confidence_head_with_markov": raw.get("confidence_head_with_markov", False),
        "speculators_config": {"algorithm": kind, "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4}],
                               "verifier": {"name_or_path": "tiny", "architectures": ["Qwen3ForCausalLM"]}},
    }
    if keep_field:
        config["sample_from_anchor"] = anchor_first
    return write(out, config, own_tensors(tensors))


def as_specforge(source: Path, out: Path) -> Path:
    raw, tensors = read(source)
    config = {key: raw[key] for key in ("hidden_size", "intermediate_size", "num_attention_heads", "head_dim",
                                        "num_key_value_heads", "vocab_size", "rms_norm_eps", "rope_parameters",
                                        "max_position_embeddings", "num_hidden_layers", "num_target_layers",
                                        "block_size")}
    config.update(
        model_type="qwen3",
        architectures=["DSparkDraftModel"],
        auto_map={"AutoModel": "dspark.DSparkDraftModel"},
        dflash_config={
            "mask_token_id": raw["mask_token_id"],
            "target_layer_ids": raw["target_layer_ids"],
            "projector_type": "dspark",
            "attention_mode": "gqa",
            "markov_rank": raw["markov_rank"],
            "markov_head_type": raw["markov_head_type"],
            "confidence_head_alpha": 1.0,
            "confidence_head_with_markov": raw["confidence_head_with_markov"],
        },
    )
    return write(out, config, own_tensors(tensors))


def pruned_speculators(source: Path, out: Path, keep: list[int], target) -> Path:
    """The drafter restricted to the target ids `keep` (sorted): its own LM head rows, W2 rows, d2t, t2d."""
    as_speculators(source, out)
    config, tensors = read(out)
    ids = torch.tensor(sorted(keep))
    tensors["lm_head.weight"] = target.get_output_embeddings().weight.detach()[ids].clone()
    tensors["markov_head.markov_w2.weight"] = tensors["markov_head.markov_w2.weight"][ids].clone()
    tensors["d2t"] = ids - torch.arange(len(ids))
    tensors["t2d"] = torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, ids, True)
    config["draft_vocab_size"] = len(ids)
    return write(out, config, tensors)


# ------------------------------------------------------------------ comparing rounds
def rounds(target, drafter, threshold: float, count: int = 5):
    """Every round of greedy generation on a few prompts; each output checked against plain decoding."""
    found = []
    for i, prompt in enumerate(prompts(count, seed=21)):
        expected = target.generate(prompt, max_new_tokens=20 + 3 * i, do_sample=False)
        produced = target.generate(prompt, max_new_tokens=20 + 3 * i, do_sample=False, assistant_model=drafter,
                                   assistant_confidence_threshold=threshold)
        assert produced.tolist() == expected.tolist()
        found += drafter.last_trace
    return found


def assert_same_rounds(target, reference, other, accepted_often=True):
    for threshold in THRESHOLDS:
        mine, theirs = rounds(target, reference, threshold), rounds(target, other, threshold)
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            assert (a.position, a.draft_ids, a.num_verified, a.num_accepted) == (
                b.position, b.draft_ids, b.num_verified, b.num_accepted)
            assert a.confidences == pytest.approx(b.confidences, abs=1e-4)
    if accepted_often:
        accepted = [r.num_accepted for r in rounds(target, reference, 0.0)]
        assert max(accepted) >= 2, "the comparison must see multi-token acceptance"


@pytest.fixture
def deepspec_dir(tmp_path):
    target = tiny_target("qwen3")
    return target, write_bigram_deepspec(target, tmp_path / "deepspec", block_size=5)


def load(path, target, **kwargs):
    return DSparkDrafter.from_pretrained(path, target, **kwargs)


def test_speculators_and_specforge_read_like_deepspec(deepspec_dir, tmp_path):
    target, source = deepspec_dir
    reference = load(source, target)
    speculators = load(as_speculators(source, tmp_path / "spec"), target)
    assert speculators.config.source_format == "speculators" and speculators.config.target_layer_ids == [0, 2]
    assert_same_rounds(target, reference, speculators)
    specforge = load(as_specforge(source, tmp_path / "sf"), target)
    assert specforge.config.source_format == "specforge"
    assert_same_rounds(target, reference, specforge)


def test_sliding_layers_with_a_window_beyond_the_context_read_like_full_ones(deepspec_dir, tmp_path):
    target, source = deepspec_dir
    path = as_speculators(source, tmp_path / "s", layer_types=["sliding_attention"], sliding_window=4096,
                          use_sliding_window=True)
    # fields equal to Qwen3Config's defaults are left out of the diff: rebuilding through the class restores them
    assert "rms_norm_eps" not in json.loads((path / "config.json").read_text())["transformer_layer_config"]
    sliding = load(path, target)
    assert sliding.config.layer_window(0) == 4096 and sliding.config.sliding_window_non_causal
    assert_same_rounds(target, load(source, target), sliding)


def test_sliding_layers_without_a_window_read_as_full_attention(deepspec_dir, tmp_path):
    """speculators builds no window when `sliding_window` is null: those layers see the whole context."""
    target, source = deepspec_dir
    path = as_speculators(source, tmp_path / "s", layer_types=["sliding_attention"], use_sliding_window=True)
    raw = json.loads((path / "config.json").read_text())
    raw["transformer_layer_config"]["sliding_window"] = None
    (path / "config.json").write_text(json.dumps(raw))
    unwindowed = load(path, target)
    assert unwindowed.config.layer_types is None and unwindowed.config.layer_window(0) is None
    assert_same_rounds(target, load(source, target), unwindowed)


def test_pruned_vocabulary_holding_every_argmax_drafts_the_same(deepspec_dir, tmp_path):
    target, source = deepspec_dir
    reference = load(source, target)
    proposed = {t for threshold in THRESHOLDS for r in rounds(target, reference, threshold) for t in r.draft_ids}
    keep = sorted(proposed | {0, VOCAB - 1})
    assert len(keep) < VOCAB - 4, "the test needs a real pruning"
    pruned = load(pruned_speculators(source, tmp_path / "p", keep, target), target)
    assert pruned.config.draft_vocab_size == len(keep) and pruned.draft_token_ids().tolist() == keep
    assert_same_rounds(target, reference, pruned)


def test_one_plus_n_layouts_follow_the_zlab_convention(tmp_path):
    target = tiny_target("qwen3")
    zlab_dir = write_zlab(target, tmp_path / "z", block_size=6)
    reference = load(zlab_dir, target)
    assert reference.config.num_draft_tokens == 5
    explicit = load(as_speculators(zlab_dir, tmp_path / "s", anchor_first=False), target)
    assert explicit.config.first_draft_index == 1
    # a random DFlash drafter is rarely accepted; the whole drafted blocks still have to agree
    assert_same_rounds(target, reference, explicit, accepted_often=False)
    with pytest.warns(UserWarning, match="'sample_from_anchor' is missing.*reading it as false"):
        missing = load(as_speculators(zlab_dir, tmp_path / "m", anchor_first=False, keep_field=False), target)
    assert_same_rounds(target, reference, missing, accepted_often=False)
    overridden = load(tmp_path / "m", target, sample_from_anchor=True)
    assert overridden.config.first_draft_index == 0 and overridden.config.num_draft_tokens == 6


def test_specforge_dspark_reads_anchor_first_unless_told(deepspec_dir, tmp_path):
    target, source = deepspec_dir
    path = as_specforge(source, tmp_path / "sf")
    assert load(path, target).config.first_draft_index == 0
    assert load(path, target, sample_from_anchor=False).config.num_draft_tokens == 4
    with pytest.raises(ValueError, match="DeepSpec layout is always anchor-first|deepspec layout is always"):
        load(source, target, sample_from_anchor=False)


# ------------------------------------------------------------------ export
@pytest.mark.parametrize("fields", [dict(), dict(markov_head_type="rnn"), dict(markov_rank=0, enable_confidence_head=False)])
def test_export_to_speculators_and_back_drafts_the_same(fields, tmp_path):
    target = tiny_target("qwen3")
    target.config._name_or_path = "acme/tiny-target"
    source = write_deepspec(target, tmp_path / "d", block_size=4, **fields)
    reference = load(source, target)
    reference.save_pretrained(tmp_path / "spec", format="speculators")
    raw = json.loads((tmp_path / "spec" / "config.json").read_text())
    # what vLLM's speculators parser requires, and every field the layout defines
    assert raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert raw["speculators_config"]["verifier"] == {"name_or_path": "acme/tiny-target",
                                                     "architectures": ["Qwen3ForCausalLM"]}
    assert isinstance(raw["transformer_layer_config"], dict) and raw["speculators_model_type"] == "dspark"
    assert raw["transformer_layer_config"]["num_hidden_layers"] == 1
    assert raw["transformer_layer_config"]["vocab_size"] == VOCAB
    assert raw["aux_hidden_state_layer_ids"] == [1, 3] and raw["sample_from_anchor"] is True
    for key in ("block_size", "mask_token_id", "target_hidden_size", "draft_vocab_size", "markov_rank",
                "markov_head_type", "enable_confidence_head", "confidence_head_with_markov",
                "sliding_window_non_causal", "speculators_version", "architectures"):
        assert key in raw, key
    exported = load(tmp_path / "spec", target)
    assert exported.config == reference.config.__class__(**{**reference.config.__dict__,
                                                            "source_format": "speculators"})
    # rounds: the tiny random drafter rarely gets accepted, so compare the raw blocks too
    for a, b in zip(rounds(target, reference, 0.0), rounds(target, exported, 0.0)):
        assert (a.draft_ids, a.num_accepted) == (b.draft_ids, b.num_accepted)
        assert a.confidences == pytest.approx(b.confidences, abs=1e-4)


def test_pruned_drafter_exports_d2t_and_round_trips(deepspec_dir, tmp_path):
    target, source = deepspec_dir
    keep = list(range(0, VOCAB, 2)) + [VOCAB - 1]
    pruned = load(pruned_speculators(source, tmp_path / "p", keep, target), target)
    for layout in ("speculators", "deepspec"):
        pruned.save_pretrained(tmp_path / layout, format=layout)
        stored = load_file(tmp_path / layout / "model.safetensors")
        assert stored["d2t"].tolist() == (torch.tensor(keep) - torch.arange(len(keep))).tolist()
        assert stored["t2d"].nonzero()[:, 0].tolist() == keep and stored["lm_head.weight"].shape == (len(keep), 32)
        again = load(tmp_path / layout, target)
        assert again.config.draft_vocab_size == len(keep)
        assert_same_rounds(target, pruned, again)


def test_export_command_and_a_one_plus_n_drafter_refused_by_deepspec(tmp_path, capsys):
    dspark_main(["export", str(FIXTURES / "dspark_pruned"), str(tmp_path / "out"), "--format", "deepspec",
                 "--target", str(FIXTURES / "verifier")])
    raw = json.loads((tmp_path / "out" / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3DSparkModel"] and raw["draft_vocab_size"] == 16
    assert '"format": "deepspec"' in capsys.readouterr().out
    with pytest.raises(SystemExit, match="anchor-first drafters only .* format='speculators'"):
        dspark_main(["export", str(FIXTURES / "dflash"), str(tmp_path / "x"), "--target", str(FIXTURES / "verifier")])


# ------------------------------------------------------------------ the real speculators library
class RecordingChooser(DraftTokenChooser):
    """Greedy over the scored vocabulary, keeping every step's logits."""

    def __init__(self, draft_token_ids):
        super().__init__(torch.zeros(1, 0, dtype=torch.long), draft_token_ids=draft_token_ids)
        self.logits = []

    def __call__(self, logits):
        self.logits.append(logits)
        return super().__call__(logits)


@pytest.fixture(scope="module")
def verifier():
    return AutoModelForCausalLM.from_pretrained(FIXTURES / "verifier", dtype=torch.float32).eval()


@pytest.mark.parametrize("name", ["dspark_vanilla", "dspark_pruned", "dspark_sliding", "dflash"])
@torch.no_grad()
def test_real_speculators_checkpoints_match_the_library(name, verifier):
    """One drafting pass from the library's recorded context equals the library's own outputs."""
    drafter = load(FIXTURES / name, verifier)
    reference = load_file(FIXTURES / name / "reference.safetensors")
    notes = json.loads((FIXTURES / name / "reference.json").read_text())
    assert drafter.config.first_draft_index == (0 if notes["sample_from_anchor"] else 1)
    anchor, position = int(reference["anchor_token"]), int(reference["anchor_position"])
    context = ContextCache()
    positions = torch.arange(position)
    features = reference["context_hidden_states"][None].split(drafter.config.hidden_size, dim=-1)
    context.append(drafter.context_kv(list(features), positions[None]))
    block_ids, block_positions = drafter.anchor_block(anchor, position)
    kv = [context.layer(i) for i in range(len(drafter.layers))]
    hidden = drafter.backbone(block_ids, block_positions, kv, positions, single_block=True)[0]
    torch.testing.assert_close(hidden, reference["draft_hidden"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(drafter.draft_logits(hidden), reference["base_logits"], rtol=1e-4, atol=1e-4)
    if "greedy_tokens" in reference:
        chooser = RecordingChooser(drafter.draft_token_ids())
        block = drafter.draft(anchor, position, context, chooser)
        assert block.draft_ids.tolist() == reference["greedy_tokens"].tolist()
        torch.testing.assert_close(torch.cat(chooser.logits), reference["greedy_markov_logits"], rtol=1e-4,
                                   atol=1e-4)
        torch.testing.assert_close(block.confidences, reference["greedy_confidence"], rtol=1e-4, atol=1e-5)


def test_real_speculators_checkpoints_generate_losslessly(verifier):
    for name in ("dspark_vanilla", "dspark_pruned", "dspark_sliding", "dflash"):
        drafter = load(FIXTURES / name, verifier)
        prompt = torch.tensor([[5, 9, 14, 3, 22, 7]])
        expected = verifier.generate(prompt, max_new_tokens=24, do_sample=False)
        assert verifier.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=drafter).tolist() == (
            expected.tolist())
        assert all(len(r.draft_ids) in (0, drafter.config.num_draft_tokens) for r in drafter.last_trace)


# ------------------------------------------------------------------ malformed checkpoints
def edited_copy(name: str, tmp_path: Path, config=None, tensors=None) -> Path:
    out = tmp_path / name
    shutil.copytree(FIXTURES / name, out)
    raw, weights = read(out)
    (config or (lambda r: None))(raw)
    (tensors or (lambda w: None))(weights)
    return write(out, raw, weights)


@pytest.mark.parametrize(
    "name, config, tensors, message",
    [
        ("dspark_pruned", None, lambda w: w.pop("d2t"),
         r"prunes the draft vocabulary to 16 tokens, but the weights have no 'd2t'"),
        ("dspark_pruned", None, lambda w: w.__setitem__("d2t", w["d2t"][:-1]),
         r"'d2t' has shape \[15\]; the configuration expects \[16\]"),
        ("dspark_pruned", None, lambda w: w.__setitem__("d2t", torch.zeros(16, dtype=torch.long).fill_(70)),
         r"'d2t' maps draft indices to target ids"),
        ("dspark_vanilla", lambda r: r.__setitem__("aux_hidden_state_layer_ids", [1, 9]), None,
         r"'aux_hidden_state_layer_ids' contains 9, out of range for a target with 4 layers; expected ids in \[0, 3\]"),
        ("dspark_vanilla", lambda r: r.__setitem__("aux_hidden_state_layer_ids", [1, 4]), None,
         r"'aux_hidden_state_layer_ids' names 4, the target's final layer"),
        ("dspark_vanilla", lambda r: r.__setitem__("speculators_model_type", "eagle3"), None,
         r"'speculators_model_type' is 'eagle3'; dspark_hf reads \['dspark', 'dflash'\]"),
        ("dspark_vanilla", lambda r: r["transformer_layer_config"].__setitem__("model_type", "mixtral"), None,
         r"'transformer_layer_config.model_type' is 'mixtral'"),
        ("dspark_vanilla", lambda r: r.pop("transformer_layer_config"), None,
         r"required field 'transformer_layer_config' is missing"),
    ],
)
def test_malformed_speculators_checkpoints_are_named(name, config, tensors, message, tmp_path, verifier):
    path = edited_copy(name, tmp_path, config, tensors)
    with pytest.raises(CheckpointError, match=message) as error:
        load(path, verifier)
    assert str(path) in str(error.value)


def test_malformed_specforge_checkpoint_is_named(deepspec_dir, tmp_path):
    target, source = deepspec_dir
    path = as_specforge(source, tmp_path / "sf")
    raw, weights = read(path)
    raw["dflash_config"]["projector_type"] = "domino"
    write(path, raw, weights)
    with pytest.raises(CheckpointError, match="'dflash_config.projector_type' is 'domino'"):
        load(path, target)


def test_unknown_architecture_lists_every_layout(deepspec_dir, tmp_path):
    target, source = deepspec_dir
    raw, weights = read(source)
    raw["architectures"] = ["MedusaModel"]
    write(source, raw, weights)
    with pytest.raises(CheckpointError, match="speculators.*specforge.*deepspec.*zlab"):
        load(source, target)


def test_mask_token_outside_the_vocabulary(tmp_path):
    target = tiny_target("qwen3")
    path = as_speculators(write_zlab(target, tmp_path / "z"), tmp_path / "s", anchor_first=False)
    raw, weights = read(path)
    raw["mask_token_id"] = MASK_ID + 100
    write(path, raw, weights)
    with pytest.raises(CheckpointError, match=f"'mask_token_id' is {MASK_ID + 100}"):
        load(path, target)
