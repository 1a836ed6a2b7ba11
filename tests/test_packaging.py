"""What an install ships: every data file the packages read is package data, and the metadata
is the kind current setuptools builds without a deprecation warning."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "calibrate", "simulator", "app")


def globbed(path: Path, pattern: str) -> bool:
    """Whether setuptools' package-data glob takes this file: '*' stays inside one folder."""
    parts = pattern.split("/")
    return len(parts) == len(path.parts) and all(fnmatch.fnmatch(p, q) for p, q in zip(path.parts, parts))


def test_every_data_file_of_the_packages_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = config["tool"]["setuptools"]["package-data"]
    missing = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(ROOT)
            owners = [name for name in declared if relative.parts[:len(name.split("."))] == tuple(name.split("."))]
            if not any(globbed(relative.relative_to(Path(*owner.split("."))), pattern)
                       for owner in owners for pattern in declared[owner]):
                missing.append(str(relative))
    assert not missing, f"not in [tool.setuptools.package-data], so not in a wheel: {missing}"


def test_the_license_is_an_spdx_string() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(config["project"]["license"], str)  # a TOML table is deprecated (setuptools >= 77)
    assert any(r.replace(" ", "").startswith("setuptools>=") and int(r.split(">=")[1].split(".")[0]) >= 77
               for r in config["build-system"]["requires"])
