"""The numbers fitted on a device's profile (calibrate/fitting/device.py fits them): its own efficiency
curves and the framework terms. The simulator reads them, handed in or from the file beside the
profile that names the profile's digest; it never fits. No torch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from simulator.cost.efficiency import EfficiencyCurve
from simulator.cost.profile_format import Profile

FORMAT = "servecast-fitted-terms"


@dataclass(frozen=True)
class FittedTerms:
    curves: dict[str, EfficiencyCurve] = field(default_factory=dict)
    framework: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"curves": {k: c.to_dict() for k, c in self.curves.items()}, "framework": dict(self.framework)}

    @classmethod
    def from_dict(cls, raw: dict) -> "FittedTerms":
        return cls({k: EfficiencyCurve.from_dict(v) for k, v in raw["curves"].items()}, dict(raw["framework"]))

    @staticmethod
    def path_beside(profile_path: str | Path) -> Path:
        path = Path(profile_path)
        return path.with_name(path.name + ".fitted.json")

    @staticmethod
    def digest(profile_path: str | Path) -> str:
        return hashlib.sha256(Path(profile_path).read_bytes()).hexdigest()

    def save_beside(self, profile_path: str | Path) -> Path:
        out = self.path_beside(profile_path)
        out.write_text(json.dumps({"format": FORMAT, "profile_sha256": self.digest(profile_path), **self.to_dict()}))
        return out

    @classmethod
    def beside(cls, profile_path: str | Path | Profile | None) -> "FittedTerms | None":
        """The terms in the file beside a profile file, if it was fitted on this very file (its
        digest); None otherwise (a profile in memory has no file beside it)."""
        if not isinstance(profile_path, (str, Path)):
            return None
        path = cls.path_beside(profile_path)
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text())
            if raw.get("format") != FORMAT or raw.get("profile_sha256") != cls.digest(profile_path):
                return None  # stale: fitted on another version of the profile
            return cls.from_dict(raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # unreadable: fitted again where it is needed, as if it were not there
