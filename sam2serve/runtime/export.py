"""Ahead-of-time artifacts: export once, start replicas without compiling.

``export_artifacts`` writes into a directory:

- ``image_encoder.xml`` / ``.bin``: the whole image path (Hiera trunk, FPN neck, the
  decoder's high-res projections and ``no_mem_embed``) as OpenVINO IR, converted with
  ``openvino.convert_model`` from our own module, batch dimension dynamic;
- ``image_encoder.cpu.blob``: that IR compiled for this CPU (OpenVINO ``export_model``);
  a replica on the same CPU imports it in a fraction of a second instead of compiling the
  IR (~8 s for tiny); on another CPU the IR is compiled at start-up;
- ``heads.pt``: the prompt encoder's and mask decoder's weights (``weights_only`` loadable);
- with ``backend="aoti"`` instead of the three OpenVINO files: ``image_encoder.pt2``, the
  image path (encoder in the mode's dtype) through torch.export and AOTInductor, batch 1;
- ``decoder_side.pt2``, ``decoder_prompts.pt2``, ``decoder_masks.pt2`` (with either
  backend, unless ``decoder="eager"``): the fast mask decoder through torch.export and
  AOTInductor (:mod:`sam2serve.runtime.decoder_programs`); without them the decoder runs
  eagerly from ``heads.pt``;
- ``manifest.json``: what was exported and how — model, mode, device and the compile
  target (CPU name, or GPU name and architecture), precision, runtime versions, shapes,
  the sha256 of every file, the weights' origin and the command.

Artifacts are per device: the manifest names the device and what the packages were
compiled for, and a loader asking for another device gets an :class:`ArtifactError`.
Only CPU artifacts are exported today (``ARTIFACT_IMAGE_PATH_DEVICES``): AOTInductor
packages compiled for CUDA crashed when loaded (see ``CUDA_ARTIFACTS_WHY``).

``load_artifacts`` checks the manifest against the request and the installed runtime
before anything is loaded; every mismatch is an :class:`ArtifactError` that names it.
Loading compiles nothing (no torch.compile, no TorchDynamo); AOTInductor compiles at export
time.
"""

from __future__ import annotations

import io
import json
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sam2serve.checkpoint import WeightsInfo, load_model
from sam2serve.config import get_config
from sam2serve.engine.predictor import Predictor
from sam2serve.modeling.fast_mask_decoder import FastMaskDecoder
from sam2serve.modeling.sam2 import ImageFeatures, SAM2Image
from sam2serve.runtime.aoti import AOTIProgram, compile_target
from sam2serve.runtime.backends import (
    ARTIFACT_DECODERS,
    ARTIFACT_IMAGE_PATH_DEVICES,
    ARTIFACT_IMAGE_PATHS,
)
from sam2serve.runtime.build import decoder_dtype, encoder_dtype, predictor_for, resolve_dtype
from sam2serve.runtime.cache_entry import file_problems, sha256_file
from sam2serve.runtime.decoder_programs import export_decoder_programs, load_fast_decoder
from sam2serve.runtime.modes import get_mode
from sam2serve.runtime.spec import RuntimeSpec

MANIFEST = "manifest.json"
ENCODER_XML = "image_encoder.xml"
ENCODER_BIN = "image_encoder.bin"
HEADS = "heads.pt"
# The image path compiled for this CPU (OpenVINO's export_model): loading it skips the
# ~8 s compile of the IR; used only on a CPU of the same name, else the IR is compiled.
ENCODER_BLOB = "image_encoder.cpu.blob"
# 2: per-device artifacts (the manifest's device and compile targets); 3: the fast
# decoder's programs pass its one-product image side and scaled final keys.
FORMAT_VERSION = 3
# How the image path is exported (BACKENDS, historically: the manifest's "backend" key) and
# how the mask decoder runs from the artifacts (AOTInductor programs, or eagerly).
BACKENDS = ARTIFACT_IMAGE_PATHS
DECODERS = ARTIFACT_DECODERS
# backend aoti: the image path as a torch.export + AOTInductor package (batch 1; a batch
# of images runs image by image), run by AOTIProgram.
ENCODER_PT2 = "image_encoder.pt2"
OUTPUT_NAMES = ("image_embed", "high_res_s0", "high_res_s1")
CUDA_ARTIFACTS_WHY = (
    ": AOTInductor packages compiled for CUDA crashed when loaded (docs/benchmarks.md, GPU); "
    "on a GPU, run --backend eager or compile"
)


