"""Release basics: one version (pyproject.toml) that the image and the changelog follow, one license."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _project_field(pattern: str) -> str:
    found = re.search(pattern, PYPROJECT, re.M)
    assert found, f"pyproject.toml has no line matching {pattern}"
    return found.group(1)


VERSION = _project_field(r'^version = "([^"]+)"$')
LICENSE = _project_field(r'^license = "([^"]+)"$')


def test_the_image_is_labelled_and_tagged_with_the_package_version_and_license():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert re.search(rf"^ARG TIDEMARK_VERSION={re.escape(VERSION)}$", dockerfile, re.M)
    assert f"-t tidemark:{VERSION} " in dockerfile  # the build command the header shows
    assert f'org.opencontainers.image.licenses="{LICENSE}"' in dockerfile


def test_the_changelog_has_a_section_for_the_package_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(VERSION)}\]?\b", changelog, re.M)
    assert re.search(r"^## \[?Unreleased\]?$", changelog, re.M)


def test_the_license_file_is_the_one_pyproject_names():
    assert LICENSE == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
