"""``mtpconv verify``: a variant against its manifest; ``publish`` refuses what it finds.

Variants are real conversions of tiny checkpoints: a plain local source (linked
shards recorded by size and mtime) and a `hf download --local-dir` source
(linked shards with a known sha256).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.publish import plan_publish
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.commands.verify import verify_variant
from mtpconv.errors import VerifyError
from mtpconv.manifest import read_manifest
from mtpconv.variant_check import FileState
from tests.helpers import HUB_COMMIT, run_cli


def _flip_byte(path: Path, *, keep_mtime: bool = False) -> None:
    """Invert one byte in the data region, in place (a hard link sees it too)."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size - 3)
        b = f.read(1)
        f.seek(st.st_size - 3)
        f.write(bytes([b[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _variant(tmp_path: Path, *, known_digests: bool = False) -> tuple[Path, Path, str, str]:
    """(source, variant, a linked shard, the rewritten shard)."""
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5", shards=3))
    if known_digests:  # what `hf download --local-dir` leaves: the LFS sha256 per file
        meta = src / ".cache" / "huggingface" / "download"
        meta.mkdir(parents=True)
        for p in src.glob("*.safetensors"):
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            (meta / f"{p.name}.metadata").write_text(f"{HUB_COMMIT}\n{digest}\n{time.time() + 5}\n")
    dst = tmp_path / "v"
    plan = quantize_mtp(str(src), dst, device="cpu").plan
    return src, dst, plan.linked[0].file, plan.rewritten[0].file


def test_fresh_variant_verifies_and_linked_shards_are_not_hashed(tmp_path: Path) -> None:
    _, dst, linked, rewritten = _variant(tmp_path)
    manifest = read_manifest(dst)
    assert manifest is not None
    assert linked in manifest.unhashed and linked not in manifest.files
    assert manifest.files[rewritten] == hashlib.sha256((dst / rewritten).read_bytes()).hexdigest()
    report = verify_variant(dst)
    assert report.ok
    states = {c.path: c.state for c in report.files}
    assert states[linked] is FileState.CONSISTENT and states[rewritten] is FileState.OK
    assert {c.path for c in report.files if c.sha256 is None} == set(manifest.unhashed)
    full = verify_variant(dst, full=True)
    assert full.ok and all(c.sha256 is not None for c in full.files)


def test_flipped_byte_in_linked_shard_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, dst, linked, _ = _variant(tmp_path)
    _flip_byte(dst / linked)
    code, out, err = run_cli(["verify", str(dst)], capsys)
    assert code == 1 and linked in err and "restamped" in err
    with pytest.raises(VerifyError, match=linked):
        plan_publish(dst, offline=True)


def test_flipped_byte_in_rewritten_shard_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, dst, _, rewritten = _variant(tmp_path)
    _flip_byte(dst / rewritten, keep_mtime=True)
    code, out, err = run_cli(["verify", str(dst), "--json", "-q"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["bad"] == [rewritten]
    assert rewritten in err
    with pytest.raises(VerifyError, match=rf"^{rewritten} in .* does not match its sha256"):
        plan_publish(dst, offline=True)


def test_known_digest_of_linked_shard_catches_a_flip_that_keeps_mtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, dst, linked, _ = _variant(tmp_path, known_digests=True)
    manifest = read_manifest(dst)
    assert manifest is not None and linked in manifest.files and not manifest.unhashed.get(linked)
    assert run_cli(["verify", str(dst)], capsys)[0] == 0
    _flip_byte(dst / linked, keep_mtime=True)
    code, _, err = run_cli(["verify", str(dst)], capsys)
    assert code == 1 and f"{linked} (changed)" in err
    with pytest.raises(VerifyError, match=linked):
        plan_publish(dst, offline=True)


def test_publish_hashes_each_file_once_for_verification_and_upload(tmp_path: Path) -> None:
    _, dst, linked, _ = _variant(tmp_path)
    plan = plan_publish(dst, offline=True, repo_id="me/x-mtpfp8")
    digests = {i.path_in_repo: i.sha256 for i in plan.items if i.local is not None}
    assert digests[linked] == hashlib.sha256((dst / linked).read_bytes()).hexdigest()
    assert all(d is not None for rel, d in digests.items() if rel != "mtpconv.json")


def test_missing_and_unlisted_files_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, dst, linked, _ = _variant(tmp_path)
    (dst / linked).unlink()
    code, _, err = run_cli(["verify", str(dst)], capsys)
    assert code == 1 and linked in err and "missing" in err
    assert run_cli(["verify", str(tmp_path / "src")], capsys)[0] == 1  # no manifest


def test_empty_directory_is_a_verify_error_that_names_no_other_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(VerifyError, match="no mtpconv.json"):
        verify_variant(tmp_path)
    code, out, err = run_cli(["verify", str(tmp_path)], capsys)
    assert (code, out) == (1, "")
    assert err.startswith("Error: ") and err.count("\n") == 1 and "publish" not in err


def test_old_manifest_without_unhashed_still_reads(tmp_path: Path) -> None:
    _, dst, linked, _ = _variant(tmp_path)
    doc = json.loads((dst / "mtpconv.json").read_text())
    # as mtpconv wrote it before `unhashed`: every file with its sha256
    for rel in doc.pop("unhashed"):
        doc["files"][rel] = hashlib.sha256((dst / rel).read_bytes()).hexdigest()
    (dst / "mtpconv.json").write_text(json.dumps(doc))
    report = verify_variant(dst)
    assert report.ok and all(c.known for c in report.files)
    _flip_byte(dst / linked, keep_mtime=True)
    assert [c.path for c in verify_variant(dst).bad] == [linked]
