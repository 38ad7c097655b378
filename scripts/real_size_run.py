"""A Qwen3 target at its full published size, a DSpark drafter loaded by repo id, the default generate() path.

tests/test_real_size.py checks every layout at Qwen3's real shapes, but with a narrow MLP, one set of weights
shared by all 36 layers, float32 and the threshold scheduler, so that CI can afford it. This runs what a user
runs: every target layer its own, the published MLP width, bfloat16, and `generate(assistant_model=drafter)`
with the drafter's defaults (the `auto` scheduler, which profiles this machine on the first call, and hybrid
n-gram drafting). The weights are random (tests/test_real_size.py's recipe: varied greedy text, and a Markov
head set to the target's own successors so that drafts survive), written in the huggingface_hub cache layout
and read with `local_files_only`. It prints one JSON report: the drafter's own memory and what loading it added,
load and profiling time, the cost table, tokens per second of plain decoding, of the defaults and of DSpark
blocks alone (each timed after a first drafted call, between two plain runs), tau, where each drafted output
first leaves plain decoding (with plain's top-2 margin there), and whether the drafter exported in the
speculators and DeepSpec layouts, read back, proposes the same drafts.

    python scripts/real_size_run.py --size 8b --threads 2     # about 20 GB of memory; nothing else running

The DeepSpec checkpoint is written without its copies of the embedding and LM head (they would not fit in
memory beside an 8B target while the file is written); the test covers reading them, at 4B.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_real_size as shapes  # noqa: E402  (the published configs and the checkpoint writer, kept in one place)

from dspark_hf import DSparkDrafter, summarize  # noqa: E402
from dspark_hf.tools.bench import cpu_identity  # noqa: E402
from dspark_hf.tools.exactness import find_divergence  # noqa: E402

LAYOUTS = {"4b": "deepseek-ai/dspark_qwen3_4b_block7", "8b": "deepseek-ai/dspark_qwen3_8b_block7"}


def full_target(published: dict, dtype: torch.dtype):
    """The published Qwen3 at full size in `dtype`, each layer its own weights, built on the meta device."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**published)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config).to(dtype)
    model = model.to_empty(device="cpu")
    model.model.rotary_emb = type(model.model.rotary_emb)(config)  # its buffers are computed, not loaded
    model.tie_weights()
    shapes.fill_target(model.eval(), torch.Generator().manual_seed(0))
    return model


def timed_generate(target, prompt, new_tokens, **kwargs):
    started = time.perf_counter()
    out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                          do_sample=False, **kwargs)
    return out, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(LAYOUTS), default="8b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    target = full_target(shapes.TARGETS[args.size], torch.bfloat16)
    build_seconds = time.perf_counter() - started
    prompt = torch.randint(0, 151643, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(1))
    timed_generate(target, prompt[:, :8], 2)  # warm-up
    plain, plain_seconds = timed_generate(target, prompt, args.new_tokens)
    plain_new = plain[0, prompt.shape[1]:].tolist()

    repo_id = LAYOUTS[args.size]
    layout = next(layout for layout in shapes.LAYOUTS if layout.repo_id == repo_id)
    layout = dataclasses.replace(layout, copies=False)
    with tempfile.TemporaryDirectory() as hub:
        snapshot = shapes.hub_snapshot(Path(hub), repo_id)
        shapes.write_checkpoint(snapshot, layout, target, shapes.successors(prompt, plain))
        before = shapes.resident_bytes()
        started = time.perf_counter()
        drafter = DSparkDrafter.from_pretrained(repo_id, target, cache_dir=hub, local_files_only=True)
        load_seconds = time.perf_counter() - started
        _, first_seconds = timed_generate(target, prompt, args.new_tokens, assistant_model=drafter)  # profiles
        runs, drafts = {}, None  # the defaults, and DSpark blocks alone (n-gram rounds can take all of random text)
        for name, options in (("defaults", {}), ("dspark_only", {"dspark_ngram": False})):
            out, seconds = timed_generate(target, prompt, args.new_tokens, assistant_model=drafter, **options)
            rounds = list(drafter.last_trace)
            new = out[0, prompt.shape[1]:].tolist()
            divergence = find_divergence(target, prompt[0].tolist(), plain_new, new)
            runs[name] = {
                "tok_s": len(new) / seconds, "tau": round(summarize(rounds).tau, 2), "rounds": len(rounds),
                "accepted_by_source": {source: sum(r.num_accepted for r in rounds if r.source == source)
                                       for source in sorted({r.source for r in rounds})},
                "divergence": None if divergence is None else dataclasses.asdict(divergence),
            }
            if name == "dspark_only":  # what the exports must propose too: the tokens (the Markov head set them
                # here) and their confidences (which read the target's features through every draft layer)
                drafts = [(r.draft_ids, r.confidences) for r in rounds]
        _, plain_after_seconds = timed_generate(target, prompt, args.new_tokens)  # plain again: the two bracket them
        plain_rate = len(plain_new) / ((plain_seconds + plain_after_seconds) / 2)
        added = shapes.resident_bytes() - before
        own = sum(shapes.storages([*drafter.parameters(), *drafter.buffers()]).values())
        table = drafter.cost_table  # what the first call measured
        report = {
            "cpu": cpu_identity(), "threads": args.threads, "layout": repo_id, "dtype": "bfloat16",
            "target_parameters_billion": round(sum(p.numel() for p in target.parameters()) / 1e9, 2),
            "build_s": round(build_seconds, 1), "drafter_load_s": round(load_seconds, 1),
            "drafter_own_gib": round(own / 2**30, 2), "drafter_added_gib": round(added / 2**30, 2),
            "peak_resident_gib": round(shapes.resident_bytes() / 2**30, 2),
            "t_verify_ms": {n: round(table.verify(n) * 1000) for n in (1, 2, 4, 8) if n <= len(table.verify_seconds)},
            "t_draft_ms": round(table.draft_seconds * 1000), "first_drafted_call_s": round(first_seconds, 1),
            "plain_tok_s": round(plain_rate, 2),
        }
        for name, run in runs.items():
            report[name] = {**run, "tok_s": round(run["tok_s"], 2), "speed_up": round(run["tok_s"] / plain_rate, 2)}
        # What the serving engines read (vLLM speculators, SGLang / DeepSpec): written, read back, the same drafts
        # round by round (the outputs would match anyway: verification keeps them the target's).
        formats = ("speculators", "deepspec")
        for name in formats:
            drafter.save_pretrained(Path(hub) / name, format=name)
        del drafter
        report["exports_draft_the_same"] = {}
        for name in formats:
            exported = DSparkDrafter.from_pretrained(Path(hub) / name, target)
            exported.cost_table = table
            timed_generate(target, prompt, args.new_tokens, assistant_model=exported, dspark_ngram=False)
            report["exports_draft_the_same"][name] = [(r.draft_ids, r.confidences) for r in exported.last_trace] == drafts
            del exported
    print(json.dumps(report))


if __name__ == "__main__":
    main()
