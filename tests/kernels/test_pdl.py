"""The PDL switch (mtpconv.kernels.pdl) read from the environment (CPU: no GPU needed)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from mtpconv.kernels import pdl
from mtpconv.kernels.pdl import Pdl

CUDA = torch.device("cuda", 0)  # a device object only: nothing is launched


def test_default_late_where_measured_and_off_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pdl.ENV, raising=False)
    monkeypatch.setattr(pdl, "hopper", lambda index: True)
    monkeypatch.setattr(pdl, "default_on", lambda: True)
    assert pdl.setting(CUDA) is Pdl.LATE
    monkeypatch.setattr(pdl, "default_on", lambda: False)
    assert pdl.setting(CUDA) is Pdl.OFF
    monkeypatch.setattr(pdl, "default_on", lambda: True)
    monkeypatch.setenv(pdl.ENV, "1")
    assert pdl.setting(torch.device("cpu")) is Pdl.OFF


def test_default_needs_triton_and_cuda_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset means late only with Triton >= 3.6 and CUDA >= 12.4 (what was measured)."""
    for triton_v, cuda_v, want in (
        ("3.6.0", "13.0", True),
        ("3.7.1+git", "12.4", True),
        ("3.5.1", "13.0", False),
        ("3.6.0", "12.3", False),
        ("3.6.0", None, False),
    ):
        monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__=triton_v))
        monkeypatch.setattr(torch.version, "cuda", cuda_v)
        pdl.default_on.cache_clear()
        assert pdl.default_on() is want, (triton_v, cuda_v)
    pdl.default_on.cache_clear()


def test_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pdl, "hopper", lambda index: True)
    for value, want in (
        ("0", Pdl.OFF),
        ("off", Pdl.OFF),
        ("1", Pdl.EARLY),
        ("early", Pdl.EARLY),
        (" Late ", Pdl.LATE),
    ):
        monkeypatch.setenv(pdl.ENV, value)
        assert pdl.setting(CUDA) is want
    monkeypatch.setenv(pdl.ENV, "yes")
    with pytest.raises(ValueError, match=pdl.ENV):
        pdl.setting(CUDA)


def test_no_pdl_before_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pdl, "hopper", lambda index: False)
    monkeypatch.setenv(pdl.ENV, "late")
    assert pdl.setting(CUDA) is Pdl.OFF


def test_launch_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weight kernels take the mode as it is; producers let dependents in at once (mode 1)
    whenever PDL is on, and stay off when it is off."""
    monkeypatch.setattr(pdl, "hopper", lambda index: True)
    monkeypatch.setenv(pdl.ENV, "late")
    assert pdl.launch(CUDA) == {"PDL": 2, "launch_pdl": True}
    assert pdl.producer_launch(CUDA) == {"PDL": 1, "launch_pdl": True}
    monkeypatch.setenv(pdl.ENV, "off")
    assert pdl.launch(CUDA) == {"PDL": 0, "launch_pdl": False}
    assert pdl.producer_launch(CUDA) == {"PDL": 0, "launch_pdl": False}
