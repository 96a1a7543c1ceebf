"""``sam2serve track --text PHRASES`` with SAM 3's own video predictor (the default
``--tracker sam3``): Meta's ``Sam3VideoPredictor`` semantics (docs/concepts-video.md) -
the detector on every frame, SAM 3's memory tracker, new instances picked up and lost ones
ended - from ``--concept-frame`` forward to the end, backward to frame 0, or both
(``--direction``, Meta's passes), the phrase optionally with one exemplar box on that frame
(``--box``; ``--text visual``: the box alone). Several phrases (``--text "person,dog"``)
are one run of Meta's predictor per phrase sharing each frame's ViT pass
(:mod:`sam2serve.concepts.video_phrases`); objects of different phrases may overlap. Object
ids are Meta's (0, 1, ... in order of appearance; with n phrases, phrase k's object i is
``i * n + k``); every object is named by its phrase. Frame files are written in the order
Meta yields frames (both: forward, then backward).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sam2serve.commands.common import EXIT_OK, UsageError, info_line, warning_line
from sam2serve.commands.track_clicks import (
    ClickSpec,
    check_clicks,
    parse_clicks,
)
from sam2serve.commands.track_concepts import parse_box, score_thresh
from sam2serve.commands.track_outputs import SUMMARY_NAME, TrackResults, print_summary, write_frame

if TYPE_CHECKING:
    from sam2serve.concepts.video_phrases import PhrasesFrame, PhrasesState


def thresholds(args: argparse.Namespace) -> Any:
    """Meta's video settings, with --score-thresh as the detection threshold (the new-object
    threshold 0.2 above it, Meta's 0.5 / 0.7) and --max-instances as its object limit."""
    from sam2serve.concepts.video_association import VideoThresholds

    return VideoThresholds.from_detection(score_thresh(args), args.max_instances)


