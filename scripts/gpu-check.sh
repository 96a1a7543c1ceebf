#!/usr/bin/env bash
# The GPU check: the CUDA test suite and a short CUDA benchmark, results in one folder.
#
#   scripts/gpu-check.sh [--part tests|bench|compile|tracker|tracker-meta|blog|blog-compile|coldstart|aoti|concepts|concepts-device|decode|all]
#                        [--dry-run] [OUT_DIR]
#                                                        (default: all, gpu-check/)
#   scripts/gpu-check.sh --download-wheels                      (on a connected machine)
#   scripts/gpu-check.sh --download-decode-wheels               (the same, for --part decode)
#
# Runs where torch sees a CUDA GPU, in parts that each fit one 10-minute call on an H100:
#   tests    `pytest -m cuda tests/cuda`: fidelity against Meta's code on the GPU, every
#            mode and CUDA backend, host syncs in the decode loop and in AMG, the service;
#   bench    `sam2serve bench --device cuda`, SPS/MPS/AMG in baseline, fast and furious on
#            the tiny model with random weights, AMG also with keep-all thresholds, and
#            `--task video` (8 frames of the sample clip, 1 and 3 objects; furious in bf16)
#            against Meta's video predictor;
#   compile  furious against furious+compile (torch.compile) on SPS.
#   tracker  the compiled tracker (backend compile: static memory banks, torch.compile
#            max-autotune) against eager fast and furious, tiny, 1/3/8 objects
#            (scripts/tracker_compile_bench.py; each row its own process; p50 over the
#            frames after the 8 warm-up ones); tracker-meta: Meta's eager
#            SAM2VideoPredictor and vos_optimized SAM2VideoPredictorVOS, the same way (a
#            part of its own: vos_optimized compiles the image encoder too). Not yet run. `--part tracker --dry-run` runs it on the CPU
#            (1 object, fast and fast+compile, 12 frames) to check the plumbing.
#   blog     the published experiment's configuration ("SAM2 - fast and furious"): the
#            large model, AMG at Meta's 32 x 32 grid (default and keep-all thresholds),
#            SPS and MPS, baseline against furious (eager);
#   blog-compile  the same with furious+compile (torch.compile compiles the large image
#            path in every process: minutes).
#   coldstart  the compile cache: large furious+compile, start -> first answer with an
#            empty compile cache and then from the cache the first process wrote
#            (scripts/coldstart.py; the target is <= 10 s from the cache on an H100);
#            the cuda test test_compile_cache_on_cuda (part tests) checks hits and answers.
#   concepts SAM 3 concept prompts, full size, random weights: one image, 1 and 10
#            phrases on one encoding, per stage, baseline (fp32) and furious (bf16
#            backbone) (`sam2serve bench --task concepts`; the CPU rows are in
#            bench/results/concepts_cpu_avx512vnni.md). Not yet run on a GPU.
#   concepts-device  SAM 3 on the GPU against the CPU (tests/cuda/test_concepts_cuda.py):
#            the reduced model, same weights, text only and with exemplar boxes (scores
#            1e-4, boxes 1e-2 px, < 0.1 % mask pixels), Meta's CUDA preprocessing, RoIAlign
#            without a host sync, and CUDA refusing the uint8 kernels the first tier's
#            DeviceGuard calls CPU-only (seconds; also part of --part tests). Not yet run
#            on a GPU.
#   aoti     where AOTInductor packages compiled for CUDA crash when loaded: a ladder of
#            probes from a one-layer package through torch's own loader to tiny's image
#            path (scripts/aoti_cuda_probe.py; each load in its own process).
#   decode   image decode on the device (nvImageCodec / nvJPEG, --image-decode device)
#            against the host (Pillow): p50 ms per photo, pixel differences, an SPS request
#            through the engine with each (scripts/decode_check.py), the cuda tests of
#            tests/cuda/test_device_decode_cuda.py, and SPS bench rows with each decode.
#            Its wheels (nvidia-nvimgcodec-cu13, nvidia-nvjpeg; no internet there) come
#            from $SAM2SERVE_DECODE_WHEELS (default .whl-decode/; fetch them on a connected
#            machine with --download-decode-wheels). `--part decode --dry-run` runs the
#            check on the CPU with the tests' fake nvImageCodec (the plumbing only).
# Artifacts are CPU-only (AOTInductor packages compiled for CUDA crashed when loaded, see
# runtime/backends), so no +artifacts row runs here. It installs what it needs: with a
# network, from the package index; without one (a sealed GPU machine), from wheels in
# .whl/ beside this repository (download them on a connected machine with
# --download-wheels), into /tmp/gpu-check-site. The machine's own CUDA build of torch is
# used as it is: never reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the suite needs beyond torch, numpy, scipy, scikit-image, pillow, tqdm, httpx,
# prometheus-client, pytest and pyyaml (present on the usual CUDA images). Pinned to the
# versions the CPU suite runs with.
NEEDED=(fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.4 pydantic-core==2.46.4
        annotated-types==0.7.0 typing-inspection==0.4.2 annotated-doc==0.0.7
        typing-extensions==4.16.0 uvicorn==0.54.0 h11==0.16.0 python-multipart==0.0.34
        fastapi-offline==1.7.7 hydra-core==1.3.8 omegaconf==2.3.1
        portalocker==4.4.2 pycocotools==2.0.11
        opentelemetry-api==1.45.2
        transformers==5.24.0 tokenizers==0.23.3 huggingface-hub==2.4.0 safetensors==0.8.0
        regex==2026.5.9 filelock==4.3.1 fsspec==2026.9.0)
