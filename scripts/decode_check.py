"""Host (Pillow) against device (nvImageCodec / nvJPEG) image decode on a GPU: time, pixels,
and a single-point request end to end with each.

    python scripts/decode_check.py --device cuda --out gpu-check/decode_cuda.md
    python scripts/decode_check.py --dry-run            # the plumbing, on the CPU

For each photo (skimage's, JPEG quality 90, plus astronaut enlarged to a 12-megapixel
phone-camera size, one with EXIF orientation 6, one with an embedded ICC profile, and a
greyscale JPEG and a PNG that the device decoder leaves to the host) it reports:

- p50 ms of the host decode (``load_image``), of the host decode plus the upload the
  encoder's preprocessing then does (``to_device``: pinned, synchronised), and of the
  device decode (``DeviceImageDecoder.decode``, synchronised), over ``--repeats`` after a
  warm-up;
- where the device decoder sent it (device, or host and why), and against the host's
  pixels: max and mean absolute difference, the 99.9th percentile, the share of
  channel values that differ;
- ``ok``: mean |diff| <= 1.0 and 99.9th percentile <= 4 levels. Why that and not
  equality: nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's (the JPEG standard
  lets a decoder's IDCT differ by 1 per sample; upsampling is left to the decoder; the
  device decoder asks for libjpeg's "fancy" upsampling to stay close), so values differ by a
  level or two, and by more only at sharp colour edges, where chroma subsampling already
  lost the detail. The model sees the image resized to 1024 and normalised: a level is
  1/255 before normalisation, well inside what the encoder's own bf16 modes change.
  The max is reported, not gated on, for that reason.

Then an SPS request through the engine as ``sam2serve run`` makes it (decode, preprocess,
image encoder, one click, RLE; tiny, random weights, mode fast), p50 ms with each decode,
and the IoU of the two masks.

``--dry-run`` runs on the CPU with the tests' fake nvImageCodec (tests/fake_nvimgcodec.py,
Pillow inside: it checks the plumbing, its numbers mean nothing), 1 repeat, small photos,
one SPS image.
"""

from __future__ import annotations

import argparse
import io
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def photos(dry_run: bool) -> list[tuple[str, bytes]]:
    """(name, encoded bytes) of the check's images."""
    import skimage.data
    from PIL import Image

    def jpeg(image: Image.Image, **kw: Any) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=90, **kw)
        return buffer.getvalue()

    out = []
    for name in ("astronaut", "chelsea", "coffee"):
        out.append((f"{name}.jpg", jpeg(Image.fromarray(getattr(skimage.data, name)()))))
    astronaut = Image.fromarray(skimage.data.astronaut())
    if not dry_run:
        out.append(("astronaut_12mp.jpg", jpeg(astronaut.resize((4032, 3024), Image.BICUBIC))))
    exif = Image.Exif()
    exif[0x0112] = 6
    out.append(("chelsea_exif6.jpg", jpeg(Image.fromarray(skimage.data.chelsea()), exif=exif)))
    # An embedded ICC profile: Pillow ignores it; a decoder applying it would show here.
    from PIL import ImageCms

    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    out.append(("coffee_icc.jpg", jpeg(Image.fromarray(skimage.data.coffee()), icc_profile=srgb)))
    out.append(("camera_grey.jpg", jpeg(Image.fromarray(skimage.data.camera()))))
    png = io.BytesIO()
    Image.fromarray(skimage.data.coffee()).save(png, format="PNG")
    out.append(("coffee.png", png.getvalue()))
    return out


def p50_ms(fn: Any, repeats: int, sync: Any) -> float:
    fn()  # warm-up (first-call allocations, nvJPEG's state)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def compare(host: np.ndarray, device: Any) -> dict[str, float]:
    got = device.cpu().numpy() if hasattr(device, "cpu") else np.asarray(device)
    if got.shape != host.shape:
        return {"max": float("nan"), "mean": float("nan"), "p999": float("nan"), "share": 1.0}
    diff = np.abs(got.astype(np.int16) - host.astype(np.int16))
    return {
        "max": float(diff.max()),
        "mean": float(diff.mean()),
        "p999": float(np.percentile(diff, 99.9)),
        "share": float((diff > 0).mean()),
    }


def decoder_for(args: argparse.Namespace) -> Any:
    from sam2serve.engine.device_decode import DeviceImageDecoder

    if args.dry_run:
        sys.path.insert(0, str(ROOT / "tests"))
        import fake_nvimgcodec

        return DeviceImageDecoder("cpu", module=fake_nvimgcodec.make())
    decoder = DeviceImageDecoder(args.device)
    decoder.check()
    return decoder


