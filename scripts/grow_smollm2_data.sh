#!/usr/bin/env bash
# Grows SmolLM2's training answers in the background, a few shards at a time: the target writes more of its
# own prompts (dspark synthesize), then answers them greedily (dspark regenerate), one single-thread process
# per core on alternate shards (processes scale better than threads for a 135M model). Both steps resume, so
# killing this and starting it again loses at most one batch per process. Answers go to a folder per dtype (the
# `auto` dtype of this machine: bf16 with native bf16 matmuls, fp32 without): data/smollm2/magpie for bf16,
# data/smollm2/magpie_fp32 for fp32; a prompt range already answered in either folder is not answered again.
# Usage: bash scripts/grow_smollm2_data.sh [PROMPTS]   (WORKERS=2 processes by default; a round: ~14 min on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/.."
dspark=${DSPARK:-.venv/bin/dspark}  # DSPARK: another checkout's command, so edits here cannot break a long run
workers=${WORKERS:-2}
shard=256
step=1024         # four shards per round
prompts=data/smollm2/magpie_prompts.jsonl.gz
python=$(dirname "$dspark")/python
dtype=${DTYPE:-$($python -c 'from dspark_hf.tools.targets import resolve_dtype; print(str(resolve_dtype("auto")).removeprefix("torch."))')}
answers=data/smollm2/magpie$( [ "$dtype" = bfloat16 ] || echo "_${dtype/float/fp}" )
have=$( [ -f $prompts ] && zcat $prompts | wc -l || echo 0 )
goal=${1:-$(( (have / step + 1) * step ))}  # prompts in all, a multiple of the round; unset: one round more
first=$(( have > 0 ? (have + step - 1) / step * step : step ))  # a round cut short (prompts written, answers not) is finished first
for ((count = first; count <= goal; count += step)); do
  $dspark synthesize --target smollm2 --dtype auto --threads "$workers" --out $prompts --count $count \
      --temperature 0.9 --top-p 0.95 --batch-size 64
  todo=()  # shards no other folder holds (finished shards of this folder are skipped by regenerate itself)
  for ((index = 0; index < count / shard; index++)); do
    name=$(printf 'shard-%05d.jsonl.gz' $index)
    elsewhere=0
    for folder in data/smollm2/magpie*/; do
      [ "${folder%/}" != "$answers" ] && [ -f "$folder$name" ] && elsewhere=1
    done
    [ $elsewhere = 1 ] || todo+=($index)
  done
  for ((worker = 0; worker < workers; worker++)); do
    mine=(); for ((i = worker; i < ${#todo[@]}; i += workers)); do mine+=(${todo[i]}); done
    [ ${#mine[@]} -gt 0 ] || continue
    OMP_NUM_THREADS=1 $dspark regenerate --target smollm2 --dtype "$dtype" --threads 1 --prompts $prompts \
        --out $answers --shard-size $shard --batch-size 64 --max-new-tokens 256 --max-prompt-tokens 512 \
        --shards "${mine[@]}" &
  done
  wait
done
