"""``sam2serve bench --task concepts``: the flags and the handler of the SAM 3 concept bench
(:mod:`sam2serve.bench.concepts`); ``commands/bench.py`` adds them and hands over."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sam2serve.commands.common import EXIT_OK, PROG, UsageError, command_line, positive_int
from sam2serve.commands.concepts_flags import add_concepts_flags, concepts_spec
from sam2serve.config_text import Integer, Number
from sam2serve.runtime.modes import MODES

CONCEPTS_TASK = "concepts"
# Every mode (sam2serve.runtime.modes; what each does to SAM 3: runtime/concepts.py); the
# default list leaves out fast, which computes what baseline does.
CONCEPT_MODES = tuple(MODES)
DEFAULT_CONCEPT_MODES = ("baseline", "furious", "int8")


def add_concepts_bench_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(f"concepts (--task {CONCEPTS_TASK}: SAM 3)")
    add_concepts_flags(group)
    group.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        metavar="N",
        help="timed repeats (default: %(default)s)",
    )
    group.add_argument(
        "--warmup",
        type=Integer(low=0),
        default=1,
        metavar="N",
        help="untimed repeats first (default: %(default)s)",
    )
    group.add_argument(
        "--phrases",
        default="1,10",
        metavar="LIST",
        help="phrase counts, each a row run on the same image encoding (default: %(default)s)",
    )
    group.add_argument(
        "--score-thresh",
        type=Number(0.0, 1.0),
        default=None,
        metavar="T",
        help="score threshold (default: 0 for --task concepts: every query kept, which the "
        "accuracy comparison needs and which makes post-processing its largest; for --task "
        "concepts-video the detection threshold, new objects 0.2 above it, default as "
        "'track --text': 0 under --random-weights, else Meta's 0.5)",
    )
    group.add_argument(
        "--top-k",
        type=positive_int,
        default=20,
        metavar="K",
        help="instances per phrase compared with the baseline, by baseline score "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--host-peak",
        metavar="FILE",
        help="host-peak.py's output saved to a file (fp32/bf16/int8 GFLOP/s lines): each "
        "stage is then also reported as a share of the host's peak",
    )


def _counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--phrases must list phrase counts, e.g. 1,10; got {text!r}") from None


def concepts_bench_command(args: argparse.Namespace) -> int:
    from sam2serve.bench.concepts import (
        ConceptsBenchConfig,
        ConceptsBenchError,
        load_images,
        parse_host_peak,
        run_concepts_bench,
    )
    from sam2serve.bench.concepts_report import concepts_markdown, write_concepts_outputs

    if args.checkpoint:
        raise UsageError("--checkpoint is SAM 2.1's; the concept bench reads --sam3-weights DIR")
    modes = tuple(
        m.strip() for m in (args.modes or ",".join(DEFAULT_CONCEPT_MODES)).split(",") if m.strip()
    )
    unknown = [m for m in modes if m not in CONCEPT_MODES]
    if unknown:
        raise UsageError(
            f"--task {CONCEPTS_TASK} runs the modes {', '.join(CONCEPT_MODES)}; got "
            f"{', '.join(map(repr, unknown))}"
        )
    spec = concepts_spec(args, args.device)
    peak = None
    if args.host_peak:
        try:
            text = Path(args.host_peak).read_text()
        except OSError as exc:
            raise UsageError(f"--host-peak {args.host_peak!r}: {exc.strerror}") from None
        try:
            peak = parse_host_peak(text, Path(args.host_peak).name)
        except ConceptsBenchError as exc:
            raise UsageError(str(exc)) from None
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        config = ConceptsBenchConfig(
            spec=spec,
            modes=modes,
            images=load_images(args.images, args.n),
            phrase_counts=_counts(args.phrases),
            repeats=args.repeats,
            warmup=args.warmup,
            score_thresh=0.0 if args.score_thresh is None else args.score_thresh,
            top_k=args.top_k,
            host_peak=peak,
            command=command_line(args),
        )
    except ConceptsBenchError as exc:
        raise UsageError(str(exc)) from None
    name = args.name or f"concepts_{spec.size}_{args.device.replace(':', '')}"

    def partial(result) -> None:  # each finished mode on disk, in case a later one fails
        write_concepts_outputs(result, Path(args.out_dir), name)

    result = run_concepts_bench(
        config,
        log=lambda line: print(f"{PROG}: bench: {line}", file=sys.stderr),
        after_mode=partial,
    )
    paths = write_concepts_outputs(result, Path(args.out_dir), name)
    print(concepts_markdown(result))
    print(f"{PROG}: bench: wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return EXIT_OK
