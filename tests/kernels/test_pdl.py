"""The PDL switch (mtpconv.kernels.pdl) read from the environment (CPU: no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from mtpconv.kernels import pdl
from mtpconv.kernels.pdl import Pdl

CUDA = torch.device("cuda", 0)  # a device object only: nothing is launched


def test_off_by_default_and_off_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pdl.ENV, raising=False)
    monkeypatch.setattr(pdl, "_hopper", lambda index: True)
    assert pdl.setting(CUDA) is Pdl.OFF
    monkeypatch.setenv(pdl.ENV, "1")
    assert pdl.setting(torch.device("cpu")) is Pdl.OFF


def test_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pdl, "_hopper", lambda index: True)
    for value, want in (
        ("0", Pdl.OFF),
        ("off", Pdl.OFF),
        ("", Pdl.OFF),
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
    monkeypatch.setattr(pdl, "_hopper", lambda index: False)
    monkeypatch.setenv(pdl.ENV, "late")
    assert pdl.setting(CUDA) is Pdl.OFF
