"""DSpark's round mechanics at Qwen3-8B size on one GPU, prepared to fit a short GPU slot.

    bash scripts/gpu_check.sh OUT_DIR                               # the GPU machine: about 4 minutes on an H200
    python scripts/gpu_check.py OUT_DIR --toy --device cpu          # anywhere: the same steps on a tiny pair

A random target shaped like Qwen3-8B (36 layers of 4096, 32/8 heads of 128, MLP 12288,
151,936-token vocabulary, untied head; huggingface.co/Qwen/Qwen3-8B) in bfloat16, and a
random drafter with DeepSpec's published Qwen3-8B hyper-parameters
(deepseek-ai/dspark_qwen3_8b_block7: 5 layers, block 7, target layers [1, 9, 17, 25, 33],
Markov rank 256, confidence head over the Markov feature). Random weights accept almost
no drafts, so the check measures the mechanics of a round rather than a speed-up:

* T_verify(n), n = 1..16: one target forward of n tokens after a 256-token cache;
* the draft pass after the same context, eager, and compiled (compile time apart);
* plain greedy decoding against DSpark with every round verifying a whole block:
  tokens/s, and per round its seconds and committed tokens;
* the host's share of a DSpark round (its seconds minus the draft pass and the verify
  forward of the anchor and the block), and the device syncs per round and per plain
  token, which CUDA's sync debug mode counts (null on a CPU);
* the glue dspark_hf runs per round on a tiny pair on the same device (round_overhead.py).

Writes gpu_check.json and gpu_check.md into OUT_DIR. A step that fails records its error
and the others go on: a GPU slot is too rare to lose to one step. Works with transformers
5.17 and later (the forward's cache argument was renamed in 5.2x; verify_costs.py picks it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import round_overhead
import verify_costs
from dspark_hf import DSparkConfig, DSparkDrafter
from dspark_hf.core.generation import attach_to_target
from dspark_hf.core.modeling import ContextCache
from dspark_hf.core.sampling import DraftTokenChooser
from dspark_hf.core.timing import timed

QWEN3_8B = dict(
    hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, vocab_size=151936,
)
DEEPSPEC_8B = dict(
    num_hidden_layers=5, block_size=7, target_layer_ids=[1, 9, 17, 25, 33], mask_token_id=151669, markov_rank=256,
    markov_head_type="vanilla", enable_confidence_head=True, confidence_head_with_markov=True,
)
TOY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=512,
)
TOY_DRAFTER = {
    **DEEPSPEC_8B, "num_hidden_layers": 1, "target_layer_ids": [1, 3], "mask_token_id": 511, "markov_rank": 16,
}
VERIFY_LENGTHS = tuple(range(1, 17))
PROMPT_TOKENS = 64


class Report:
    """The measurements, and the error of each step that failed; written out after every step, so that a run
    stopped by the slot's end still leaves what it measured."""

    def __init__(self, out: Path):
        self.out = out
        self.values: dict = {}
        self.errors: dict[str, str] = {}
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str):
        started = time.perf_counter()
        print(f"[gpu_check] {name} ...", file=sys.stderr, flush=True)
        try:
            yield
        except Exception as err:  # recorded, and the next step runs: see the module docstring
            traceback.print_exc()
            self.errors[name] = f"{type(err).__name__}: {err}"
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 1)
            self.write()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.as_dict(), indent=2))
        (self.out / "gpu_check.md").write_text(markdown(self.as_dict()))

    def as_dict(self) -> dict:
        return {**self.values, "errors": self.errors, "step_seconds": self.seconds}


