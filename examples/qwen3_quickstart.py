"""DSpark on Qwen3-4B: the same greedy output as plain generate(), in fewer target passes.

    python examples/qwen3_quickstart.py                                  # DeepSpec DSpark drafter
    python examples/qwen3_quickstart.py --drafter z-lab/Qwen3-4B-DFlash-b16   # z-lab DFlash drafter
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark_hf import DSparkDrafter, summarize

parser = argparse.ArgumentParser()
parser.add_argument("--target", default="Qwen/Qwen3-4B")
parser.add_argument("--drafter", default="deepseek-ai/dspark_qwen3_4b_block7")
parser.add_argument("--prompt", default="Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                    "clips in May. How many clips did Natalia sell altogether in April and May?")
parser.add_argument("--max-new-tokens", type=int, default=256)
args = parser.parse_args()

tokenizer = AutoTokenizer.from_pretrained(args.target)
target = AutoModelForCausalLM.from_pretrained(args.target, dtype="auto", device_map="auto")
drafter = DSparkDrafter.from_pretrained(args.drafter, target)  # shares target's embedding and LM head

messages = [{"role": "user", "content": args.prompt}]
inputs = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True, enable_thinking=False, return_tensors="pt", return_dict=True
).to(target.device)

start = time.perf_counter()
plain = target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
plain_seconds = time.perf_counter() - start

start = time.perf_counter()
fast = target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False, assistant_model=drafter)
fast_seconds = time.perf_counter() - start

# In fp32 the two are identical. In bf16 a batched verify rounds differently from one token at a
# time, so a near-tie can flip a token, as in transformers' own assisted decoding.
if torch.equal(plain, fast):
    print("identical to plain generate()")
else:
    pairs = zip(plain[0].tolist(), fast[0].tolist())
    first = next((i for i, (a, b) in enumerate(pairs) if a != b), min(plain.shape[1], fast.shape[1]))
    print(f"differs from plain generate() from token {first} on ({target.dtype} near-tie; use dtype=torch.float32 to compare)")
summary = summarize(drafter.last_trace)
print(tokenizer.decode(fast[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
print(f"tau={summary.tau:.2f}  plain {plain_seconds:.2f}s  dspark {fast_seconds:.2f}s  "
      f"speed-up {plain_seconds / fast_seconds:.2f}x")
