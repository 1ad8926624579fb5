"""Findings: what ``inspect`` (and the converters' checks) found wrong or noteworthy."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Severity(str, Enum):
    ERROR = "error"  # vLLM will fail or load wrong weights
    WARNING = "warning"  # works, but not what the config says
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One audit result: a stable ``code``, the module it concerns and a sentence."""

    severity: Severity
    code: str
    module: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {
            "severity": self.severity.value,
            "code": self.code,
            "module": self.module,
            "message": self.message,
        }
