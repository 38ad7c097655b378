#!/usr/bin/env bash
# Grows SmolLM2's training answers in the background, a few shards at a time: the target writes more of its
# own prompts (dspark synthesize), then answers them greedily (dspark regenerate). Both resume, so killing
# this and starting it again loses at most one batch. Usage: bash scripts/grow_smollm2_data.sh [PROMPTS]
set -euo pipefail
cd "$(dirname "$0")/.."
dspark=${DSPARK:-.venv/bin/dspark}  # DSPARK: another checkout's command, so edits here cannot break a long run
goal=${1:-12288}  # prompts in all, a multiple of the shard size
step=768          # three shards of 256 per round
prompts=data/smollm2/magpie_prompts.jsonl
have=$( [ -f $prompts ] && wc -l < $prompts || echo 0 )
for ((count = (have / step + 1) * step; count <= goal; count += step)); do
  $dspark synthesize --target smollm2 --dtype auto --threads 1 --out $prompts --count $count \
      --temperature 0.9 --top-p 0.95 --batch-size 64
  $dspark regenerate --target smollm2 --dtype auto --threads 1 --prompts $prompts --out data/smollm2/magpie \
      --shard-size 256 --batch-size 64 --max-new-tokens 256 --max-prompt-tokens 512
done