class ArtifactError(RuntimeError):
    """Artifacts that are missing, corrupt or do not match what was asked for."""


class _ImagePath(torch.nn.Module):
    """encode_image as a module with tensor outputs, the unit that is exported."""

    def __init__(self, model: SAM2Image) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.model.encode_image(images)
        return features.image_embed, *features.high_res_feats


def _encoder_precision(spec: RuntimeSpec) -> str:
    if get_mode(spec.mode).quantized_encoder is not None:
        return "int8"  # its unquantised ops in f32 (_precision_config)
    # fast is lossless: keep f32 (OpenVINO would pick bf16 on a CPU that has it).
    return {torch.bfloat16: "bf16", torch.float16: "f16"}.get(encoder_dtype(spec), "f32")


def convert_image_path(model: SAM2Image) -> tuple[object, tuple[torch.Tensor, ...]]:
    """The image path of ``model`` as an OpenVINO model (batch dimension dynamic), and its
    eager outputs on the example input (their shapes go into the manifest)."""
    import openvino as ov

    side = model.image_size
    example = torch.zeros(1, 3, side, side)
    with torch.inference_mode():
        reference = _ImagePath(model).eval()(example)
    with warnings.catch_warnings():
        # The trace sees Hiera's padding checks as constants: right for the fixed 1024 x
        # 1024 input, and said on every export otherwise.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        converted = ov.convert_model(
            _ImagePath(model).eval(),
            example_input=example,
            input=[ov.PartialShape([-1, 3, side, side])],
        )
    for output, name in zip(converted.outputs, OUTPUT_NAMES):
        output.get_tensor().set_names({name})
    return converted, reference


def compile_for_cpu(model: object, precision: str) -> OpenVINOImageEncoder:
    """Compile an OpenVINO model (an IR path or an in-memory model) for the CPU."""
    import openvino as ov

    compiled = ov.Core().compile_model(model, "CPU", _precision_config(precision))
    return OpenVINOImageEncoder(compiled, "compiled at start-up")


def _precision_config(precision: str) -> dict[str, str]:
    # Given at compile AND at import: an imported blob otherwise runs in the CPU's
    # default precision (bf16 here), which measurably changed fast's f32 answers.
    return {"INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32"}


def cpu_name() -> str:
    """The CPU as OpenVINO names it: a compiled blob is only reused on the same one."""
    import openvino as ov

    return str(ov.Core().get_property("CPU", "FULL_DEVICE_NAME"))


def _import_compiled(directory: Path, manifest: dict[str, Any]) -> OpenVINOImageEncoder | None:
    """The exported compiled image path, if it was compiled on this kind of CPU."""
    import openvino as ov

    compiled = manifest.get("compiled")
    if not compiled or compiled.get("cpu") != cpu_name():
        return None
    with (directory / compiled["file"]).open("rb") as f:
        blob = io.BytesIO(f.read())
    config = _precision_config(manifest["precision"])
    imported = ov.Core().import_model(blob, "CPU", config)
    return OpenVINOImageEncoder(imported, "imported, not compiled")


def openvino_image_encoder(model: SAM2Image, spec: RuntimeSpec) -> OpenVINOImageEncoder:
    """The image path converted and compiled at start-up (backend openvino): the first
    start of these weights in this mode converts it (tens of seconds for tiny) and keeps
    the result in the cache (runtime.openvino_cache); later starts import it."""
    import openvino as ov

    from sam2serve.runtime.openvino_cache import cache_key, cached_image_path, weights_digest

    precision = _encoder_precision(spec)
    identity: dict[str, object] = {"image_size": model.image_size, "openvino": ov.__version__}
    if get_mode(spec.mode).quantized_encoder is not None:
        import nncf

        from sam2serve.runtime.quantize import DEFAULT_CALIBRATION

        identity.update(nncf=nncf.__version__, calibration=DEFAULT_CALIBRATION.as_dict())
    config = _precision_config(precision)
    compiled, source = cached_image_path(
        cache_key(weights_digest(model), precision, identity),
        cpu_name(),
        convert=lambda: mode_image_path(model, spec)[0],
        compile_model=lambda converted: ov.Core().compile_model(converted, "CPU", config),
        import_model=lambda blob: ov.Core().import_model(io.BytesIO(blob), "CPU", config),
    )
    return OpenVINOImageEncoder(compiled, source)