def sps_rows(args: argparse.Namespace, decoder: Any, images: list[tuple[str, bytes]]) -> list[str]:
    import torch

    from sam2serve.engine import tasks
    from sam2serve.engine.image import load_image
    from sam2serve.engine.rle import coco_to_rle, rle_to_mask
    from sam2serve.runtime.build import build_predictor
    from sam2serve.runtime.modes import get_mode
    from sam2serve.runtime.spec import RuntimeSpec, WeightsSource

    device = "cpu" if args.dry_run else args.device
    runtime = RuntimeSpec.from_label("fast", model="tiny", device=device)
    predictor = build_predictor(runtime, WeightsSource(random_weights=True, seed=0))
    flags = get_mode(runtime.mode)
    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)
    rows = []
    jpegs = [(name, data) for name, data in images if name.endswith(".jpg") and "grey" not in name]
    for name, data in jpegs[:1] if args.dry_run else jpegs:
        height, width = load_image(data).shape[:2]
        point = [width / 2, height / 2]
        masks: dict[str, np.ndarray] = {}

        def request(
            where: str,
            data: bytes = data,
            point: list[float] = point,
            keep: dict[str, np.ndarray] = masks,
        ) -> None:
            pixels = load_image(data) if where == "host" else decoder.decode(data, None)
            record = tasks.sps(predictor, pixels, point, flags=flags)[0]
            keep[where] = rle_to_mask(coco_to_rle(record["segmentation"]))

        host_ms = p50_ms(lambda: request("host"), args.repeats, sync)
        device_ms = p50_ms(lambda: request("device"), args.repeats, sync)
        union = np.logical_or(masks["host"], masks["device"]).sum()
        iou = np.logical_and(masks["host"], masks["device"]).sum() / union if union else 1.0
        rows.append(f"| {name} | {host_ms:.1f} | {device_ms:.1f} | {iou:.4f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="the CUDA device (default: cuda)")
    parser.add_argument("--repeats", type=int, default=20, help="timed decodes per photo")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument(
        "--dry-run", action="store_true", help="on the CPU with the fake nvImageCodec"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        args.repeats = 1
    import torch

    from sam2serve.engine.image import load_image, to_device

    decoder = decoder_for(args)
    cuda = not args.dry_run
    sync = (lambda: torch.cuda.synchronize(args.device)) if cuda else (lambda: None)
    images = photos(args.dry_run)
    lines = [
        f"# Image decode, host against device ({'DRY RUN: fake nvImageCodec on the CPU' if args.dry_run else args.device})",
        "",
        f"- machine: {platform.processor() or platform.machine()}; torch {torch.__version__}"
        + (f"; {torch.cuda.get_device_name(args.device)}" if cuda else ""),
        f"- decoder: {decoder.describe()}",
        f"- p50 over {args.repeats} repeats after one warm-up; synchronised",
        "",
        "| image | size | host ms | host + upload ms | device ms | went | max | mean | p99.9 | differ | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    failed = False
    for name, data in images:
        host = load_image(data)
        before = dict(decoder.counts)
        device_pixels = decoder.decode(data, None)
        went = next(
            (key for key in decoder.counts if decoder.counts[key] != before.get(key, 0)), "?"
        )
        stats = compare(host, device_pixels)
        ok = stats["mean"] <= 1.0 and stats["p999"] <= 4.0
        failed |= not ok
        host_ms = p50_ms(lambda data=data: load_image(data), args.repeats, sync)
        upload_ms = p50_ms(
            lambda data=data, target=(args.device if cuda else "cpu"): to_device(
                load_image(data), target
            ),
            args.repeats,
            sync,
        )
        device_ms = p50_ms(lambda data=data: decoder.decode(data, None), args.repeats, sync)
        lines.append(
            f"| {name} | {host.shape[1]}x{host.shape[0]} | {host_ms:.2f} | {upload_ms:.2f} | "
            f"{device_ms:.2f} | {went} | {stats['max']:.0f} | {stats['mean']:.3f} | "
            f"{stats['p999']:.0f} | {stats['share']:.1%} | {'yes' if ok else 'NO'} |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        "ok: mean |diff| <= 1.0 and p99.9 <= 4 levels (see scripts/decode_check.py).",
        "",
        (
            "## SPS through the engine (decode, preprocess, encode, one click, RLE; tiny, "
            "random weights, fast)"
        ),
        "",
        "| image | SPS ms, host decode | SPS ms, device decode | mask IoU host vs device |",
        "|---|---|---|---|",
        *sps_rows(args, decoder, images),
        "",
        f"decoder counts: {dict(decoder.counts)}",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report, encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
