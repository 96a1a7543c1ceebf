"""On a CUDA GPU: every mode and backend that supports CUDA, against Meta's code on the
same GPU and weights, AMG, and the service. Marked ``cuda``: skipped where torch sees no
GPU (tests/conftest.py), run by scripts/gpu-check.sh where it does."""

from __future__ import annotations

import base64
import contextlib
import io
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from oracle import load_meta_model
from PIL import Image
from reference import import_reference
from skimage import data

from sam2serve.engine.amg import MaskGenerator
from sam2serve.runtime.build import build_predictor
from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

pytestmark = pytest.mark.cuda
DEVICE = "cuda"


def mask_iou(a: torch.Tensor, b: torch.Tensor) -> float:
    union = (a | b).sum().item()
    return 1.0 if union == 0 else (a & b).sum().item() / union


@pytest.fixture(scope="module")
def meta(tiny_checkpoint):
    import_reference()
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    return SAM2ImagePredictor(load_meta_model("tiny", tiny_checkpoint).to(DEVICE))


def ours(mode: str, checkpoint, backend: str = "eager"):
    spec = RuntimeSpec("tiny", mode, backend, device=DEVICE)
    return build_predictor(spec, WeightsSource(checkpoint=str(checkpoint)))


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    return data.chelsea()


@pytest.fixture(scope="module")
def prompts() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "point_coords": rng.uniform([0, 0], [451, 300], size=(8, 2, 2)).astype(np.float32),
        "point_labels": np.ones((8, 2), dtype=np.int32),
    }


def meta_masks(meta, photo, prompts) -> torch.Tensor:
    meta.set_image(photo)
    masks, _, _ = meta.predict(**prompts, multimask_output=True, return_logits=True)
    return torch.as_tensor(masks) > 0


@contextlib.contextmanager
def process_tf32(allowed: bool) -> Iterator[None]:
    """The process's TF32 switches as an entry point sets them (runtime.process)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("mode", ["baseline", "fast"])
def test_lossless_modes_match_meta_on_cuda(meta, photo, prompts, mode, tiny_checkpoint):
    """These modes keep TF32 off for their calls, even in a process that allows it (a
    furious one), so the fp32 tolerances of the CPU hold."""
    predictor = ours(mode, tiny_checkpoint)
    assert predictor.device.type == "cuda" and not predictor.allow_tf32
    with process_tf32(True):
        out = predictor.predict(predictor.encode(photo), **prompts).masks.cpu()
    with process_tf32(False):
        reference = meta_masks(meta, photo, prompts)
    ious = [mask_iou(a, b) for a, b in zip(out.flatten(0, 1), reference.flatten(0, 1))]
    assert min(ious) >= 0.995, ious


def test_fast_answers_alike_whatever_the_process_allows(photo, prompts, tiny_checkpoint):
    """TF32 would move fp32 logits by ~1e-3: fast's calls turn it off themselves."""
    fast = ours("fast", tiny_checkpoint)
    answers = []
    for allowed in (False, True):
        with process_tf32(allowed):
            answers.append(fast.predict(fast.encode(photo), **prompts).low_res_logits)
    torch.testing.assert_close(answers[1], answers[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "compile"])
