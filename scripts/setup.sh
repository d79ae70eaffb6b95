#!/usr/bin/env bash
# Sets up everything dpfy needs on a fresh Debian machine, idempotently:
#   - Debian's dataset-fashion-mnist package (the real Fashion-MNIST IDX files),
#   - a virtual environment in .venv with torch==2.13.0 (CPU) and dpfy installed editable,
#     with the test extras (pytest, hypothesis, and Opacus as a test-only peer).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# torch first and pinned, so nothing later resolves an open range to a CUDA build.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "is ignored" || true
.venv/bin/pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import torch, dp_accounting, dpfy; print('dpfy setup ok: torch', torch.__version__)"
