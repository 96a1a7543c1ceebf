#!/usr/bin/env bash
# The GPU check: the CUDA test suite and a short CUDA benchmark, results in one folder.
#
#   scripts/gpu-check.sh [OUT_DIR]        (default: gpu-check/)
#
# Runs where torch sees a CUDA GPU, within ~10 minutes: (1) `pytest -m cuda` (fidelity
# against Meta's code on the GPU, every mode and CUDA backend, AMG, the service), (2)
# `sam2serve bench --device cuda` for SPS/MPS/AMG in baseline, fast, furious and
# furious+compile on the tiny model with random weights. It installs what it needs: with
# a network, from the package index; without one (a sealed GPU machine), from wheels in
# .whl/ beside this repository (download them on a connected machine with
# `scripts/gpu-check.sh --download-wheels`), into /tmp/gpu-check-site. The machine's own
# CUDA build of torch is used as it is: never reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the suite needs beyond torch, numpy, scipy, scikit-image, pillow, tqdm, httpx,
# prometheus-client and pyyaml (present on the usual CUDA images).
NEEDED=(fastapi starlette pydantic pydantic-core annotated-types typing-inspection
        uvicorn h11 python-multipart hydra-core omegaconf antlr4-python3-runtime iopath
        portalocker pycocotools)

if [ "${1:-}" = "--download-wheels" ]; then
    mkdir -p .whl
    python3 -m pip download --only-binary=:all: --no-deps --python-version 3.12 \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 -d .whl "${NEEDED[@]}"
    python3 -m pip download --no-deps --no-binary=:all: -d .whl sam2==1.1.0
    echo "wheels in .whl/: carry them to the GPU machine with the repository"
    exit 0
fi

OUT=${1:-gpu-check}
mkdir -p "$OUT"
python3 - <<'PY' | tee "$OUT/device.txt"
import torch
assert torch.cuda.is_available(), "torch sees no CUDA GPU: nothing to check here"
props = torch.cuda.get_device_properties(0)
print(f"device: {props.name}, {props.total_memory / 2**30:.0f} GiB, "
      f"capability {props.major}.{props.minor}; torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, bf16 {torch.cuda.is_bf16_supported()}")
PY

SITE=/tmp/gpu-check-site
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl
    # Meta's sam2 (the oracle) is a source package: built against the torch already here.
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" \
        .whl/sam2-1.1.0.tar.gz || echo "sam2 did not build: the fidelity tests will skip"
else
    python3 -m pip install -q --target "$SITE" "${NEEDED[@]}"
    python3 -m pip install -q --no-deps --no-build-isolation --target "$SITE" sam2==1.1.0 \
        || echo "sam2 did not install: the fidelity tests will skip"
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

set +e
python3 -m pytest -q -m cuda tests/cuda -p no:cacheprovider 2>&1 | tee "$OUT/cuda-tests.txt"
tests=${PIPESTATUS[0]}
timeout 420 python3 -m sam2serve bench --device cuda --task all --model tiny \
    --modes baseline,fast,furious,furious+compile --images samples --n 3 \
    --random-weights --points-per-side 16 --out "$OUT" --name bench_tiny_cuda 2>&1 \
    | tee "$OUT/bench.txt"
bench=${PIPESTATUS[0]}
set -e
echo "cuda tests exit $tests, bench exit $bench; results in $OUT/"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
