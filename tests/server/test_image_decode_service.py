"""The service's image_decode setting: images for the encoder go through the decoder it
chose at start-up (here the device decoder over a fake nvImageCodec on the CPU, pixels
equal to Pillow's), and the answers are the host path's; every other upload (AMG's
pixels) stays on the host; the pixel limit and a bad file answer as before."""

from __future__ import annotations

import io

import fake_nvimgcodec
import numpy as np
import pytest
import torch
from PIL import Image
from server_support import b64, error_of, photo

from sam2serve.engine.device_decode import DeviceImageDecoder
from sam2serve.engine.image import load_image
from sam2serve.engine.predictor import Embedding, Predictor
from sam2serve.server import service as service_module

OBJECTS = [{"points": [{"x": 120, "y": 80}]}, {"box": [20, 30, 150, 160]}]


def jpeg(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=92)
    return buffer.getvalue()


class RecordingPredictor(Predictor):
    """The real predictor but ``encode``: records what it was given and answers a zero
    embedding of the real shapes (an encode costs seconds on this CPU)."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.given: list = []

    def encode(self, images) -> Embedding:
        items = list(images) if isinstance(images, (list, tuple)) else [images]
        self.given += items
        n = len(items)
        return Embedding(
            torch.zeros(n, 256, 64, 64),
            (torch.zeros(n, 32, 256, 256), torch.zeros(n, 64, 128, 128)),
            tuple(tuple(int(side) for side in item.shape[:2]) for item in items),
        )


@pytest.fixture
def recording(predictor) -> RecordingPredictor:
    return RecordingPredictor(predictor.model)


@pytest.fixture
def fake_device(monkeypatch):
    """Services started in this test decode 'on the device' with the fake."""
    fake = fake_nvimgcodec.install(monkeypatch)
    made: list[DeviceImageDecoder] = []

    def chosen(choice, device):
        assert choice == "device"
        made.append(DeviceImageDecoder("cpu", module=fake))
        return made[-1]

    monkeypatch.setattr(service_module, "image_decoder", chosen)
    return fake, made


def test_the_encoder_gets_the_device_decoders_pixels(server_factory, recording, fake_device):
    _, made = fake_device
    live = server_factory(recording, image_decode="device")
    data = jpeg(photo("chelsea"))
    body = {"image": b64(data), "objects": OBJECTS, "multimask_output": False}
    with live.client() as client:
        response = client.post("/v1/segment", json=body)
    assert response.status_code == 200, response.text
    assert made[0].counts == {"device": 1}
    (pixels,) = recording.given
    assert isinstance(pixels, torch.Tensor) and pixels.dtype == torch.uint8
    np.testing.assert_array_equal(pixels.numpy(), load_image(data))
    assert response.json()["width"] == pixels.shape[1]


@pytest.mark.extended  # two encodes of the tiny model: ~30 s on 2 cores
def test_segment_decodes_on_the_device_and_answers_as_the_host(
    server_factory, predictor, fake_device, monkeypatch
):
    fake, made = fake_device
    device_server = server_factory(predictor, image_decode="device")
    monkeypatch.undo()  # the next server chooses for real: host
    host_server = server_factory(predictor, image_decode="host")
    assert host_server.service.image_decoder.where == "host"
    data = jpeg(photo("chelsea"))
    body = {"image": b64(data), "objects": OBJECTS, "multimask_output": False}
    answers = []
    for live in (device_server, host_server):
        with live.client() as client:
            response = client.post("/v1/segment", json=body)
        assert response.status_code == 200, response.text
        answers.append(response.json())
    assert made[0].counts == {"device": 1} and len(fake.calls) == 1
    for answer in answers:  # mask ids are the servers' own
        for obj in answer["objects"]:
            for mask in obj["masks"]:
                assert mask.pop("mask_id")
    device_answer, host_answer = answers
    assert device_answer["image_id"] == host_answer["image_id"]
    assert device_answer["objects"] == host_answer["objects"]


def test_limits_and_bad_files_answer_as_on_the_host(server_factory, predictor, fake_device):
    fake, made = fake_device
    live = server_factory(predictor, image_decode="device", max_pixels=10_000)
    calls = len(fake.calls)
    whole = jpeg(photo("chelsea", 96))  # 96 x 64: under the limit
    truncated = whole[: len(whole) * 2 // 3]  # the header whole, the scan cut short
    with live.client() as client:
        big = client.post("/v1/embeddings", json={"image": b64(jpeg(photo("chelsea")))})
        broken = client.post("/v1/embeddings", json={"image": b64(truncated)})
    assert big.status_code == 413 and error_of(big)["code"] == "too_many_pixels"
    assert broken.status_code == 400 and error_of(broken)["code"] == "invalid_image"
    assert len(fake.calls) == calls + 1  # the big one never reached the decoder
    assert made[0].counts == {"host: device error OSError": 1}


def test_amg_pixels_stay_on_the_host(server_factory, recording, fake_device):
    _, made = fake_device
    live = server_factory(recording, image_decode="device")
    decoded = []
    real = live.service.decode

    async def spy(data, for_encoder=False):
        pixels, reservation = await real(data, for_encoder)
        decoded.append((for_encoder, type(pixels).__name__))
        return pixels, reservation

    live.service.decode = spy
    body = {"image": b64(jpeg(photo("coffee", 64))), "params": {"points_per_side": 2}}
    with live.client() as client:
        response = client.post("/v1/amg", json=body)
    assert response.status_code == 200, response.text
    assert decoded == [(False, "ndarray")]
    assert made[0].counts == {}  # the encode reused AMG's host pixels
    assert [type(pixels).__name__ for pixels in recording.given] == ["ndarray"]