def random_target(dims: dict, device: torch.device, dtype: torch.dtype) -> Qwen3ForCausalLM:
    """A random Qwen3 of these dimensions, made on the device without transformers' initialisation."""
    config = Qwen3Config(
        **dims, max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    model = model.to(dtype).to_empty(device=device).eval()
    model.model.rotary_emb = type(model.model.rotary_emb)(config).to(device)  # computed, not loaded
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.fill_(1.0) if name.endswith("norm.weight") else param.normal_(0.0, 0.02)
    return model


def random_drafter(target, fields: dict, device: torch.device, dtype: torch.dtype) -> DSparkDrafter:
    with torch.device(device):
        drafter = DSparkDrafter(DSparkConfig.for_target(target.config, **fields), target)
    attach_to_target(target)
    return drafter.to(dtype).eval()


@torch.no_grad()
def draft_pass_ms(drafter, target, runs: int) -> tuple[float, float]:
    """(first call, median of the next `runs`) in ms: one draft pass after a 256-token context."""
    device, context = drafter.device, verify_costs.CONTEXT
    ids = torch.randint(0, drafter.config.vocab_size, (1, context + 1), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    hidden = target(ids[:, :context], output_hidden_states=True).hidden_states
    cache = ContextCache(context + drafter.config.block_size)
    layers = [hidden[i] for i in drafter.config.hidden_state_indices]
    cache.append(drafter.context_kv(layers, torch.arange(context, device=device)[None]))
    draft_ids = drafter.draft_token_ids()

    def run():
        chooser = DraftTokenChooser(ids[:, :context], None, False, drafter.config.vocab_size, draft_ids)
        drafter.draft(ids[0, context:], context, cache, chooser)

    first = timed(run, device)
    return first * 1000, statistics.median(timed(run, device) for _ in range(runs)) * 1000


def syncs_counted(run) -> int:
    """Device syncs during `run()`, as CUDA's sync debug mode reports them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def decoding(target, drafter, new_tokens: int, device: torch.device, report: Report, label: str) -> None:
    """Plain greedy decoding against DSpark with whole blocks verified every round, on one prompt."""
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, drafter.config.mask_token_id, (1, PROMPT_TOKENS), generator=generator).to(device)
    forced = dict(
        assistant_model=drafter, dspark_scheduler="threshold", dspark_ngram=False, assistant_confidence_threshold=0.0,
        num_assistant_tokens=drafter.config.num_draft_tokens,
    )

    def plain(tokens=new_tokens):
        return target.generate(prompt, max_new_tokens=tokens, do_sample=False)

    def dspark(tokens=new_tokens, sink=None):
        return target.generate(prompt, max_new_tokens=tokens, do_sample=False, dspark_rounds=sink, **forced)

    plain(), dspark()  # warm-up: kernels, the allocator, and a compiled draft pass for this call's cache size
    plain_seconds = timed(plain, device)
    rounds: list = []
    dspark_seconds = timed(lambda: dspark(sink=rounds), device)
    per_round = dspark_seconds / len(rounds)
    verify_whole_block = report.values.get("verify_ms", {}).get(str(drafter.config.num_draft_tokens + 1))
    draft = report.values.get(f"{label}draft_pass_ms")
    report.values[f"{label}decoding"] = {
        "new_tokens": new_tokens,
        "plain_tokens_per_s": round(new_tokens / plain_seconds, 2),
        "dspark_tokens_per_s": round(new_tokens / dspark_seconds, 2),
        "dspark_rounds": len(rounds),
        "dspark_ms_per_round": round(per_round * 1000, 3),
        "dspark_tokens_per_round": round(sum(len(r.committed_ids) for r in rounds) / len(rounds), 3),
        "verified_per_round": round(sum(r.num_verified for r in rounds) / len(rounds), 3),
        "accepted_per_round": round(sum(r.num_accepted for r in rounds) / len(rounds), 3),
        # what a round costs beyond its two device passes, each timed alone above: the host's share
        "host_ms_per_round": None if verify_whole_block is None or draft is None
        else round(per_round * 1000 - verify_whole_block - draft, 3),
    }
    if device.type == "cuda" and not label:
        sync_rounds: list = []
        dspark_syncs = syncs_counted(lambda: dspark(32, sync_rounds))
        plain_syncs = syncs_counted(lambda: plain(32))
        report.values["syncs"] = {
            "dspark_per_round": round(dspark_syncs / len(sync_rounds), 2),
            "plain_per_token": round(plain_syncs / 32, 2),
        }


def markdown(values: dict) -> str:
    lines = [f"# GPU check: {values.get('device_name')} ({values.get('size')}, {values.get('dtype')})", ""]
    lines += [f"torch {values.get('torch')}, transformers {values.get('transformers')}.", ""]
    verify = values.get("verify_ms")
    if verify:
        lines += ["| n | " + " | ".join(verify) + " |", "| --- |" + " --- |" * len(verify)]
        lines += ["| T_verify(n) ms | " + " | ".join(f"{ms:.2f}" for ms in verify.values()) + " |", ""]
    rows = [
        ("draft pass, eager (ms)", values.get("draft_pass_ms")),
        ("draft pass, compiled (ms)", values.get("compiled_draft_pass_ms")),
        ("compiling the draft pass (s)", values.get("compile_seconds")),
        ("dspark_hf glue per round, tiny pair (us)", values.get("glue_us_per_round")),
    ]
    for label in ("", "compiled_"):
        for key, value in (values.get(f"{label}decoding") or {}).items():
            rows.append((f"{label.replace('_', ' ')}{key.replace('_', ' ')}", value))
    for key, value in (values.get("syncs") or {}).items():
        rows.append((f"syncs {key.replace('_', ' ')}", value))
    lines += ["| measure | value |", "| --- | --- |"]
    lines += [f"| {name} | {'n/a' if value is None else value} |" for name, value in rows]
    if values.get("errors"):
        lines += ["", "Steps that failed:", ""] + [f"- {step}: {error}" for step, error in values["errors"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--toy", action="store_true", help="a tiny pair instead of Qwen3-8B's dimensions")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per decoding run (default 128; toy 16)")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled draft pass")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    new_tokens = args.new_tokens or (16 if args.toy else 128)
    runs = 3 if args.toy else 20
    report = Report(args.out)
    report.values.update(
        size="toy" if args.toy else "Qwen3-8B", dtype=args.dtype, torch=torch.__version__,
        transformers=__import__("transformers").__version__, python=platform.python_version(),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU",
    )
    print(f"[gpu_check] torch {torch.__version__}, transformers {report.values['transformers']}, {device}: "
          f"{report.values['device_name']}", file=sys.stderr, flush=True)
    torch.manual_seed(0)
    with report.step("models"):
        target = random_target(TOY if args.toy else QWEN3_8B, device, dtype)
        drafter = random_drafter(target, TOY_DRAFTER if args.toy else DEEPSPEC_8B, device, dtype)
        report.values["drafter_mib"] = round(sum(p.numel() * p.element_size() for p in drafter.parameters()) / 2**20)
    with report.step("verify"):
        verify = verify_costs.verify_milliseconds(target, VERIFY_LENGTHS, runs=runs)
        report.values["verify_ms"] = {str(n): round(ms, 3) for n, ms in verify.items()}
    with report.step("draft_pass"):
        report.values["draft_pass_ms"] = round(draft_pass_ms(drafter, target, runs)[1], 3)
    with report.step("decoding"):
        decoding(target, drafter, new_tokens, device, report, "")
    with report.step("glue"):
        tiny_target, tiny_drafter = round_overhead.tiny_pair()
        tiny_target.to(device), tiny_drafter.to(device)
        glue_us, _ = round_overhead.measure(tiny_target, tiny_drafter, do_sample=False, dspark_ngram=False)
        report.values["glue_us_per_round"] = round(glue_us, 1)
    if not args.no_compile:
        with report.step("compiled_draft_pass"):
            drafter.compile_draft()
            first, compiled = draft_pass_ms(drafter, target, runs)
            report.values["compile_seconds"] = round(first / 1000, 1)
            report.values["compiled_draft_pass_ms"] = round(compiled, 3)
        with report.step("compiled_decoding"):
            decoding(target, drafter, new_tokens, device, report, "compiled_")
    print(markdown(report.as_dict()))


if __name__ == "__main__":
    main()
