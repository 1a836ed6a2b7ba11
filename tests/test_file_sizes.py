"""No source file of the project's packages grows past 400 lines."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "simulator", "calibrate", "app")
MAX_LINES = 400


def test_no_file_over_the_limit():
    sizes = {p.relative_to(ROOT): len(p.read_text().splitlines())
             for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}
    assert len(sizes) > 50, "found too few files: check the paths"
    over = sorted(((n, p) for p, n in sizes.items() if n > MAX_LINES), reverse=True)
    assert not over, f"{len(over)} files over {MAX_LINES} lines:\n" + "\n".join(f"  {p}: {n}" for n, p in over)