def mode_image_path(
    model: SAM2Image, spec: RuntimeSpec
) -> tuple[object, tuple[torch.Tensor, ...], dict[str, Any]]:
    """The image path as OpenVINO runs it in ``spec``'s mode: converted, then for int8
    quantised by NNCF (sam2serve.runtime.quantize); its fp32 eager outputs on the example
    input; and what the manifest records of the quantisation ({} for the float modes)."""
    converted, reference = convert_image_path(model)
    if get_mode(spec.mode).quantized_encoder is None:
        return converted, reference, {}
    from sam2serve.runtime.quantize import DEFAULT_CALIBRATION, quantize_image_path

    quantized = quantize_image_path(converted, model.image_size, DEFAULT_CALIBRATION)
    return quantized, reference, {"calibration": DEFAULT_CALIBRATION.as_dict()}


def export_artifacts(
    size: str,
    mode: str,
    out: str | Path,
    *,
    backend: str = "openvino",
    decoder: str = "aoti",
    checkpoint: str | None = None,
    random_weights: bool = False,
    seed: int = 0,
    command: str | None = None,
    device: str = "cpu",
    progress: Callable[[str], None] = lambda step: None,
) -> dict[str, Any]:
    """Export the model of ``size`` for ``mode`` on ``device`` into ``out``; returns the
    manifest. ``progress`` is told each step as it starts (the whole export takes minutes)."""
    if backend not in BACKENDS:
        raise ArtifactError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if decoder not in DECODERS:
        raise ArtifactError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    device_type = torch.device(device).type
    if device_type not in ARTIFACT_IMAGE_PATH_DEVICES[backend]:
        raise ArtifactError(
            f"backend {backend!r} exports for "
            f"{', '.join(ARTIFACT_IMAGE_PATH_DEVICES[backend])}, not {device!r}"
            + (CUDA_ARTIFACTS_WHY if device_type == "cuda" else "")
        )
    if get_mode(mode).decoder != "fast":
        raise ArtifactError(f"export is for the fast, furious and int8 modes, got {mode!r}")
    if get_mode(mode).quantized_encoder is not None and backend != "openvino":
        raise ArtifactError(
            f"mode {mode!r} exports its image path through OpenVINO (NNCF quantisation), "
            f"not {backend!r}"
        )
    spec = resolve_dtype(RuntimeSpec(size, mode, "artifacts", device=device))
    model = load_model(size, checkpoint, random_weights=random_weights, seed=seed, device=device)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    side = model.image_size
    if backend == "aoti":
        progress("image path: torch.export + AOTInductor (about a minute)")
        reference, encoder_files, extra = _export_aoti(model, spec, out)
    else:
        progress(
            "image path: OpenVINO conversion"
            + (", int8 calibration" if get_mode(mode).quantized_encoder else "")
            + " and compilation for this CPU"
        )
        reference, encoder_files, extra = _export_openvino(model, spec, out)
    if decoder == "aoti":
        fast = FastMaskDecoder(model.sam_mask_decoder, decoder_dtype(spec))
        embed, s0, s1 = reference
        extra["decoder"] = export_decoder_programs(
            fast, model.sam_prompt_encoder, embed, (s0, s1), out, progress
        )
        encoder_files = (*encoder_files, *extra["decoder"]["files"])
    heads = {k: v for k, v in model.state_dict().items() if not k.startswith("image_encoder.")}
    torch.save(heads, out / HEADS)
    manifest = {
        "format": FORMAT_VERSION,
        "model": size,
        "mode": mode,
        # How a loader runs these files: RuntimeSpec(model, mode, backend="artifacts").
        "spec": {
            "model": size,
            "mode": mode,
            "backend": "artifacts",
            "device": device_type,
            "dtype": spec.dtype,
        },
        "backend": backend,
        "device": device_type,
        "target": compile_target(model.device),
        "precision": _encoder_precision(spec),
        "runtime": _runtime_versions(backend),
        "input": {"name": "images", "shape": ["batch", 3, side, side], "dtype": "float32"},
        "outputs": {
            name: {"shape": ["batch", *t.shape[1:]], "dtype": "float32"}
            for name, t in zip(OUTPUT_NAMES, reference)
        },
        "weights": model.weights_info.as_dict(),
        **extra,
        "files": {name: sha256_file(out / name) for name in (*encoder_files, HEADS)},
        "export_seconds": round(time.perf_counter() - started, 1),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "command": command or " ".join(sys.argv),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _export_openvino(
    model: SAM2Image, spec: RuntimeSpec, out: Path
) -> tuple[tuple[torch.Tensor, ...], tuple[str, ...], dict[str, Any]]:
    import openvino as ov

    converted, reference, quantization = mode_image_path(model, spec)
    ov.save_model(converted, out / ENCODER_XML, compress_to_fp16=False)
    encoder = compile_for_cpu(converted, _encoder_precision(spec))
    (out / ENCODER_BLOB).write_bytes(encoder.compiled.export_model().getvalue())
    compiled = {"compiled": {"file": ENCODER_BLOB, "device": "CPU", "cpu": cpu_name()}}
    return reference, (ENCODER_XML, ENCODER_BIN, ENCODER_BLOB), {**compiled, **quantization}


def _export_aoti(
    model: SAM2Image, spec: RuntimeSpec, out: Path
) -> tuple[tuple[torch.Tensor, ...], tuple[str, ...], dict[str, Any]]:
    """torch.export of the image path (the encoder in the mode's dtype), compiled ahead of
    time by AOTInductor into one package."""
    assert model.image_encoder is not None  # exported from a model with its image path
    model.image_encoder.to(encoder_dtype(spec))
    path = _ImagePath(model).eval()
    example = torch.zeros(1, 3, model.image_size, model.image_size, device=model.device)
    with torch.inference_mode():
        reference = path(example)
    program = torch.export.export(path, (example,))
    torch._inductor.aoti_compile_and_package(program, package_path=str(out / ENCODER_PT2))
    return reference, (ENCODER_PT2,), {"batch": 1}


def _runtime_versions(backend: str) -> dict[str, str]:
    if backend == "aoti":
        return {"torch": torch.__version__}
    import openvino as ov

    return {"openvino": ov.__version__, "torch": torch.__version__}


def read_manifest(
    directory: str | Path, expected_format: int | str = FORMAT_VERSION
) -> dict[str, Any]:
    """The manifest in ``directory``; ``expected_format``: these artifacts' format version,
    or ``"onnx"`` for 'sam2serve export --format onnx' (run by backend 'onnxruntime')."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ArtifactError(
            f"no {MANIFEST} in {str(directory)!r}: not an export directory "
            "(make one with 'sam2serve export')"
        )
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{str(path)!r} is not valid JSON: {exc}") from None
    found = manifest.get("format") if isinstance(manifest, dict) else None
    if found != expected_format and "onnx" in (found, expected_format):
        runner = "backend 'onnxruntime'" if found == "onnx" else "backend 'artifacts'"
        raise ArtifactError(
            f"{str(path)!r} is {'an ONNX export' if found == 'onnx' else 'not an ONNX export'}"
            f": run it with {runner}"
        )
    if found == "compile-cache":
        raise ArtifactError(
            f"{str(path)!r} is a compile cache ('sam2serve export --format compile-cache'), "
            "not artifacts: put it in $SAM2SERVE_CACHE/compile/ and run --backend compile, "
            "which loads it from there"
        )
    if found != expected_format:
        raise ArtifactError(
            f"{str(path)!r} has format {manifest.get('format')!r}; this "
            f"sam2serve reads format {FORMAT_VERSION}: export again"
        )
    return manifest


def check_manifest(
    manifest: dict[str, Any],
    directory: Path,
    size: str | None,
    mode: str | None,
    device: torch.device | None = None,
) -> None:
    """Every mismatch between the artifacts and the request or the runtime, named."""
    problems = []
    if size is not None and manifest["model"] != size:
        problems.append(f"model is {manifest['model']!r}, asked for {size!r}")
    if mode is not None and manifest["mode"] != mode:
        problems.append(f"mode is {manifest['mode']!r}, asked for {mode!r}")
    backend = manifest.get("backend", "openvino")
    if device is not None and manifest["device"] != device.type:
        problems.append(
            f"exported for {manifest['device']}, asked for {device.type} (export them again "
            f"with --device {device.type}{' --format aoti' if device.type == 'cuda' else ''})"
        )
    elif (
        device is not None
        and device.type == "cuda"
        and manifest["target"] != (here := compile_target(device))
    ):
        # CUDA kernels are compiled for the exporting GPU's architecture.
        problems.append(f"compiled for {manifest['target']!r}, this GPU is {here!r}")
    compiled_by_torch = backend == "aoti" or "decoder" in manifest
    if compiled_by_torch and manifest["runtime"]["torch"] != torch.__version__:
        problems.append(
            f"compiled with torch {manifest['runtime']['torch']}, installed is {torch.__version__}"
        )
    if backend == "openvino":
        import openvino as ov

        if manifest["runtime"]["openvino"] != ov.__version__:
            problems.append(
                f"exported with OpenVINO {manifest['runtime']['openvino']}, "
                f"installed is {ov.__version__}"
            )
    problems += file_problems(directory, manifest["files"])
    if problems:
        raise ArtifactError(
            f"artifacts in {str(directory)!r} cannot be used: " + "; ".join(problems)
        )


@dataclass
class OpenVINOImageEncoder:
    """Runs the exported image path; returns the same ImageFeatures as encode_image."""

    compiled: Any  # an openvino.CompiledModel (openvino ships no type information)
    source: str = "compiled at start-up"  # or "imported, not compiled"

    def __call__(self, images: torch.Tensor) -> ImageFeatures:
        # A fresh infer request per call: safe from several threads at once.
        request = self.compiled.create_infer_request()
        outputs = request.infer({0: images.float().cpu().numpy()}, share_outputs=False)
        embed, s0, s1 = (torch.from_numpy(outputs[i]) for i in range(3))
        return ImageFeatures(embed, (s0, s1))


class AOTImageEncoder:
    """Runs the AOTInductor package of the image path (batch 1, image by image) on the
    device it was compiled for."""

    source = "AOTInductor package, not compiled"

    def __init__(self, package: str, device: torch.device) -> None:
        self.runner = AOTIProgram(package, device)
        self.device = device

    def __call__(self, images: torch.Tensor) -> ImageFeatures:
        images = images.to(self.device, torch.float32)
        outputs = [self.runner([image[None].contiguous()]) for image in images]
        embed, s0, s1 = (torch.cat(parts) for parts in zip(*outputs))
        return ImageFeatures(embed, (s0, s1))


def load_artifacts(directory: str | Path, spec: RuntimeSpec | None = None) -> Predictor:
    """A Predictor whose image path (and, if exported, fast decoder) runs from the artifacts:
    no compilation, no checkpoint. ``spec`` (backend 'artifacts') must agree with the
    manifest's model and mode; without one they are taken from the manifest."""

    directory = Path(directory)
    manifest = read_manifest(directory)
    if spec is None:
        spec = RuntimeSpec(
            model=manifest["model"],
            mode=manifest["mode"],
            backend="artifacts",
            device=manifest["device"],
        )
    device = torch.device(spec.device)
    check_manifest(manifest, directory, spec.model, spec.mode, device)
    exported_dtype = manifest["spec"]["dtype"]
    if spec.dtype is not None and spec.dtype != exported_dtype:
        raise ArtifactError(
            f"artifacts in {str(directory)!r} compute in {exported_dtype}, asked for "
            f"{spec.dtype}: export them again"
        )
    spec = spec.replace(dtype=exported_dtype)
    model = SAM2Image(get_config(manifest["model"]), with_image_encoder=False)
    heads = torch.load(directory / HEADS, weights_only=True, map_location=device)
    model.load_state_dict(heads, strict=True)
    info = manifest["weights"]
    model.weights_info = WeightsInfo(info["source"], path=info.get("path"), seed=info.get("seed"))
    model.to(device).eval()
    fast_decoder = None
    if "decoder" in manifest:
        entry = manifest["decoder"]
        fast_decoder = load_fast_decoder(model.sam_mask_decoder, directory, entry, device)
    if manifest.get("backend") == "aoti":
        aot_encoder = AOTImageEncoder(str(directory / ENCODER_PT2), device)
        return predictor_for(model, spec, aot_encoder, fast_decoder)
    encoder = _import_compiled(directory, manifest)
    if encoder is None:  # exported on another CPU (or before blobs): compile the IR here
        encoder = compile_for_cpu(str(directory / ENCODER_XML), manifest["precision"])
    return predictor_for(model, spec, encoder, fast_decoder)
