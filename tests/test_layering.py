"""The layering of docs/architecture.md, checked on the import graph: no package imports a
package above it (modeling <- engine <- runtime <- surfaces), and the modules the CLI reads
before deciding what to do import no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sam2serve"

# Lower numbers are lower layers; a module may import its own layer and those below.
LAYERS = {
    "config": 0,
    "cache": 0,  # the cache root (torch-free)
    "download": 0,  # one file over HTTP: resumed, retried, checked (torch-free)
    "options": 0,  # settings fields as flags (torch-free)
    "config_text": 0,  # configuration text -> values, one strict parser per kind (torch-free)
    "modeling": 1,
    "checkpoint": 2,
    "samples": 2,
    "engine": 3,
    "concepts": 3,  # SAM 3 concept segmentation (transformers Sam3Model + Meta key map)
    "runtime": 4,
    "store": 4.5,  # persistent embeddings (engine's Embedding, runtime identity), under the surfaces
    "server": 5,
    "bench": 5,
    "compat": 5,  # Meta's image API (SAM2ImagePredictor, ...) over engine and runtime
    "cluster": 6,  # the service's app as a Ray Serve application
    "labelstudio": 6,  # the service's app as a Label Studio ML backend
    "commands": 7,
    "cli": 7,
    "__main__": 8,
}
FACADE = "__init__"  # sam2serve/__init__.py re-exports the library API


def imports_of(path: Path) -> set[str]:
    """The sam2serve packages (first component under sam2serve) ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "sam2serve" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_no_package_imports_a_layer_above_it():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        package = parts[0]
        if package == FACADE:
            continue
        assert package in LAYERS, f"{package}: add it to LAYERS (and to docs/architecture.md)"
        for target in imports_of(path):
            assert target in LAYERS or target == FACADE, f"{path}: unknown package {target}"
            if target != FACADE and LAYERS[target] > LAYERS[package]:
                violations.append(f"{path.relative_to(PACKAGE.parent)} imports sam2serve.{target}")
    assert not violations, "imports that point up the layers:\n" + "\n".join(violations)


@pytest.mark.parametrize(
    "module",
    [
        "sam2serve.config",
        "sam2serve.config_text",
        "sam2serve.download",
        "sam2serve.engine.amg_params",
        "sam2serve.engine.formats",
        "sam2serve.engine.prompts",
        "sam2serve.runtime.modes",
        "sam2serve.runtime.backends",
        "sam2serve.runtime.spec",
        "sam2serve.runtime.threads",
        "sam2serve.server.settings",
        "sam2serve.store.identity",
        "sam2serve.store.location",
        "sam2serve.labelstudio.options",
    ],
)
def test_vocabulary_modules_import_no_torch(module):
    """What the CLI, config files and the bench check names against loads in milliseconds."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
