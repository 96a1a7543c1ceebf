"""The type checker over the package, as .ci/run runs it before the tests: mypy with the
configuration in pyproject.toml (strict on engine/, modeling/, runtime/, concepts/; a baseline
elsewhere). A type error anywhere in sam2serve/ fails this test with mypy's report.

mypy's cache is the repository's .mypy_cache (the one `python -m mypy` at the root uses), so a
run after .ci/run's, or a second local run, re-checks only the files that changed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_type_checks():
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"mypy found type errors:\n{report}"
    assert "Success: no issues found" in report, report


def test_every_type_ignore_names_its_error_code_and_a_reason():
    """`# type: ignore[code]  # reason`: mypy checks the code (ignore-without-code); the
    reason, one line beside it, is the house rule this checks."""
    bare = []
    for path in sorted((ROOT / "sam2serve").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "# type: ignore" not in line:
                continue
            rest = line.split("# type: ignore", 1)[1]
            has_code = rest.startswith("[")
            reason = rest.split("]", 1)[1] if has_code and "]" in rest else ""
            if not has_code or not reason.strip().lstrip("#").strip():
                bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bare, "type: ignore without an error code and a reason:\n" + "\n".join(bare)
