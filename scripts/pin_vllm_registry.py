"""Pin a vLLM release's MTP registry entries as test data, from its wheel (never installed).

    python3 -m pip download --no-deps vllm==0.33.0 -d /tmp/v033
    python scripts/pin_vllm_registry.py /tmp/v033/vllm-0.33.0-*.whl tests/data/vllm_0.33.0_mtp_registry.json

Writes the version, the wheel's name and sha256, registry.py's path and sha256 inside it, and
every MTP drafter architecture with its (module, class); tests/test_families.py checks that
each has a family row or a reason in `families.UNSUPPORTED`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

from fixtures.vllm_registry import MTP_DICTS, REGISTRY_FILE, mtp_architectures


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/pin_vllm_registry.py VLLM_WHEEL OUT.json")
    wheel, out = Path(sys.argv[1]), Path(sys.argv[2])
    version = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as z:
        raw = z.read(REGISTRY_FILE)
    archs = mtp_architectures(raw.decode("utf-8"))
    doc = {
        "vllm": version,
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "file": REGISTRY_FILE,
        "file_sha256": hashlib.sha256(raw).hexdigest(),
        "dicts": list(MTP_DICTS),
        "how": "python3 -m pip download --no-deps vllm==" + version + "; scripts/pin_vllm_registry.py",
        "mtp_architectures": {a: list(archs[a]) for a in sorted(archs)},
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{out}: {len(archs)} MTP architectures of vLLM {version}", file=sys.stderr)


if __name__ == "__main__":
    main()
