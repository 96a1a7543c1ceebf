"""Round 3 of the Label Studio reliability suite (issue 26, items 1 and 6): video tasks
as a hostile caller of /predict would send them, against one real backend (``sam2serve
labelstudio``'s app in a subprocess under a memory cap; the tiny model with random
weights and its video model), the task videos read from a local folder it may read.

- videos in legal containers that show their streams only after probing (MPEG-TS,
  MPEG-PS), cut inside their index, or with metadata that is not UTF-8: 415
  ``unsupported_video`` or 422 ``invalid_video`` naming the task's field;
- Video tags (or task data fields) whose frameRate would overflow the seek arithmetic
  (1e-300, 5e-324, an integer of 400 digits, ...): 422 ``invalid_label_config`` naming
  the rate and what is accepted. (The video cases above, with the Video tag's frameRate
  10, show that a rate within the bounds passes.)

Every request gets a 4xx in the one error shape, and leaves no traceback in the backend's
log; the tallies are printed at the end and appended to ``$SAM2SERVE_RELIABILITY_REPORT``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from hostile import JSON, Answer, SpawnedServer, dumps, exchange
from round3_videos import hostile_videos
from server_logs import assert_no_traceback, log_mark
from surfaces import MiB, SharedServer, Tally, measured, report
from video_support import CLIP_FPS, VIDEO_CONFIG, clip_bytes_with_keyframes, video_region

pytest.importorskip("av")

TIMEOUT_S = 60.0
TALLIES = {"round3 LS video": Tally("round3 LS video")}
CLIP = "clip.mp4"  # a good clip: 12 frames, a keyframe every 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    for name, (data, _) in hostile_videos().items():
        (root / name).write_bytes(data)
    (root / CLIP).write_bytes(clip_bytes_with_keyframes(12, 4))
    return root


@pytest.fixture(scope="module")
def backend(folder) -> Iterator[SharedServer]:
    shared = SharedServer(
        {
            "video": True,
            "max_pixels": 4_000_000,
            "max_video_frames": 50,
            "max_video_upload_bytes": 8 * MiB,
            "request_timeout_s": 60,
        },
        labelstudio={
            "options": {"local_roots": [str(folder)], "preannotate": "none"},
            "optional": {},
        },
    )
    yield shared
    shared.stop()
    print("\n" + report(TALLIES))


def predict(live: SpawnedServer, data: dict[str, Any], config: str = VIDEO_CONFIG) -> Answer:
    """/predict of one video task whose region has a keyframe on frame 5 (so the clip is
    sought past its start)."""
    region = video_region("r1", [(5, 20.0, 20.0, 30.0, 30.0)])
    body = {
        "tasks": [{"id": 7, "data": data}],
        "project": "1.1700000000",
        "label_config": config,
        "params": {"login": None, "password": None, "context": {"result": [region]}},
    }
    return exchange(live.url, "POST", "/predict", dumps(body), JSON, TIMEOUT_S)


def refused(answer: Answer | None, status: int, statuses: set[int], codes: set[str]) -> str:
    assert answer is not None, "no answer (dropped or timed out)"
    assert status in statuses, f"{status}: {answer.text[:400]}"
    error = answer.error()
    assert error["code"] in codes, error
    assert len(error["message"]) <= 1000, error["message"][:300]
    return error["message"]


@pytest.mark.parametrize("name", sorted(hostile_videos()))
def test_an_unreadable_or_unsupported_task_video_is_a_4xx_naming_it(name, backend, folder):
    live = backend.ensure()
    mark = log_mark(live)
    _, codes = hostile_videos()[name]
    status, answer, _, _ = measured(
        live, TALLIES["round3 LS video"], lambda: predict(live, {"video": str(folder / name)})
    )
    message = refused(answer, status, {415, 422}, set(codes))
    assert "tasks[0] (task 7).data.video" in message, message
    if codes == {"unsupported_video"}:
        assert status == 415 and "remux" in message, message
    assert_no_traceback(live, mark)


def _config_rate(rate: str) -> str:
    return VIDEO_CONFIG.replace(f'frameRate="{CLIP_FPS:g}"', f'frameRate="{rate}"')


# (case, the Video tag's frameRate, the task's fps field)
RATES: list[tuple[str, str, Any]] = [
    ("tag_1e-300", "1e-300", None),
    ("tag_denormal", "5e-324", None),
    ("tag_below_the_least", "0.001", None),
    ("tag_1e308", "1e308", None),
    ("tag_inf", "inf", None),
    ("tag_nan", "nan", None),
    ("tag_zero", "0", None),
    ("tag_negative", "-25", None),
    ("tag_400_digits", "9" * 400, None),
    ("field_1e-300", "$fps", 1e-300),
    ("field_int_400_digits", "$fps", int("9" * 400)),
    ("field_string_1e-300", "$fps", "1e-300"),
    ("field_bool", "$fps", True),
    ("field_list", "$fps", [25]),
    ("field_long_string", "$fps", "2" * 100_000),
]


@pytest.mark.parametrize(("case", "rate", "field"), RATES, ids=[c[0] for c in RATES])
def test_a_frame_rate_that_would_overflow_the_seek_is_refused(case, rate, field, backend, folder):
    live = backend.ensure()
    mark = log_mark(live)
    data: dict[str, Any] = {"video": str(folder / CLIP)}
    if field is not None:
        data["fps"] = field
    status, answer, _, _ = measured(
        live, TALLIES["round3 LS video"], lambda: predict(live, data, _config_rate(rate))
    )
    message = refused(answer, status, {422}, {"invalid_label_config"})
    assert "frameRate" in message, message
    assert_no_traceback(live, mark)