# Source packages (no wheel exists): Meta's sam2 (the oracle), hydra's parser runtime, iopath.
SOURCES=(sam2==1.1.0 antlr4-python3-runtime==4.9.3 iopath==0.1.10)

DECODE_WHEELS=${SAM2SERVE_DECODE_WHEELS:-.whl-decode}
# nvImageCodec for CUDA 13 (torch here is a cu130 build) and the nvJPEG it loads, pinned to
# the versions checked; together about 28 MiB.
DECODE_PACKAGES=(nvidia-nvimgcodec-cu13==0.9.0.20 nvidia-nvjpeg==13.0.4.44)
if [ "${1:-}" = "--download-decode-wheels" ]; then
    mkdir -p "$DECODE_WHEELS"
    python3 -m pip download --only-binary=:all: --no-deps --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$DECODE_WHEELS" "${DECODE_PACKAGES[@]}"
    echo "wheels in $DECODE_WHEELS/: carry them to the GPU machine with the repository"
    exit 0
fi
if [ "${1:-}" = "--download-wheels" ]; then
    mkdir -p .whl
    python3 -m pip download --only-binary=:all: --no-deps --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl \
        "${NEEDED[@]}"
    python3 -m pip download --no-deps --no-build-isolation --no-binary=:all: -d .whl \
        "${SOURCES[@]}"
    echo "wheels in .whl/: carry them to the GPU machine with the repository"
    exit 0
fi

PART=all
if [ "${1:-}" = "--part" ]; then
    PART=$2
    shift 2
fi
case "$PART" in
    tests|bench|compile|tracker|tracker-meta|blog|blog-compile|coldstart|aoti|concepts|concepts-device|decode|all) ;;
    *) echo "--part: tests, bench, compile, tracker, tracker-meta, blog, blog-compile, coldstart, aoti, concepts, concepts-device, decode or all, not $PART" >&2
       exit 2;;
esac
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then
    DRY_RUN=1
    shift
fi
OUT=${1:-gpu-check}
mkdir -p "$OUT"
if [ "$DRY_RUN" = 1 ] && [ "$PART" = decode ]; then
    # The plumbing of --part decode on the CPU: the fake nvImageCodec, no installs.
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 900 python3 \
        scripts/decode_check.py --dry-run --out "$OUT/decode_dry_run.md"
    exit $?
