"""Hub repo ids as sources: the HF cache layout (snapshots linking into blobs), offline;
remote headers for inspect, and how they stop at the first Hub failure."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures.checkpoints import Spec, write_checkpoint
from mtpconv.commands.inspect import inspect_checkpoint
from mtpconv.commands.quantize_mtp import quantize_mtp
from mtpconv.manifest import FileStamp, read_manifest
from tests.helpers import HUB_COMMIT, populate_hub_cache, raw_tensors, run_cli

REPO = "acme/tiny-qwen3.5-moe"


@pytest.fixture
def cached_repo(tmp_path: Path) -> Path:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5_moe", quant="nvfp4", vlm=True, shards=3))
    return populate_hub_cache(REPO, src)


def test_quantize_from_repo_id_offline(cached_repo: Path, tmp_path: Path) -> None:
    dst = tmp_path / "v"
    report = quantize_mtp(REPO, dst, device="cpu")
    assert report.linked == 3  # two shards and generation_config.json
    manifest = read_manifest(dst)
    assert manifest is not None
    assert manifest.source["repo_id"] == REPO and manifest.source["path"] is None
    # the blob names are the sha256 of the files they hold
    for name, digest in manifest.source["files"].items():
        assert hashlib.sha256((cached_repo / name).read_bytes()).hexdigest() == digest
    before = raw_tensors(cached_repo)
    after = raw_tensors(dst)
    assert all(after[n] == v for n, v in before.items() if not n.startswith("mtp."))


def test_missing_repo_offline_is_one_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["quantize-mtp", "acme/does-not-exist", "/tmp/nowhere-mtpconv"], capsys)
    assert code == 1 and err.startswith("Error:") and "cache" in err and err.count("\n") == 1


def test_remote_inspect_reads_headers(cached_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """inspect of a repo id fetches configs and safetensors metadata, never tensor data."""
    import huggingface_hub
    from huggingface_hub import errors as hf_errors
    from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo

    from mtpconv.checkpoint.safetensors_io import read_header

    def fake_download(repo_id: str, filename: str, revision: str | None = None, **_: object) -> str:
        assert repo_id == REPO
        path = cached_repo / filename
        if not path.exists():
            raise hf_errors.EntryNotFoundError(f"{filename} not found")
        return str(path)

    def fake_metadata(self: object, repo_id: str, revision: str | None = None, **_: object) -> object:
        index = json.loads((cached_repo / "model.safetensors.index.json").read_text())
        files = {}
        for file in sorted(set(index["weight_map"].values())):
            h = read_header(cached_repo / file)
            tensors = {
                n: TensorInfo(
                    dtype=t.dtype,
                    shape=list(t.shape),  # type: ignore[arg-type]
                    data_offsets=(t.start - h.data_start, t.end - h.data_start),
                )
                for n, t in h.tensors.items()
            }
            files[file] = SafetensorsFileMetadata(metadata=h.metadata or {}, tensors=tensors)
        return SafetensorsRepoMetadata(
            metadata=None, sharded=True, weight_map=index["weight_map"], files_metadata=files
        )

    def fake_info(self: object, repo_id: str, revision: str | None = None, **_: object) -> object:
        assert repo_id == REPO
        return SimpleNamespace(
            sha=HUB_COMMIT, siblings=[SimpleNamespace(rfilename=p.name) for p in cached_repo.iterdir()]
        )

    monkeypatch.setattr("mtpconv.checkpoint.source.hf_hub_download", fake_download, raising=False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", fake_info)
    monkeypatch.setattr(huggingface_hub.HfApi, "get_safetensors_metadata", fake_metadata)
    report = inspect_checkpoint(REPO)
    assert report.family == "qwen3_5_moe" and report.shards == 3
    assert [f.module for f in report.findings if f.code == "plain-declared-quantized"] == ["mtp.fc"]

    # quantize-mtp --dry-run of a repo id plans from the same headers: no weights downloaded
    def no_snapshot(*_: object, **__: object) -> str:
        raise AssertionError("dry run downloaded the snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_snapshot)
    plan = quantize_mtp(REPO, "/nonexistent/out", dry_run=True, device="cpu").plan
    assert [s.file for s in plan.rewritten] == ["model-00003-of-00003.safetensors"]
    assert "mtp.fc" in [lin.module for lin in plan.linears]


def _local_dir_download(src: Path, etag_of: dict[str, str], stamp: float) -> None:
    """What `hf download --local-dir` leaves: per-file metadata with the LFS sha256."""
    meta = src / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    for name, etag in etag_of.items():
        (meta / f"{name}.metadata").write_text(f"{HUB_COMMIT}\n{etag}\n{stamp}\n")


def test_local_dir_download_hashes_are_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mtpconv.variant as convert

    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5", shards=4))
    plan = quantize_mtp(str(src), tmp_path / "v", device="cpu", dry_run=True).plan
    shards = [s.file for s in plan.linked]  # untouched shards: their digests are copied over
    assert len(shards) >= 2
    real = {n: hashlib.sha256((src / n).read_bytes()).hexdigest() for n in shards}
    fake = "f" * 64
    _local_dir_download(src, {shards[0]: real[shards[0]], shards[1]: fake}, time.time() + 5)
    hashed: list[str] = []
    original = convert.sha256_file
    monkeypatch.setattr(convert, "sha256_file", lambda p: hashed.append(Path(p).name) or original(p))
    quantize_mtp(str(src), tmp_path / "v", device="cpu")
    manifest = read_manifest(tmp_path / "v")
    assert manifest is not None
    # the recorded etags were used as they are; shards without a record were hashed
    assert manifest.files[shards[0]] == real[shards[0]] and manifest.files[shards[1]] == fake
    assert shards[0] not in hashed and shards[1] not in hashed
    assert ".cache" not in {p.name for p in (tmp_path / "v").iterdir()}


def test_stale_download_record_is_ignored(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", Spec(family="qwen3_5", shards=3))
    first = sorted(src.glob("*.safetensors"))[0]
    _local_dir_download(src, {first.name: "f" * 64}, first.stat().st_mtime - 60)
    quantize_mtp(str(src), tmp_path / "v", device="cpu")
    manifest = read_manifest(tmp_path / "v")
    assert manifest is not None
    # a stale record is no digest: the linked shard is recorded by size and mtime, unhashed
    assert first.name not in manifest.files
    assert manifest.unhashed[first.name] == FileStamp(first.stat().st_size, first.stat().st_mtime_ns)


def _fake_hub(
    monkeypatch: pytest.MonkeyPatch, siblings: list[str] | None, fail: dict[str, Exception]
) -> list[str]:
    """model_info / hf_hub_download / get_safetensors_metadata that record what was asked."""
    import huggingface_hub

    asked: list[str] = []

    def info(self: object, repo_id: str, revision: str | None = None, **_: object) -> object:
        asked.append("model_info")
        listing = None if siblings is None else [SimpleNamespace(rfilename=n) for n in siblings]
        return SimpleNamespace(sha=HUB_COMMIT, siblings=listing)

    def download(repo_id: str, filename: str, revision: str | None = None, **_: object) -> str:
        asked.append(filename)
        if filename in fail:
            raise fail[filename]
        raise AssertionError(f"unexpected download of {filename}")

    def metadata(self: object, *_: object, **__: object) -> object:
        asked.append("metadata")
        raise AssertionError("headers read after a failed download")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub.HfApi, "get_safetensors_metadata", metadata)
    return asked


def test_remote_inspect_stops_at_the_first_unreachable_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A download the Hub stops answering ends inspect; the next config file is not tried."""
    from huggingface_hub import errors as hf_errors

    from mtpconv.checkpoint.source import remote_checkpoint
    from mtpconv.errors import SourceError

    lost = hf_errors.LocalEntryNotFoundError("cannot reach the Hub")
    asked = _fake_hub(monkeypatch, None, {"config.json": lost})
    with pytest.raises(SourceError, match=r"^fetching config\.json of acme/x failed: acme/x is not in"):
        remote_checkpoint("acme/x", None)
    assert asked == ["model_info", "config.json"]


def test_remote_inspect_downloads_only_listed_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the repo's file list, absent config files cost no request; a listed one that
    vanished (404) is skipped, and no config.json at all is one error naming the repo."""
    from huggingface_hub import errors as hf_errors

    from mtpconv.checkpoint.source import remote_checkpoint
    from mtpconv.errors import SourceError

    gone = hf_errors.EntryNotFoundError("config.json not found")
    asked = _fake_hub(monkeypatch, ["config.json", "model.safetensors"], {"config.json": gone})
    with pytest.raises(SourceError, match="Hub repo acme/x has no config.json"):
        remote_checkpoint("acme/x", "v1")
    assert asked == ["model_info", "config.json"]
