"""DSpark on Qwen3-4B: the same greedy output as plain generate(), in fewer target passes.

    python examples/qwen3_quickstart.py                                  # DeepSpec DSpark drafter
    python examples/qwen3_quickstart.py --drafter z-lab/Qwen3-4B-DFlash-b16   # z-lab DFlash drafter
"""

import argparse
import os
import socket
import sys
import time
from urllib.parse import urlparse

from huggingface_hub import constants
from transformers import AutoModelForCausalLM, AutoTokenizer

from dspark_hf import CheckpointError, DSparkDrafter, summarize
from dspark_hf.core.costs import profile_costs
from dspark_hf.tools.exactness import find_divergence
from dspark_hf.tools.targets import check_local_path

LOCAL = "pass local directories: --target DIR --drafter DIR"


def hub_reachable() -> bool:
    """A 3-second probe, so that an offline machine fails at once instead of after a minute of retries."""
    endpoint = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=3).close()
        return True
    except OSError:
        return False


parser = argparse.ArgumentParser()
parser.add_argument("--target", default="Qwen/Qwen3-4B")
parser.add_argument("--drafter", default="deepseek-ai/dspark_qwen3_4b_block7")
parser.add_argument("--prompt", default="Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                    "clips in May. How many clips did Natalia sell altogether in April and May?")
parser.add_argument("--max-new-tokens", type=int, default=256)
args = parser.parse_args()

try:  # a path that does not exist is named as such, not looked up on the Hub
    check_local_path(args.target, "--target")
    check_local_path(args.drafter, "--drafter")
except CheckpointError as error:
    sys.exit(str(error))
remote = [name for name in (args.target, args.drafter) if not os.path.isdir(name)]
if remote and not constants.HF_HUB_OFFLINE and not hub_reachable():
    sys.exit(f"{constants.ENDPOINT} is unreachable and {' and '.join(remote)} not local: set HF_HUB_OFFLINE=1 to "
             f"use copies already in the Hugging Face cache, or {LOCAL}.")
try:
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype="auto", device_map="auto")
    drafter = DSparkDrafter.from_pretrained(args.drafter, target)  # shares target's embedding and LM head
except (OSError, CheckpointError) as error:
    offline = "HF_HUB_OFFLINE is set, so only the Hugging Face cache is read" if constants.HF_HUB_OFFLINE else ""
    sys.exit(f"{str(error).splitlines()[0]} ({offline or 'HF_HUB_OFFLINE=1 reads only the cache'}; or {LOCAL})")

messages = [{"role": "user", "content": args.prompt}]
inputs = tokenizer.apply_chat_template(
    messages, add_generation_prompt=True, enable_thinking=False, return_tensors="pt", return_dict=True
).to(target.device)

profile_costs(drafter)  # the scheduler's one-off timing of this machine, kept out of the comparison below
start = time.perf_counter()
plain = target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
plain_seconds = time.perf_counter() - start

start = time.perf_counter()
fast = target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False, assistant_model=drafter)
fast_seconds = time.perf_counter() - start

# In fp32 the two are identical. In bf16 a batched verify rounds differently from one token at a
# time, so a near-tie can flip a token, as in transformers' own assisted decoding.
prompt_length = inputs["input_ids"].shape[1]
divergence = find_divergence(target, inputs["input_ids"][0].tolist(), plain[0, prompt_length:].tolist(),
                             fast[0, prompt_length:].tolist())
if divergence is None:
    print("identical to plain generate()")
else:
    print(f"differs from plain generate() from token {divergence.index} on, where plain decoding's top two logits "
          f"were {divergence.margin:.3g} apart ({divergence.steps:.1f} bf16 steps; {target.dtype})")
summary = summarize(drafter.last_trace)
print(tokenizer.decode(fast[0, prompt_length:], skip_special_tokens=True))
print(f"tau={summary.tau:.2f}  plain {plain_seconds:.2f}s  dspark {fast_seconds:.2f}s  "
      f"speed-up {plain_seconds / fast_seconds:.2f}x")