fi
if [ "$DRY_RUN" = 1 ]; then
    # The plumbing of --part tracker on the CPU: no GPU, no installs.
    [ "$PART" = tracker ] || { echo "--dry-run runs --part tracker or decode only" >&2; exit 2; }
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 900 python3 \
        scripts/tracker_compile_bench.py --device cpu --objects 1 --rows fast,fast+compile \
        --frames 12 --out "$OUT/tracker_compile_dry_run.md"
    exit $?
fi
python3 - <<'PY' | tee -a "$OUT/device.txt"
import torch
assert torch.cuda.is_available(), "torch sees no CUDA GPU: nothing to check here"
props = torch.cuda.get_device_properties(0)
print(f"device: {props.name}, {props.total_memory / 2**30:.0f} GiB, "
      f"capability {props.major}.{props.minor}; torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, bf16 {torch.cuda.is_bf16_supported()}")
PY
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu \
    --format=csv >> "$OUT/device.txt" 2>&1 || true

SITE=/tmp/gpu-check-site
if [ ! -d "$SITE" ]; then
    # Meta's sam2 (the oracle) is a source package, built against the torch already here,
    # without its optional CUDA extension (a post-processing kernel the tests never use).
    export SAM2_BUILD_CUDA=0
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl
        python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" \
            .whl/*.tar.gz || echo "sam2 did not build: the fidelity tests will fail"
    else
        python3 -m pip install -q --target "$SITE" "${NEEDED[@]}"
        python3 -m pip install -q --no-deps --no-build-isolation --target "$SITE" \
            "${SOURCES[@]}" || echo "sam2 did not install: the fidelity tests will fail"
    fi
