"""The calibration set of post-training quantisation: real photographs, decoded and
preprocessed exactly as requests are (``engine.image``), so the activation ranges the
quantiser observes are those the encoder sees in service.

The photographs ship with scikit-image (``skimage.data``): the four bundled samples plus
the other colour and grey photographs there (grey ones repeated to three channels),
and their horizontal flips when more images are asked for than there are photographs.
Deterministic: the same ``n`` always gives the same images in the same order.
"""

from __future__ import annotations

import numpy as np

# skimage.data photographs (grey ones become three equal channels).
CALIBRATION_PHOTOS = (
    "camera",
    "immunohistochemistry",
    "logo",
    "hubble_deep_field",
    "page",
    "horse",
    "grass",
    "gravel",
    "brick",
    "text",
    "moon",
    "coins",
    "colorwheel",
    "retina",
    # The bundled samples (the bench's and the tests' images) last: a calibration of up to
    # 14 images (the default) is measured on photographs it never saw.
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
)


def _as_rgb(image: np.ndarray) -> np.ndarray:
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    if image.shape[2] == 4:
        image = image[:, :, :3]
    if image.dtype != np.uint8:
        image = image.astype(np.float64)
        image = 255 * (image - image.min()) / max(float(image.max() - image.min()), 1e-12)
        image = image.astype(np.uint8)
    return np.ascontiguousarray(image)


def calibration_photos() -> list[tuple[str, np.ndarray]]:
    """The photographs available offline, as (name, uint8 HxWx3), in a fixed order. Names
    that this scikit-image lacks (or that need a download it cannot make) are skipped."""
    import skimage.data

    photos = []
    for name in CALIBRATION_PHOTOS:
        loader = getattr(skimage.data, name, None)
        if loader is None:
            continue
        try:
            image = loader()
        except (OSError, ValueError, ImportError):  # a data file that needs a download
            image = None
        if image is None:
            continue
        if isinstance(image, tuple):  # e.g. stereo pairs
            image = image[0]
        photos.append((name, _as_rgb(np.asarray(image))))
    return photos


def calibration_images(n: int = 14) -> list[np.ndarray]:
    """``n`` uint8 HxWx3 images: the photographs, then their mirror images, cycled."""
    if n < 1:
        raise ValueError(f"calibration needs at least one image, got n={n}")
    photos = [image for _, image in calibration_photos()]
    pool = photos + [np.ascontiguousarray(image[:, ::-1]) for image in photos]
    return [pool[i % len(pool)] for i in range(n)]


def calibration_inputs(count: int, image_size: int) -> list[np.ndarray]:
    """``count`` model inputs, (1, 3, S, S) float32: the photographs decoded and
    preprocessed exactly as the Predictor preprocesses a request (what every quantiser
    calibrates on: NNCF for OpenVINO, ONNX Runtime's static quantiser)."""
    from sam2serve.engine.image import load_image, preprocess

    return [
        preprocess([load_image(image)], image_size).numpy() for image in calibration_images(count)
    ]
