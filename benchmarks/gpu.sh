#!/usr/bin/env bash
# The GPU check in one command (one GPU, about 5-8 minutes on an H100): dpfy's CUDA tests, then
# step time and peak memory against non-private training and Opacus, and the noise generator's
# speed, as one markdown table; then the main job's recipe against Opacus (about a minute).
# Run from anywhere; extra arguments go to benchmarks/gpu.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
PYTHONPATH=src "$PYTHON" benchmarks/gpu.py "$@"
# The main job's recipe (tanh CNN, Fashion-MNIST, batch 2048, 10 epochs) against Opacus, same loop.
PYTHONPATH=src "$PYTHON" benchmarks/gpu_main_job.py