fi
if [ "$PART" = decode ] || [ "$PART" = all ]; then
    # nvImageCodec and nvJPEG beside the suite's packages, from the carried wheels (else,
    # with a network, from the index).
    if [ -d "$DECODE_WHEELS" ] && ls "$DECODE_WHEELS"/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --target "$SITE" "$DECODE_WHEELS"/*.whl \
            || echo "the decode wheels did not install: device decode will be unavailable"
    else
        python3 -m pip install -q --no-deps --target "$SITE" "${DECODE_PACKAGES[@]}" \
            || echo "no $DECODE_WHEELS/ and no index: device decode will be unavailable"
    fi
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

failed=0
bench() {  # NAME TASK MODES [EXTRA FLAGS...]: one benchmark run, its output in $OUT
    local name=$1 task=$2 modes=$3
    shift 3
    uptime | tee -a "$OUT/load.txt"
    # --model tiny unless the extra flags name another (argparse keeps the last).
    timeout 560 python3 -m sam2serve bench --device cuda --task "$task" --model tiny \
        --modes "$modes" --random-weights --out "$OUT" --name "$name" "$@" 2>&1 \
        | tee "$OUT/$name.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
}
# The blog's rows: the large model on the sample photos, AMG at Meta's 32 x 32 grid.
BLOG=(--model large --images samples --n 4 --amg-variants default,keep-all)
IMAGES=(--images samples --n 3 --points-per-side 16)
set +e
if [ "$PART" = tests ] || [ "$PART" = all ]; then
    timeout 560 python3 -m pytest -q -s -m cuda tests/cuda -p no:cacheprovider \
        --durations=10 2>&1 | tee "$OUT/cuda-tests.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [ "$PART" = bench ] || [ "$PART" = all ]; then
    bench bench_tiny_cuda all baseline,fast,furious "${IMAGES[@]}"
    # Random weights pass almost no mask through AMG's default filters: with them at 0
    # every mask is upscaled, scored, de-duplicated and encoded.
    bench bench_tiny_cuda_amg_keepall amg baseline,fast,furious "${IMAGES[@]}" \
        --pred-iou-thresh 0 --stability-score-thresh 0
    # Tracking: 8 rows (4 modes x 2 object counts), each a fresh process (not yet run on a
    # GPU: expected well under a minute each for tiny; --timeout bounds a stuck one).
    bench bench_tiny_cuda_video video reference,baseline,fast,furious \
        --frames 8 --objects 1,3 --timeout 240
fi
if [ "$PART" = compile ] || [ "$PART" = all ]; then
    # torch.compile compiles in every benchmark process (about a minute each).
    bench bench_tiny_cuda_compile sps furious,furious+compile "${IMAGES[@]}"
fi
if [ "$PART" = tracker ] || [ "$PART" = all ]; then
    # 6 rows x 3 object counts, each its own process (a compiled row compiles there, about
    # a minute for tiny on an H100: not yet measured); the rows' timeout bounds a stuck one.
    uptime | tee -a "$OUT/load.txt"
    timeout 560 python3 scripts/tracker_compile_bench.py --device cuda --objects 1,3,8 \
        --rows fast,furious,fast+compile,furious+compile --frames 24 --timeout 120 \
        --out "$OUT/tracker_compile_cuda.md" 2>&1 | tee "$OUT/tracker.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [ "$PART" = tracker-meta ] || [ "$PART" = all ]; then
    # Meta's rows apart: vos_optimized compiles its image encoder too (max-autotune).
    uptime | tee -a "$OUT/load.txt"
    timeout 560 python3 scripts/tracker_compile_bench.py --device cuda --objects 1,3,8 \
        --rows meta,meta-vos --frames 24 --timeout 240 \
        --out "$OUT/tracker_meta_cuda.md" 2>&1 | tee "$OUT/tracker_meta.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [ "$PART" = blog ] || [ "$PART" = all ]; then
    bench bench_large_cuda_blog all baseline,furious "${BLOG[@]}"
fi
if [ "$PART" = blog-compile ] || [ "$PART" = all ]; then
    bench bench_large_cuda_blog_compile all baseline,furious+compile "${BLOG[@]}"
fi
if [ "$PART" = coldstart ] || [ "$PART" = all ]; then
    uptime | tee -a "$OUT/load.txt"
    timeout 560 python3 scripts/coldstart.py --model large --mode furious --device cuda \
        --runs 2 --out "$OUT/coldstart_large_cuda.md" 2>&1 | tee "$OUT/coldstart.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [ "$PART" = aoti ] || [ "$PART" = all ]; then
    timeout 560 python3 scripts/aoti_cuda_probe.py "$OUT/aoti" 2>&1 | tee "$OUT/aoti.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [ "$PART" = concepts ] || [ "$PART" = all ]; then
    uptime | tee -a "$OUT/load.txt"
    timeout 560 python3 -m sam2serve bench --task concepts --device cuda --sam3-size full \
        --random-weights --modes baseline,furious --repeats 3 --warmup 1 --phrases 1,10 \
        --out "$OUT" --name concepts_full_cuda 2>&1 | tee "$OUT/concepts.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [ "$PART" = concepts-device ]; then
    # (--part all runs these with the other cuda tests, in part tests.)
    timeout 300 python3 -m pytest -q -s -m cuda tests/cuda/test_concepts_cuda.py \
        -p no:cacheprovider -rs 2>&1 | tee "$OUT/concepts-device-tests.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
if [ "$PART" = decode ] || [ "$PART" = all ]; then
    uptime | tee -a "$OUT/load.txt"
    timeout 300 python3 scripts/decode_check.py --device cuda --out "$OUT/decode_cuda.md" 2>&1 \
        | tee "$OUT/decode.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    timeout 120 python3 -m pytest -q -s -m cuda tests/cuda/test_device_decode_cuda.py \
        -p no:cacheprovider 2>&1 | tee "$OUT/decode-tests.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    bench bench_tiny_cuda_decode_host sps fast "${IMAGES[@]}" --image-decode host
    bench bench_tiny_cuda_decode_device sps fast "${IMAGES[@]}" --image-decode device
fi
set -e
echo "gpu-check --part $PART: $([ $failed -eq 0 ] && echo passed || echo FAILED); results in $OUT/"
exit $failed
