#!/usr/bin/env bash
# Packs, here, what scripts/gpu_drafter.sh needs on a GPU machine that reaches no package index, sized for three calls
# of at most 64 MiB each: the target's exact source, SmolLM2's GGUF (98 MB, from the PyPI wheel setup.sh converts),
# cut into .gpu/smollm2.gguf.part0 (56 MiB) and .part1 (38 MiB), and the wheels of gguf and of this package's
# transformers in .whl/ (14 MB), and the shipped drafter for the run to continue in .gpu/init/ (34 MB). Both folders
# are kept out of git. The three calls, back to back (a machine stays warm for 30 s, and keeps the ignored files a
# call left):
#   1. carry [".gpu/smollm2.gguf.part0"], command `true`;
#   2. carry [".gpu/init"], command `true`;
#   3. carry [".gpu/smollm2.gguf.part1", ".whl"], command `bash scripts/gpu_drafter.sh $OUT/run`.
# gpu_drafter.sh joins the parts and converts them as setup.sh does. For the tree itself to fit, untrack what the
# GPU run does not need (gpu_drafter.sh's header says how).
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
mkdir -p .whl
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d .whl \
    "gguf==$("$python" -c 'import importlib.metadata as m; print(m.version("gguf"))')" \
    "transformers==$("$python" -c 'import transformers; print(transformers.__version__)')"
ls -l .gpu .whl
