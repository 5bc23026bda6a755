#!/usr/bin/env bash
# Download, here (where PyPI is reachable), the wheels that benchmarks/gpu_check.sh carries to a GPU
# machine with no network: the pure-Python dependencies batchlab's base install needs that the
# machine's image lacks (see /work/.library/device/KINDS.md: it has numpy, pandas, PyYAML, click,
# rich, matplotlib, markdown-it-py, torch, transformers, tokenizers, psutil, pytest, but no pydantic).
# pydantic-core is compiled: the platform tags below match the machine (CPython 3.12, x86-64, glibc).
# typing-extensions travels too, so pydantic-core's minimum is met whatever the image holds.
# Versions: the ones this project's venv runs. Output: .whl/ (git-ignored), ~2.5 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0)
rm -rf .whl && mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
ls -l .whl