def track_sam3(
    args: argparse.Namespace,
    phrases: list[str],
    frames: Any,
    names: Any,
    out_dir: Any,
    header: dict[str, Any],
) -> int:
    """Track every instance of each phrase through ``frames`` (one SAM 3 run per phrase,
    one ViT pass per frame: :mod:`sam2serve.concepts.video_phrases`) and write the frame
    files and track.json (``header``: what the command knows of the video and run)."""
    from sam2serve.concepts.weights import WeightsError
    from sam2serve.engine.video.predictor import FrameMasks
    from sam2serve.runtime.concepts import (
        describe_concepts_mode,
        load_concepts_in_mode,
        tracker_precisions,
        video_predictor_in_mode,
    )

    if len(phrases) > 1 and args.box is not None:
        raise UsageError(
            f"--box goes with one phrase (Meta's visual prompt is one session's); got "
            f"{len(phrases)}: {', '.join(map(repr, phrases))}"
        )
    if args.overlay is not None:
        raise UsageError("--overlay is drawn for --tracker sam2.1 only so far")
    from sam2serve.concepts.phrases import VISUAL_PHRASE, check_box

    box = None if args.box is None else parse_box(args.box)
    if box is not None:
        try:
            check_box(box, (frames.height, frames.width))
        except ValueError as exc:
            raise UsageError(f"--box: {exc}") from None
    if VISUAL_PHRASE in phrases and box is None:
        raise UsageError(
            f"--text {VISUAL_PHRASE} is Meta's stand-in for the box alone: give --box X1,Y1,X2,Y2"
        )
    from sam2serve.commands.concepts_flags import concepts_spec

    clicks = _checked_clicks(args, phrases, len(frames), frames.height, frames.width)
    start = time.perf_counter()
    try:
        concepts = load_concepts_in_mode(concepts_spec(args, args.device), args.mode)
        predictor = video_predictor_in_mode(concepts, thresholds(args), mode=args.mode)
    except WeightsError as exc:
        raise UsageError(str(exc)) from None
    what = "random weights" if args.random_weights else "weights"
    info_line(
        f"SAM 3 video predictor ({args.sam3_size}, {what}) loaded in "
        f"{time.perf_counter() - start:.1f} s; "
        + describe_concepts_mode(args.mode, concepts)
        + "; tracker "
        + ", ".join(
            f"{k} {v}" for k, v in tracker_precisions(predictor.neck, predictor.tracker).items()
        )
    )
    if args.random_weights and args.score_thresh is None:
        warning_line(
            "random weights score about 0.25: detections kept above 0, new objects from 0.2"
        )
    first = args.concept_frame
    num_frames = len(frames)
    from sam2serve.concepts.engine import ExemplarBox
    from sam2serve.concepts.video_phrases import propagate_phrases, start_phrases

    boxes = [] if box is None else [ExemplarBox(box)]
    state: PhrasesState
    run: Iterator[PhrasesFrame]
    if clicks:  # the files of frames answered again are rewritten with the final answers
        from sam2serve.commands.track_clicks import clicked_run

        state, run = clicked_run(
            predictor, phrases, boxes, clicks, frames.__getitem__,
            num_frames, frames.height, frames.width, first, args.direction,
        )  # fmt: skip
    else:
        # one run per phrase over one ViT pass per frame; one phrase: Meta's ids
        phrase_state = start_phrases(
            predictor, num_frames, frames.height, frames.width, phrases, boxes
        )
        state, run = (
            phrase_state,
            propagate_phrases(predictor, phrase_state, frames.__getitem__, first, args.direction),
        )
    seconds: list[float] = []
    final: dict[int, list[int]] = {}  # frame -> its objects (the last answer written)
    wall = time.perf_counter()
    tick = wall
    written = 0
    for result in run:
        masks = _as_logits(result.masks)
        frame = FrameMasks(result.frame, list(result.obj_ids), masks)
        write_frame(frame, names, out_dir, dict(zip(result.obj_ids, result.phrases, strict=True)))
        final[result.frame] = list(result.obj_ids)
        written += 1
        now = time.perf_counter()
        seconds.append(now - tick)
        tick = now
    seen: dict[int, list[int]] = {}
    for frame_idx, objs in sorted(final.items()):
        for obj in objs:
            seen.setdefault(obj, []).append(frame_idx)
    results = TrackResults({}, written, seconds, time.perf_counter() - wall)
    header = dict(header)
    header["objects"] = sorted(seen)
    header["names"] = {str(obj): state.phrase_of(obj) for obj in sorted(seen)}
    header["concepts"] = {
        "tracker": "sam3",
        "phrases": phrases,
        "frame": first,
        "box": None if box is None else list(box),
        "direction": args.direction,
        "clicks": [click.as_json() for click in clicks],
        "score_thresh": predictor.th.score,
        "new_object_thresh": predictor.th.new_det,
        "max_instances": args.max_instances,
        "sam3_size": args.sam3_size,
        "mode": args.mode,
        "tracker_precisions": tracker_precisions(predictor.neck, predictor.tracker),
        "objects": [
            {
                "obj_id": obj,
                "name": state.phrase_of(obj),
                "score": round(state.score_of(obj), 6),
                "first_frame": min(frames_of),
                "last_frame": max(frames_of),
            }
            for obj, frames_of in sorted(seen.items())
        ],
        "stage_seconds": {k: round(v, 3) for k, v in state.stage_seconds.items()},
    }
    header["timings"] = results.summary()
    (out_dir / SUMMARY_NAME).write_text(json.dumps(header, indent=2) + "\n")
    print_summary(results, out_dir, None)
    del predictor, concepts
    gc.collect()
    return EXIT_OK


def _checked_clicks(
    args: argparse.Namespace, phrases: list[str], num_frames: int, height: int, width: int
) -> list[ClickSpec]:
    """--click values, with one phrase, each on a frame the pass answers, inside the video
    (exit 2 names a bad one) - checked before the models load."""
    from sam2serve.concepts.video_prompts import check_direction, passes

    clicks = parse_clicks(getattr(args, "click", None))
    if clicks and len(phrases) != 1:
        raise UsageError(
            f"--click goes with one phrase (Meta's clicks are on one session's objects); "
            f"got {len(phrases)}: {', '.join(map(repr, phrases))}"
        )
    if clicks:
        plan = passes(num_frames, args.concept_frame, check_direction(args.direction))
        processed = [t for step in plan if not step.fetch for t in step.frames]
        check_clicks(clicks, num_frames, height, width, processed)
    return clicks


def _as_logits(masks: Any) -> Any:
    import torch

    tensor = torch.from_numpy(masks)
    return torch.where(tensor, 1.0, -1.0)[:, None]


__all__ = ["thresholds", "track_sam3"]
