#!/usr/bin/env bash
# A SmolLM2 drafter from data made on one GPU, in one call of about 10 minutes on an H200:
#   1. the target writes its own prompts (dspark synthesize: math, code, chat and writing requests in equal shares),
#      none that DATA/prompts.jsonl.gz holds,
#   2. answers them greedily in big batches (dspark regenerate, shards of 4,096),
#   3. a DSpark drafter trains on them and DATA/train.jsonl.gz for a fixed number of steps: it continues INIT (a
#      drafter directory; default .gpu/init, the shipped drafter as scripts/gpu_pack.sh copies it, when there) or
#      starts fresh. DATA: default .gpu/data, the answers and prompts committed here, as gpu_pack.sh packs them;
#      DATA= (empty): none,
#   4. the drafter is written in safetensors shards of at most 16 MB, with the answer shards and logs.
#
#   bash scripts/gpu_drafter.sh OUT           # GPU: PROMPTS (default 102400) answers, STEPS (default 6000) steps
#   bash scripts/gpu_drafter.sh OUT --toy     # CPU, about a minute: the same steps at toy size (tests/test_gpu_drafter.py)
#
# The target must be on the machine: SmolLM2 converted into $DSPARK_HF_CACHE/SmolLM2-135M-Instruct (scripts/setup.sh
# makes it here), or TARGET=DIR. A GPU machine reaches no index, so scripts/gpu_pack.sh packs its GGUF in two parts,
# the drafter to continue and the data made here (.gpu/), and the wheels this needs beyond the image's (.whl/: gguf,
# transformers), for four calls; this joins the parts and converts them, and installs the wheels first. Sizes:
# PROMPTS, BATCH, STEPS, TRAIN_BATCH; LR (continued: 3e-4, fresh: 6e-4). Why continue by default: two passes over
# 100 k answers from scratch reach about the shipped drafter's τ on the scaling curve (docs/studies.md), while the
# shipped drafter already holds the passes it had.
# A call carries at most 64 MiB of working tree, and the tracked tree is past that (106 MB). For the calls,
# untrack what this does not read (answer shards, drafters: 2.5 MB stay) without committing:
#   git rm -r -q --cached data drafters src/dspark_hf/assets/smollm2_dspark/model.safetensors
#   printf '/data/\n/drafters/\n/src/dspark_hf/assets/smollm2_dspark/model.safetensors\n' >> .git/info/exclude
# and afterwards `git reset -q` and drop those three lines from .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_drafter.sh OUT [--toy]}
toy=${2:-}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
python=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
dspark() { "$python" -m dspark_hf.tools.cli "$@"; }
target=${TARGET:-smollm2}
if [ "$target" = smollm2 ] && [ -f .gpu/smollm2.gguf.part0 ]; then  # scripts/gpu_pack.sh's parts, in order
  cat .gpu/smollm2.gguf.part* > /tmp/smollm2.gguf
  "$python" -c "import sys; from dspark_hf.tools.targets import ensure_smollm2; ensure_smollm2(gguf=sys.argv[1])" \
      /tmp/smollm2.gguf
fi
if [ "$toy" = --toy ]; then
  prompts=${PROMPTS:-4} batch=${BATCH:-4} steps=${STEPS:-2} train_batch=${TRAIN_BATCH:-2} new_tokens=16
  device=(--device cpu --threads 1) dtype=float32 synth_batch=16 shard=2
else
  prompts=${PROMPTS:-102400} batch=${BATCH:-2048} steps=${STEPS:-6000} train_batch=${TRAIN_BATCH:-32} new_tokens=256
  device=(--device cuda) dtype=bfloat16 synth_batch=4096 shard=4096
fi
mkdir -p "$out"
started=$(date +%s)
stamp() { echo "{\"stage\": \"$1\", \"seconds\": $(( $(date +%s) - started ))}" | tee -a "$out/stages.jsonl"; }

data=${DATA-$( [ -d .gpu/data ] && echo .gpu/data || true )}
earlier=() exclude=()
[ -z "$data" ] || earlier=("$data/train.jsonl.gz") exclude=(--exclude "$data/prompts.jsonl.gz")
dspark synthesize --target "$target" --dtype "$dtype" "${device[@]}" --out "$out/prompts.jsonl" --count "$prompts" \
    --kinds math code chat writing --batch-size "$synth_batch" --temperature 0.9 --top-p 0.95 "${exclude[@]}" \
    | tee "$out/synthesize.json"
stamp synthesize
dspark regenerate --target "$target" --dtype "$dtype" "${device[@]}" --prompts "$out/prompts.jsonl" \
    --out "$out/answers" --shard-size "$shard" --batch-size "$batch" --max-new-tokens "$new_tokens" | tee "$out/regenerate.json"
stamp regenerate
init=${INIT-$( [ -f .gpu/init/config.json ] && echo .gpu/init || true )}  # INIT= (empty): fresh
if [ -n "$init" ]; then  # its draft vocabulary and shape are kept
  start=(--init-from "$init") lr=${LR:-3e-4}
else
  start=(--layers 2 --block-size 7 --draft-vocab 8192) lr=${LR:-6e-4}
fi
dspark train --target "$target" --dtype "$dtype" "${device[@]}" --data "$out/answers" "${earlier[@]}" --out "$out/run" \
    "${start[@]}" --loss-vocab responses --max-steps "$steps" --batch-size "$train_batch" --anchors 32 --lr "$lr" \
    --warmup-steps $(( steps / 20 + 1 )) --save-every 1000 --save-dtype bf16 | tee "$out/train.json"
stamp train
"$python" - "$target" "$out" <<'EOF'
import sys, pathlib
import torch
from dspark_hf import DSparkDrafter
from dspark_hf.tools.targets import load_target
target, _ = load_target(sys.argv[1], tokenizer=False)
out = pathlib.Path(sys.argv[2])
drafter = DSparkDrafter.from_pretrained(out / "run", target)
drafter.save_pretrained(out / "drafter", dtype=torch.bfloat16, max_shard_size="16MB")
print(sorted(path.name for path in (out / "drafter").iterdir()))
EOF
stamp done
