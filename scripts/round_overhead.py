"""Host time per drafting round spent in dspark_hf's glue, outside the draft pass, on a tiny random pair (CPU).

    OMP_NUM_THREADS=1 python scripts/round_overhead.py            # this checkout
    git worktree add /tmp/before <rev> && OMP_NUM_THREADS=1 PYTHONPATH=/tmp/before/src python scripts/round_overhead.py

On a tiny pair the models take microseconds, so what the round costs beyond them is the
glue a GPU would wait on: get_candidates + update_candidate_strategy minus the drafter's
own passes (the draft pass, and the context keys/values of the committed tokens). Prints medians over calls of the per-round mean, in microseconds, greedy and sampled,
with the draft pass beside it.
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from dspark_hf import DSparkConfig, DSparkDrafter
from dspark_hf.core import generation

VOCAB, ROUNDS_PER_CALL = 512, 48


def tiny_pair():
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )).eval()
    config = DSparkConfig.for_target(
        target.config, num_hidden_layers=1, target_layer_ids=[0, 2], block_size=8, mask_token_id=VOCAB - 1,
        markov_rank=16, markov_head_type="vanilla", enable_confidence_head=True, confidence_head_with_markov=True,
    )
    drafter = DSparkDrafter(config, target).eval()
    generation.attach_to_target(target)
    return target, drafter


def measure(target, drafter, **sampling) -> tuple[float, float]:
    spent = {"glue": [], "draft": []}
    generator_class = generation.DSparkCandidateGenerator
    get_candidates, update = generator_class.get_candidates, generator_class.update_candidate_strategy
    draft, context_kv = drafter.draft, drafter.context_kv

    def timed(key, function):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[key].append(time.perf_counter() - started)
        return run

    generator_class.get_candidates = timed("glue", get_candidates)
    generator_class.update_candidate_strategy = timed("glue", update)
    drafter.draft = timed("draft", draft)
    drafter.context_kv = timed("draft", context_kv)
    try:
        per_round = []
        for seed in range(6):
            prompt = torch.randint(0, VOCAB - 1, (1, 64), generator=torch.Generator().manual_seed(seed)).to(target.device)
            spent["glue"].clear(), spent["draft"].clear()
            target.generate(prompt, max_new_tokens=ROUNDS_PER_CALL, assistant_model=drafter,
                            dspark_scheduler="threshold", assistant_confidence_threshold=0.0, **sampling)
            rounds = len(spent["glue"]) // 2
            per_round.append(((sum(spent["glue"]) - sum(spent["draft"])) / rounds, sum(spent["draft"]) / rounds))
        glue, draft_pass = zip(*per_round[1:])  # the first call warms up
        return statistics.median(glue) * 1e6, statistics.median(draft_pass) * 1e6
    finally:
        generator_class.get_candidates, generator_class.update_candidate_strategy = get_candidates, update
        del drafter.draft, drafter.context_kv


def main() -> None:
    target, drafter = tiny_pair()
    extra = {"dspark_ngram": False} if "dspark_ngram" in generation.SCHEDULER_FIELDS else {}
    greedy = measure(target, drafter, do_sample=False, **extra)
    sampled = measure(target, drafter, do_sample=True, temperature=0.8, **extra)
    print(f"per round (CPU, {torch.get_num_threads()} thread(s)), glue / the drafter's passes: "
          f"greedy {greedy[0]:.0f} / {greedy[1]:.0f} us, sampled {sampled[0]:.0f} / {sampled[1]:.0f} us")


if __name__ == "__main__":
    main()
