"""The entry point's process settings."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = (
    "import os, sys\n"
    "from mtpconv.cli import main\n"
    "try:\n"
    "    main(['--help'])\n"
    "except SystemExit:\n"
    "    pass\n"
    "sys.stderr.write(os.environ.get('OMP_WAIT_POLICY', '<unset>') + ' ' + str('torch' in sys.modules))\n"
)


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_threads_sleep_unless_the_user_says_otherwise(given: str | None, expected: str) -> None:
    """Set before torch is imported (libgomp reads it once, at load); a user's own value wins."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    assert done.stderr.split()[-2:] == [expected, "False"]
