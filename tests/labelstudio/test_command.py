"""``sam2serve labelstudio``: its help, and every mistake one line with exit 2, found before
the model loads."""

from __future__ import annotations

import contextlib
import io

import pytest

from sam2serve import cli


def run_cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(list(argv))
    return code, stdout.getvalue(), stderr.getvalue()


def test_help_names_the_endpoints_and_flags():
    code, out, _ = run_cli("labelstudio", "--help")
    assert code == 0
    for text in (
        "/predict",
        "/setup",
        "--label-studio-url",
        "--preannotate",
        "--local-root",
        "--allow-fetch-host",
        "--no-public-fetch",
        "--video-max-frames",
        "--concepts",
        "--sam3-size",
        "--concept-score-thresh",
        "--concept-max-instances",
        "--concept-clicks",
    ):
        assert text in out
    assert "(default: 9090;" in out
    code, out, _ = run_cli("--help")
    assert "labelstudio" in out


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        (["--preannotate", "everything"], {}, "--preannotate: invalid choice"),
        (["--local-root", "/no/such/folder"], {}, "--local-root: local_roots: '/no/such/folder'"),
        (["--label-studio-url", "localhost:8080"], {}, "--label-studio-url: url: expected"),
        ([], {"LABEL_STUDIO_URL": "ftp://host"}, "$LABEL_STUDIO_URL: url: expected"),
        (["--fetch-timeout", "0"], {}, "--fetch-timeout: fetch_timeout_s must be"),
        (["--video-max-frames", "0"], {}, "--video-max-frames: video_max_frames must be"),
        (["--allow-fetch-host", "http://x/"], {}, "--allow-fetch-host: 'http://x/': expected"),
        (["--allow-fetch-host", "host:99999"], {}, "the port is not a number"),
        (["--port", "70000"], {}, "--port must be an integer in [1, 65535], got 70000"),
        (["--max-objects", "0"], {}, "--max-objects"),
        (["--random-weight"], {}, "unknown flag --random-weight; did you mean --random-weights?"),
        (
            ["--concept-score-thresh", "2"],
            {},
            "--concept-score-thresh: concept_score_thresh must be a number in [0, 1]",
        ),
        (["--concept-max-labels", "0"], {}, "--concept-max-labels: concept_max_labels must be"),
        (["--concepts", "--sam3-weights", "/x"], {}, "--sam3-weights and --random-weights"),
        (["--concepts", "--sam3-size", "huge"], {}, "--sam3-size: invalid choice"),
        (["--concept-clicks", "sam4"], {}, "--concept-clicks: invalid choice: 'sam4'"),
    ],
)
def test_usage_errors_are_one_line(monkeypatch, argv, env, fragment):
    monkeypatch.delenv("LABEL_STUDIO_URL", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, _, err = run_cli("labelstudio", "--random-weights", *argv)
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("sam2serve: error: ")]
    assert len(errors) == 1 and fragment in errors[0], err