def test_furious_is_bf16_autocast_close_to_baseline(photo, prompts, backend, tiny_checkpoint):
    fast = ours("fast", tiny_checkpoint)
    furious = ours("furious", tiny_checkpoint, backend)
    # Autocast keeps the weights fp32 (Meta's way), unlike the CPU's bf16 weights.
    assert furious.model.image_encoder.neck.convs[0].conv.weight.dtype == torch.float32
    assert furious.runtime.dtype == ("bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    with process_tf32(True):  # a furious process; fast still computes in fp32
        a = fast.predict(fast.encode(photo), **prompts).masks
        b = furious.predict(furious.encode(photo), **prompts).masks
    ious = [mask_iou(x, y) for x, y in zip(a.flatten(0, 1), b.flatten(0, 1))]
    assert float(np.mean(ious)) >= 0.97, ious


def test_prompt_chunk_is_chosen_for_the_gpu(tiny_checkpoint):
    assert ours("fast", tiny_checkpoint).prompt_chunk == 64


def test_amg_on_cuda_matches_the_cpu(photo, tiny_checkpoint):
    params = {"points_per_side": 8, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}
    gpu = MaskGenerator(ours("fast", tiny_checkpoint), output_mode="coco_rle", **params)
    cpu_spec = RuntimeSpec("tiny", "fast", device="cpu")
    cpu_predictor = build_predictor(cpu_spec, WeightsSource(checkpoint=str(tiny_checkpoint)))
    cpu = MaskGenerator(cpu_predictor, output_mode="coco_rle", **params)
    on_gpu, on_cpu = gpu.generate(photo), cpu.generate(photo)
    assert len(on_gpu) == len(on_cpu) > 0
    agree = sum(a["segmentation"] == b["segmentation"] for a, b in zip(on_gpu, on_cpu))
    assert agree / len(on_cpu) >= 0.95


def count_syncs(work) -> int:
    """How many synchronizing CUDA calls ``work()`` makes (torch's sync debug mode)."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "synchronizing" in str(w.message)]
    for message in syncs:
        print("sync:", message[:160])
    return len(syncs)


def test_no_host_sync_inside_the_decode_loop(photo, tiny_checkpoint):
    """Decoding 4x more prompt chunks makes no more host syncs: none happen per chunk."""
    predictor = ours("fast", tiny_checkpoint)
    embedding = predictor.encode(photo)
    rng = np.random.default_rng(5)

    def decode(n: int) -> None:
        coords = torch.as_tensor(rng.uniform(0, 300, (n, 1, 2)), dtype=torch.float32)
        coords, labels = coords.to(DEVICE), torch.ones(n, 1, dtype=torch.int32, device=DEVICE)
        context = predictor.decoder_context(embedding)
        frame = predictor.to_input_frame(coords, embedding.original_size, True)
        predictor.decode_low_res(context, frame, labels, None, True)

    # Warm-ups of both sizes first: a first call of a size may sync (the allocator,
    # cuBLAS' plans). The allocator may sync now and then on either size (on an H100: 2
    # for one chunk, 1 for four), so the test asks for what a per-chunk sync would break:
    # three more chunks, fewer than three more syncs.
    for n in (predictor.prompt_chunk, 4 * predictor.prompt_chunk):
        decode(n)
    one_chunk = count_syncs(lambda: decode(predictor.prompt_chunk))
    four_chunks = count_syncs(lambda: decode(4 * predictor.prompt_chunk))
    print(f"host syncs: {one_chunk} for one chunk, {four_chunks} for four")
    assert four_chunks - one_chunk < 3


def test_amg_syncs_a_few_times_per_batch(photo, tiny_checkpoint):
    """AMG's host syncs grow with its batches by a small constant (filters index with
    tensors; NMS and the records cross once), never with its masks."""
    params = {"points_per_side": 16, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}
    predictor = ours("fast", tiny_checkpoint)
    embedding = predictor.encode(photo)
    generator = MaskGenerator(predictor, output_mode="uncompressed_rle", **params)
    generator.generate(photo, embedding=embedding)  # warm-up
    counts = {}
    for per_batch in (64, 128):
        run = MaskGenerator(
            predictor, output_mode="uncompressed_rle", points_per_batch=per_batch, **params
        )
        counts[per_batch] = count_syncs(lambda r=run: r.generate(photo, embedding=embedding))
    batches = {per_batch: 256 // per_batch for per_batch in counts}
    per_batch_syncs = (counts[64] - counts[128]) / (batches[64] - batches[128])
    print(f"AMG host syncs: {counts} (batches {batches}); {per_batch_syncs:.1f} per batch")
    assert per_batch_syncs <= 4, counts


def test_service_on_cuda(tiny_checkpoint):
    from fastapi.testclient import TestClient

    from sam2serve.server.app import create_app
    from sam2serve.server.settings import ServerSettings

    settings = ServerSettings.from_flat(checkpoint=str(tiny_checkpoint), device=DEVICE)
    buffer = io.BytesIO()
    Image.fromarray(data.coffee()).save(buffer, format="PNG")
    image = base64.b64encode(buffer.getvalue()).decode()
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 120
        while (answer := client.get("/readyz")).status_code != 200:  # warming up
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.2)
        ready = answer.json()
        assert ready["device"].startswith("cuda") and ready["backend"] == "eager"
        body = {"image": image, "objects": [{"points": [{"x": 100, "y": 100}]}]}
        answer = client.post("/v1/segment", json=body)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["objects"][0]["masks"]) == 3


def test_coco_rle_on_the_gpu_equals_the_cpu():
    """masks_to_coco encodes on the GPU (runs, deltas, chars) and agrees with the CPU's
    numpy path string for string, on noisy, empty, full and first-pixel-set masks."""
    from sam2serve.engine.rle import masks_to_coco

    generator = torch.Generator().manual_seed(3)
    masks = torch.rand(16, 123, 77, generator=generator) < 0.5
    masks[1], masks[2], masks[3, 0, 0] = False, True, True
    on_gpu = masks_to_coco(masks.to(DEVICE))
    assert on_gpu == masks_to_coco(masks)


def test_compile_cache_on_cuda(tmp_path):
    """furious+compile on the GPU: a first process compiles tiny's image path and keeps it
    in the compile cache; a second loads it (FX-graph and AOTAutograd hits, the Triton
    kernels bundled in torch's artifacts: nothing compiled) and answers bit for bit the
    same. The processes' times are printed (pytest -s) for docs/benchmarks.md."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    child = Path(__file__).parents[1] / "runtime" / "compile_cache_child.py"
    env = {**os.environ, "SAM2SERVE_CACHE": str(tmp_path / "cache")}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    runs = []
    for name in ("first", "second"):
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(child), "image", "--device", DEVICE, "--mode", "furious"]
            + ["--save", str(tmp_path / f"{name}.pt")],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"compile cache, {name} process: {time.monotonic() - started:.1f} s, {report}")
        runs.append((torch.load(tmp_path / f"{name}.pt", weights_only=True), report))
    (first, cold), (second, warm) = runs
    assert cold["loaded"] is False and cold["written"] is True
    assert warm["loaded"] is True and warm["fx_graph_hits"] > 0
    assert warm["fx_graph_misses"] == 0 and warm["aot_autograd_misses"] == 0
    assert warm["kernels_built"] == 0
    for name, value in first.items():
        assert torch.equal(value, second[name]), name
