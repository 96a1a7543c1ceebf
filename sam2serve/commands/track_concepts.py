"""``sam2serve track --text "cat,dog"``: the objects to track found by SAM 3 on one frame.

Instead of a prompts file, SAM 3's detector runs once on ``--concept-frame``; every
instance of the phrases above ``--score-thresh`` (duplicates across phrases dropped,
highest score first, at most ``--max-instances``; :mod:`sam2serve.concepts.video_seed`)
becomes one object, its mask the object's prompt on that frame, its phrase its name. SAM
2.1's propagation then tracks them as it tracks prompted objects. This is not Meta's SAM 3
video model (which detects on every frame): an instance that enters later is not found.

Everything here is checked before a model loads (torch-free until :func:`find_seeds`).
SAM 3 is freed before the tracker loads.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass
from typing import Any

from sam2serve.commands.common import PROG, UsageError, info_line, positive_int, warning_line
from sam2serve.commands.concept_prompts import MAX_PHRASE_CHARS, parse_text
from sam2serve.commands.concepts_flags import add_concepts_flags, concepts_spec
from sam2serve.commands.track_clicks import add_click_argument, no_clicks_with, parse_clicks
from sam2serve.concepts.phrases import META_SCORE_THRESH, default_score_thresh
from sam2serve.runtime.modes import MODES, VIDEO_MODES

DEFAULT_MAX_INSTANCES = 20
TRACKERS = ("sam3", "sam2.1")
DEFAULT_TRACKER = "sam3"
DIRECTIONS = ("forward", "backward", "both")  # concepts.video_prompts.DIRECTIONS, torch-free
DEFAULT_DIRECTION = "forward"

HELP = f"""\
concepts (--text, instead of --prompts):
  --tracker sam3 (default): SAM 3's own video predictor, as Meta's (docs/concepts-video.md):
  the detector runs on every frame from --concept-frame on, SAM 3's memory tracker
  follows each instance, new instances become new objects and lost ones end; object ids
  are Meta's (0, 1, ... in order of appearance). Several phrases ("person,dog,car") are
  one run of Meta's predictor per phrase (its own ids, limits, hot start) sharing one ViT
  pass per frame: phrase k of n's object i is id i*n+k, named by its phrase; objects of
  different phrases may overlap. --box X1,Y1,X2,Y2 (one phrase) adds one exemplar box on
  --concept-frame (Meta's visual prompt; --text visual: the box alone, which finds
  instances on that frame only); --direction backward|both also tracks from
  --concept-frame back to frame 0, as Meta's propagate_in_video. --mode applies to
  detector and tracker (furious, int8: bf16 tracker; int8 with --tracker sam3 only).
  --tracker sam2.1: SAM 3 finds every instance of the phrases on --concept-frame; each
  (duplicates across phrases dropped: mask IoU > 0.7 with a higher-scoring one) becomes
  one object, numbered 1..N by decreasing score, its mask its prompt there and its phrase
  its name (track.json "names", and "name" in each frame file's objects); SAM 2.1 then
  tracks them; instances that appear after that frame are not looked for.
  e.g. {PROG} track clip.mp4 --text "cat,dog" --out tracked/
"""


@dataclass(frozen=True)
class ConceptObject:
    """One object seeded by SAM 3: its id, phrase, score and mask (bool (H, W))."""

    obj_id: int
    phrase: str
    score: float
    mask: Any
    box: tuple[float, float, float, float]

    def as_json(self) -> dict[str, Any]:
        return {
            "obj_id": self.obj_id,
            "name": self.phrase,
            "score": round(self.score, 6),
            "box": [round(float(v), 2) for v in self.box],
        }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("concepts (SAM 3 seeds the objects; docs/concepts.md)")
    group.add_argument(
        "--text",
        metavar="PHRASES",
        help='noun phrases, comma-separated: "cat,dog"; one holding a comma in double '
        """quotes: 'cat,"salt, pepper"' (each 1.."""
        f"{MAX_PHRASE_CHARS} characters, no control or invisible characters): track every "
        "instance SAM 3 finds on --concept-frame, instead of --prompts",
    )
    group.add_argument(
        "--tracker",
        choices=TRACKERS,
        default=DEFAULT_TRACKER,
        help="sam3: SAM 3's own video predictor (detection on every frame; one run per "
        "phrase over a shared ViT pass); "
        "sam2.1: SAM 3 seeds objects on --concept-frame and SAM 2.1 tracks them "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--concept-frame",
        type=int,
        default=0,
        metavar="N",
        help="the frame SAM 3 looks at (0-based) (default: %(default)s)",
    )
    group.add_argument(
        "--score-thresh",
        type=float,
        metavar="X",
        help=f"seed instances scored above X, in [0, 1] (default: Meta's {META_SCORE_THRESH}; "
        "0 with --random-weights, whose scores are about 0.25)",
    )
    group.add_argument(
        "--max-instances",
        type=positive_int,
        default=DEFAULT_MAX_INSTANCES,
        metavar="N",
        help="track at most N objects, the highest scores first (--tracker sam3: at once, "
        "per phrase) (default: %(default)s)",
    )
    group.add_argument(
        "--box",
        metavar="X1,Y1,X2,Y2",
        help="--tracker sam3, one phrase: an exemplar box on --concept-frame, in the video's pixels "
        "(top-left, bottom-right), prompting SAM 3's detector with the phrase (Meta's "
        "visual prompt; --text visual for the box alone)",
    )
    group.add_argument(
        "--direction",
        choices=DIRECTIONS,
        default=DEFAULT_DIRECTION,
        help="--tracker sam3: forward from --concept-frame to the end, backward from the "
        "frame before it to 0 (that frame's own answer is the prompt's, not written), or "
        "both (forward, then backward; Meta's passes: from the last frame its backward "
        "pass only fetches, so those frames come out empty) (default: %(default)s)",
    )
    add_click_argument(group)
    add_concepts_flags(group)
    _widen_mode_flag(parser)


def _widen_mode_flag(parser: argparse.ArgumentParser) -> None:
    """--mode (track's: the video modes) also takes the concept modes SAM 3's own video
    predictor runs (int8: with --text and --tracker sam3 only), and says what each does
    to it."""
    [flag] = [a for a in parser._actions if "--mode" in a.option_strings]
    assert flag.help is not None and flag.choices is not None  # track's add_mode_flag
    extra = tuple(name for name in MODES if name not in flag.choices)
    flag.choices = (*flag.choices, *extra)
    sam3 = "; ".join(f"{name}: {SAM3_VIDEO_MODES[name]}" for name in MODES)
    flag.help = flag.help.replace(
        " (default: %(default)s)",
        f"; with --text --tracker sam3 (SAM 3's video predictor): {sam3} (default: %(default)s)",
    )


# What each mode does to SAM 3's video predictor (runtime/concepts.py: apply_concepts_mode for
# the detector, apply_tracker_mode for the tracker).
SAM3_VIDEO_MODES = {
    "baseline": "detector and tracker in fp32 (Meta's)",
    "fast": "the same computation as baseline",
    "furious": "detector (ViT, text encoder, DETR) and tracker (neck, memory attention, "
    "memory encoder, mask decoder) in the device's native reduced precision (bf16; fp32 on "
    "a CPU without native bf16)",
    "int8": "the ViT's Linear layers int8 (CPU only), the rest of the detector and the "
    "tracker as in furious (the tracker is not quantised)",
}


def check_flags(args: argparse.Namespace) -> list[str] | None:
    """The phrases of --text (None without it), the concept flags checked; concept flags
    without --text, or --text with --prompts, are usage errors."""
    if args.text is None:
        given = [
            flag
            for flag, value, default in (
                ("--concept-frame", args.concept_frame, 0),
                ("--tracker", args.tracker, DEFAULT_TRACKER),
                ("--score-thresh", args.score_thresh, None),
                ("--max-instances", args.max_instances, DEFAULT_MAX_INSTANCES),
                ("--sam3-weights", args.sam3_weights, None),
                ("--sam3-size", args.sam3_size, "full"),
                ("--box", args.box, None),
                ("--direction", args.direction, DEFAULT_DIRECTION),
                ("--click", args.click, None),
            )
            if value != default
        ]
        if given:
            raise UsageError(f"{given[0]} seeds objects from concepts: give --text PHRASES too")
        return None
    if args.mode not in VIDEO_MODES and args.tracker != "sam3":
        raise UsageError(
            f"--mode {args.mode} runs with --tracker sam3 only; --tracker sam2.1 tracks in "
            f"the video modes {', '.join(VIDEO_MODES)}"
        )
    if args.prompts is not None:
        raise UsageError(
            "--text and --prompts exclude each other: the objects come from SAM 3's "
            "instances of the phrases, or from the prompts file"
        )
    phrases = list(parse_text(args.text))  # run --task concepts' rules
    if args.score_thresh is not None and not 0.0 <= args.score_thresh <= 1.0:  # NaN too
        raise UsageError(f"--score-thresh must be a number in [0, 1], got {args.score_thresh}")
    if args.concept_frame < 0:
        raise UsageError(f"--concept-frame must be >= 0, got {args.concept_frame}")
    if args.tracker != "sam3":
        for flag, value, default in (
            ("--box", args.box, None),
            ("--direction", args.direction, DEFAULT_DIRECTION),
        ):
            if value != default:
                raise UsageError(f"{flag} is a --tracker sam3 option (SAM 3's video predictor)")
    no_clicks_with(args)
    parse_clicks(args.click)
    if args.box is not None:
        parse_box(args.box)
    concepts_spec(args, args.device)  # contradictions (--sam3-size tiny without random)
    return phrases


def parse_box(text: str) -> tuple[float, float, float, float]:
    """--box X1,Y1,X2,Y2 as four numbers (its place in the frame is checked once the video
    is read)."""
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 4:
        raise UsageError(f"--box must be four numbers X1,Y1,X2,Y2 (pixels), got {text!r}")
    x1, y1, x2, y2 = values
    return x1, y1, x2, y2


def check_frame(args: argparse.Namespace, num_frames: int) -> None:
    if args.concept_frame >= num_frames:
        raise UsageError(
            f"--concept-frame {args.concept_frame} is past the video's last frame "
            f"({num_frames} frames: 0 to {num_frames - 1})"
        )


def score_thresh(args: argparse.Namespace) -> float:
    if args.score_thresh is not None:
        return args.score_thresh
    return default_score_thresh(args.random_weights)  # the service's rule too


def find_seeds(args: argparse.Namespace, phrases: list[str], frame: Any) -> list[ConceptObject]:
    """SAM 3 on the frame: the objects to track (ids 1..N by decreasing score). The model
    is loaded for this and dropped before returning. No instance: a usage error saying
    what was asked."""
    from sam2serve.concepts.video_seed import concept_seeds
    from sam2serve.concepts.weights import WeightsError
    from sam2serve.runtime.concepts import describe_concepts_mode, load_concepts_in_mode

    thresh = score_thresh(args)
    start = time.perf_counter()
    try:  # SAM 3 in the tracker's --mode (furious: bf16 where native, as the tracker)
        concepts = load_concepts_in_mode(concepts_spec(args, args.device), args.mode)
    except WeightsError as exc:
        raise UsageError(str(exc)) from None
    what = "random weights" if args.random_weights else "weights"
    info_line(
        f"SAM 3 ({args.sam3_size}, {what}) loaded in {time.perf_counter() - start:.1f} s; "
        + describe_concepts_mode(args.mode, concepts)
    )
    if args.random_weights and args.score_thresh is None:
        warning_line("random weights score about 0.25: seeding every instance (--score-thresh 0)")
    seeds = concept_seeds(
        concepts, frame, phrases, score_thresh=thresh, max_instances=args.max_instances
    )
    del concepts
    gc.collect()
    if not seeds:
        raise UsageError(
            f"SAM 3 found no instance of {', '.join(map(repr, phrases))} scored above "
            f"{thresh:g} on frame {args.concept_frame}: nothing to track (lower "
            "--score-thresh, or name the objects differently)"
        )
    info_line(
        f"SAM 3 seeded {len(seeds)} object(s) on frame {args.concept_frame}: "
        + ", ".join(f"{i + 1} {s.phrase} ({s.score:.2f})" for i, s in enumerate(seeds))
    )
    return [
        ConceptObject(i + 1, seed.phrase, seed.score, seed.mask, seed.box)
        for i, seed in enumerate(seeds)
    ]


def summary(args: argparse.Namespace, phrases: list[str], objects: list[ConceptObject]) -> dict:
    """What track.json records of the concepts: the request and each seeded object."""
    return {
        "phrases": phrases,
        "frame": args.concept_frame,
        "score_thresh": score_thresh(args),
        "max_instances": args.max_instances,
        "sam3_size": args.sam3_size,
        "objects": [obj.as_json() for obj in objects],
    }
