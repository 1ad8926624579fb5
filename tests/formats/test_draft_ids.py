"""The ids-file contract (DESIGN §5): what is written, what is refused, by every caller."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from mtpconv.checkpoint.digests import sha256_file
from mtpconv.errors import DraftVocabError, ManifestError
from mtpconv.formats.draft_ids import load_draft_vocab_ids, save_draft_vocab_ids, sidecar_path
from mtpconv.vllm_plugin.settings import load_draft_ids

# --- load_draft_vocab_ids ---------------------------------------------------------------


class _Payload:
    """Unpickling this would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (str(self.marker),))


def test_ids_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "ids.pt"
    torch.save(torch.tensor([0, 3, 9], dtype=torch.int64), p)
    assert load_draft_vocab_ids(p, 10).tolist() == [0, 3, 9]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (torch.tensor([[0, 1]], dtype=torch.int64), r"shape \(1, 2\); expected a 1-D"),
        (torch.tensor([0, 1], dtype=torch.int32), "holds torch.int32 ids; expected torch.int64"),
        (torch.tensor([0.0, 1.0]), "holds torch.float32 ids"),
        (torch.tensor([3, 1], dtype=torch.int64), "is not sorted ascending"),
        (torch.tensor([1, 3, 3], dtype=torch.int64), "lists id 3 more than once"),
        (torch.tensor([1, 10], dtype=torch.int64), r"has id 10, outside the vocabulary \[0, 10\)"),
        (torch.tensor([-1, 2], dtype=torch.int64), "has id -1, outside"),
        (torch.zeros(0, dtype=torch.int64), "is empty"),
        ({"ids": torch.tensor([1])}, "holds a dict, not a tensor"),
        ([1, 2, 3], "holds a list, not a tensor"),
    ],
)
def test_ids_file_refusals(tmp_path: Path, obj: object, message: str) -> None:
    p = tmp_path / "ids.pt"
    torch.save(obj, p)
    with pytest.raises(DraftVocabError, match=message) as info:
        load_draft_vocab_ids(p, 10)
    assert str(p) in str(info.value)


@pytest.mark.parametrize("writer", ["torch.save", "raw pickle"])
def test_malicious_pickle_refused_without_executing(tmp_path: Path, writer: str) -> None:
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.pt"
    payload = [_Payload(marker), torch.tensor([1, 2])]
    if writer == "torch.save":
        torch.save(payload, p)
    else:
        p.write_bytes(pickle.dumps(payload, protocol=2))
    # The payload works: an unrestricted unpickle would create the marker.
    pickle.loads(pickle.dumps(_Payload(tmp_path / "control")))
    assert (tmp_path / "control").exists()
    with pytest.raises(DraftVocabError, match=r"evil\.pt is not a plain tensor saved by torch"):
        load_draft_vocab_ids(p, 10)
    assert not marker.exists()


def test_missing_and_garbage_ids_files(tmp_path: Path) -> None:
    with pytest.raises(DraftVocabError, match=r"nope\.pt does not exist"):
        load_draft_vocab_ids(tmp_path / "nope.pt", 10)
    (tmp_path / "junk.pt").write_bytes(b"\x00garbage")
    with pytest.raises(DraftVocabError, match=r"junk\.pt is not a plain tensor"):
        load_draft_vocab_ids(tmp_path / "junk.pt", 10)


# --- save_draft_vocab_ids and the sidecar name ------------------------------------------


def test_save_sorts_casts_and_round_trips(tmp_path: Path) -> None:
    p = save_draft_vocab_ids(np.array([9, 0, 3], dtype=np.int32), tmp_path / "ids.pt")
    plain = torch.load(p, map_location="cpu", weights_only=True)  # what SGLang does with the file
    assert plain.dtype == torch.int64 and plain.tolist() == [0, 3, 9]
    assert load_draft_vocab_ids(p, 10).tolist() == [0, 3, 9]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["ids.pt"]  # no temporary file left


def test_sidecar_path_appends_json(tmp_path: Path) -> None:
    assert sidecar_path(tmp_path / "mtp_draft_vocab_ids.pt") == tmp_path / "mtp_draft_vocab_ids.pt.json"
    assert sidecar_path("ids").name == "ids.json"


# --- the vLLM plugin uses the same validator ---------------------------------------------


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (torch.tensor([1, 3, 3], dtype=torch.int64), "lists id 3 more than once"),
        (torch.tensor([3, 1], dtype=torch.int64), "is not sorted ascending"),
        (torch.tensor([1, 10], dtype=torch.int64), r"has id 10, outside the vocabulary \[0, 10\)"),
        (torch.tensor([0, 1], dtype=torch.int32), "holds torch.int32 ids"),
        ({"ids": torch.tensor([1])}, "holds a dict, not a tensor"),
    ],
)
def test_plugin_refuses_what_the_cli_refuses(tmp_path: Path, obj: object, message: str) -> None:
    p = tmp_path / "ids.pt"
    torch.save(obj, p)
    with pytest.raises(DraftVocabError, match=message) as cli:
        load_draft_vocab_ids(p, 10)
    with pytest.raises(ManifestError, match=message) as plugin:
        load_draft_ids(p, sha256_file(p), 10)
    assert str(plugin.value) == str(cli.value)


def test_plugin_checks_the_digest_first_and_accepts_a_good_file(tmp_path: Path) -> None:
    p = save_draft_vocab_ids(torch.tensor([2, 4]), tmp_path / "ids.pt")
    assert load_draft_ids(p, sha256_file(p), 10).tolist() == [2, 4]
    with pytest.raises(ManifestError, match="sha256"):
        load_draft_ids(p, "0" * 64, 10)
    (tmp_path / "junk.pt").write_bytes(b"\x00garbage")
    with pytest.raises(ManifestError, match=r"junk\.pt is not a plain tensor saved by torch"):
        load_draft_ids(tmp_path / "junk.pt", sha256_file(tmp_path / "junk.pt"), 10)
    with pytest.raises(ManifestError, match="is listed in mtpconv.json but missing"):
        load_draft_ids(tmp_path / "gone.pt", "0" * 64, 10)
