"""deploy/ and docs/deploy.md agree with the recipe: every image a deploy file names is one
docs/deploy.md builds from deploy/Containerfile, and the recipe keeps its entrypoint,
default command, cache volume, user and health check (first tier: reads files only; the
image itself is built and run by test_container_image.py, second tier)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE_NAME = re.compile(r"\bsam2serve:(cpu|cuda)[a-z0-9-]*")


def built_tags() -> set[str]:
    """The ``-t sam2serve:TAG`` of every build command in docs/deploy.md."""
    text = (REPO / "docs" / "deploy.md").read_text()
    builds = re.findall(r"podman build[^`]*?-t (sam2serve:[a-z0-9-]+)", text.replace("\\\n", " "))
    return set(builds)


def test_every_image_a_deploy_file_names_is_built_by_the_docs():
    tags = built_tags()
    assert {"sam2serve:cpu", "sam2serve:cuda", "sam2serve:cpu-ray"} <= tags
    named = {
        path.name: {match.group(0) for match in IMAGE_NAME.finditer(path.read_text())}
        for path in sorted((REPO / "deploy").glob("*.yaml"))
    }
    assert named["rayservice_tiny.yaml"] == {"sam2serve:cpu-ray"}
    for name, images in named.items():
        # cuda-ray is the cpu-ray build with the CUDA index (the docs' table says so)
        unknown = {image for image in images if image.replace("cuda", "cpu") not in tags}
        assert not unknown, f"deploy/{name} names images docs/deploy.md does not build: {unknown}"


def test_the_recipe_keeps_its_contract():
    recipe = (REPO / "deploy" / "Containerfile").read_text()
    assert 'ENTRYPOINT ["sam2serve"]' in recipe
    assert 'CMD ["serve", "--host", "0.0.0.0"]' in recipe
    assert 'VOLUME ["/var/cache/sam2serve"]' in recipe
    assert "SAM2SERVE_CACHE=/var/cache/sam2serve" in recipe
    assert re.search(r"^USER 10001", recipe, re.MULTILINE)
    assert re.search(r"^HEALTHCHECK .*\n.*/readyz", recipe, re.MULTILINE)
    assert re.search(r"^FROM service AS baked$", recipe, re.MULTILINE)
    # the build context: the package and what installs it, never tests or caches
    ignore = (REPO / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:4] == ["*", "!pyproject.toml", "!README.md", "!sam2serve"]
