#!/usr/bin/env bash
# Sets up everything dpfy needs on a fresh Debian machine, idempotently:
#   - Debian's dataset-fashion-mnist package (the real Fashion-MNIST IDX files),
#   - a virtual environment in .venv with torch==2.13.0 (CPU: this machine's wheel; the library
#     itself accepts a range, see pyproject.toml) and dpfy installed editable with its extras:
#     all (plots, datasets, yaml), gpu (Triton: the fused noise kernel; the tests run it on the
#     CPU under TRITON_INTERPRET=1), test (pytest, hypothesis, Opacus as a test-only peer),
#     lint (ruff, mypy) and docs (MkDocs), which .ci/run uses,
#   - a C compiler (gcc), with which dpfy builds its Gaussian sampler on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=()
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || APT_PACKAGES+=(dataset-fashion-mnist)
command -v "${CC:-cc}" >/dev/null || APT_PACKAGES+=(gcc libc6-dev)
if [ ${#APT_PACKAGES[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${APT_PACKAGES[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# torch first and pinned, so nothing later resolves an open range to a CUDA build.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "is ignored" || true
.venv/bin/pip install -q --disable-pip-version-check -e ".[all,gpu,test,lint,docs]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import torch, dp_accounting, dpfy; from dpfy.noise import NoiseSource; \
print('dpfy setup ok: torch', torch.__version__, '| default noise:', NoiseSource().backend)"
