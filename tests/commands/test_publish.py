"""``mtpconv publish``: verification, the exact Hub calls at the seam, dry runs, the CLI.

Every test runs what the CLI runs: ``plan_publish`` (``--dry-run`` stops there) and
then ``upload_plan``, or ``mtpconv publish`` itself through ``main``. No test contacts
the Hub: ``mtpconv.commands.publish.make_api`` is replaced by a recorder (or by a
function that fails the test), and sockets refuse to connect.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mtpconv import __version__
from mtpconv.cli import main
from mtpconv.commands import publish as publish_cmd
from mtpconv.commands.publish import PublishPlan, PublishResult, plan_publish, upload_plan
from mtpconv.errors import ManifestError, PublishError, VerifyError
from mtpconv.manifest import read_manifest, write_manifest
from mtpconv.model_card import build_model_card
from tests.publish_support import TOKEN, RecordingApi, isolate_hub, make_variant  # noqa: F401


@pytest.fixture
def variant(tmp_path: Path) -> Path:
    return make_variant(tmp_path / "Tiny-MTP-mtpfp8")[0]


def publish(
    directory: Path,
    *,
    api: RecordingApi,
    token: str | None = None,
    notify: Callable[[str], None] | None = None,
    show_progress: bool = True,
    **options: Any,
) -> PublishResult:
    """The two calls ``mtpconv publish`` makes, with the recorder as the Hub client."""
    plan = plan_publish(directory, token=token, api=api, notify=notify, **options)
    return upload_plan(plan, token=token, api=api, notify=notify, show_progress=show_progress)


def verify(directory: Path, progress: Any = None) -> PublishPlan:
    """What ``mtpconv publish --dry-run`` runs: every check, no Hub call."""
    return plan_publish(directory, offline=True, progress=progress)


def _files_ops(directory: Path) -> list[tuple[str, str]]:
    """(path_in_repo, local path) for every file of the variant except the card."""
    names = sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != "README.md")
    return [(n, str(directory / n)) for n in names]


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in directory.iterdir()}


# --------------------------------------------------------------------------- the seam


def test_publish_default_repo_exact_calls(variant: Path) -> None:
    api = RecordingApi()
    result = publish(variant, api=api)

    repo = "alice/Tiny-MTP-mtpfp8"
    manifest = read_manifest(variant)
    assert manifest is not None
    card = build_model_card(variant, manifest, repo).encode("utf-8")
    assert api.calls == [
        ("whoami", (), {"token": None}),
        ("create_repo", (repo,), {"token": None, "private": False, "exist_ok": True}),
        (
            "create_commit",
            (repo, [*_files_ops(variant), ("README.md", card)]),
            {
                "commit_message": f"Upload Tiny-MTP-mtpfp8 (mtpconv {__version__})",
                "token": None,
                "revision": None,
                "create_pr": False,
            },
        ),
    ]
    assert result.commit_url == f"https://huggingface.co/{repo}/commit/c0ffee"
    assert result.pr_url is None


def test_publish_private_branch_pr_token_message(variant: Path) -> None:
    api = RecordingApi(private_repo=True)
    result = publish(
        variant,
        repo_id="org/custom",
        private=True,
        revision="fp8-drafter",
        create_pr=True,
        token=TOKEN,
        commit_message="Add FP8 drafter",
        api=api,
    )
    assert api.names() == ["create_repo", "repo_info", "create_branch", "create_commit"]
    assert api.calls[0] == (
        "create_repo",
        ("org/custom",),
        {"token": TOKEN, "private": True, "exist_ok": True},
    )
    assert api.calls[1] == ("repo_info", ("org/custom",), {"token": TOKEN})
    assert api.calls[2] == (
        "create_branch",
        ("org/custom",),
        {"branch": "fp8-drafter", "token": TOKEN, "exist_ok": True},
    )
    name, args, kwargs = api.calls[3]
    assert kwargs == {
        "commit_message": "Add FP8 drafter",
        "token": TOKEN,
        "revision": "fp8-drafter",
        "create_pr": True,
    }
    assert [op[0] for op in args[1]][-1] == "README.md"
    assert result.pr_url == "https://huggingface.co/x/y/discussions/1"


def test_private_refused_when_existing_repo_is_public(variant: Path) -> None:
    api = RecordingApi(private_repo=False)
    with pytest.raises(PublishError, match="already exists and is public"):
        publish(variant, repo_id="org/custom", private=True, api=api)
    assert "create_commit" not in api.names()


@pytest.mark.parametrize("revision", [None, "main", "refs/pr/3"])
def test_no_branch_created_for_main_or_pr_refs(variant: Path, revision: str | None) -> None:
    api = RecordingApi()
    publish(variant, repo_id="org/custom", revision=revision, api=api)
    assert api.names() == ["create_repo", "create_commit"]
    assert api.calls[-1][2]["revision"] == revision


def test_repo_name_without_namespace_goes_under_the_user(variant: Path) -> None:
    api = RecordingApi()
    publish(variant, repo_id="my-variant", token=TOKEN, api=api)
    assert api.calls[0] == ("whoami", (), {"token": TOKEN})
    assert api.calls[1][1] == ("alice/my-variant",)


def test_local_source_default_name_is_source_basename(tmp_path: Path) -> None:
    src: dict[str, Any] = {
        "path": "/data/ckpts/Qwen3.5-Tiny/",
        "repo_id": None,
        "revision": None,
        "files": {},
    }
    directory, _ = make_variant(tmp_path / "v", source=src)
    api = RecordingApi()
    publish(directory, api=api)
    assert api.calls[1][1] == ("alice/Qwen3.5-Tiny-mtpfp8",)


def test_no_source_name_asks_for_repo_id(tmp_path: Path) -> None:
    directory, _ = make_variant(tmp_path / "v", source={"files": {}})
    with pytest.raises(PublishError, match="pass repo_id='USER/NAME'"):
        publish(directory, api=RecordingApi())


def test_invalid_repo_id_refused_before_any_write(variant: Path) -> None:
    api = RecordingApi()
    with pytest.raises(PublishError, match="not a valid Hub repo id"):
        publish(variant, repo_id="org/bad name", api=api)
    assert api.calls == []


def test_card_replaces_readme_without_touching_the_directory(tmp_path: Path) -> None:
    readme = "---\nlicense: apache-2.0\n---\n# Source card\n"
    directory, _ = make_variant(tmp_path / "v", readme=readme, readme_listed=True)
    before = _snapshot(directory)
    api = RecordingApi()
    publish(directory, api=api)
    ops = dict(api.calls[-1][1][1])
    card = ops["README.md"]
    assert isinstance(card, bytes) and b"library_name: vllm" in card
    assert b"license: apache-2.0" in card
    assert list(ops).count("README.md") == 1
    assert _snapshot(directory) == before
    assert (directory / "README.md").read_text() == readme


def test_keep_card_uploads_the_directory_readme(tmp_path: Path) -> None:
    directory, _ = make_variant(tmp_path / "v", readme="# mine\n")
    api = RecordingApi()
    publish(directory, repo_id="org/x", keep_card=True, api=api)
    ops = api.calls[-1][1][1]
    assert ops[-1] == ("README.md", str(directory / "README.md"))


def test_keep_card_without_readme_generates_one(variant: Path) -> None:
    notes: list[str] = []
    api = RecordingApi()
    publish(variant, repo_id="org/x", keep_card=True, api=api, notify=notes.append)
    assert isinstance(api.calls[-1][1][1][-1][1], bytes)
    assert any("no README.md to keep" in n for n in notes)


def test_hub_progress_bars_follow_show_progress(variant: Path) -> None:
    from huggingface_hub.utils.tqdm import are_progress_bars_disabled

    seen: list[bool] = []

    class Api(RecordingApi):
        def create_commit(self, repo_id: str, operations: Any, **kwargs: Any) -> Any:
            seen.append(are_progress_bars_disabled())
            return super().create_commit(repo_id, operations, **kwargs)

    assert not are_progress_bars_disabled()
    publish(variant, repo_id="org/x", api=Api(), show_progress=False)
    publish(variant, repo_id="org/x", api=Api(), show_progress=True)
    assert seen == [True, False]
    assert not are_progress_bars_disabled()


def test_hub_error_is_one_sentence_without_the_token(variant: Path) -> None:
    from huggingface_hub.errors import LocalTokenNotFoundError

    api = RecordingApi(fail={"create_repo": OSError(f"403 Forbidden for token {TOKEN}")})
    with pytest.raises(PublishError) as info:
        publish(variant, repo_id="org/x", token=TOKEN, api=api)
    assert TOKEN not in str(info.value) and "***" in str(info.value)
    assert str(info.value).startswith("creating repo org/x failed:")

    api = RecordingApi(fail={"whoami": LocalTokenNotFoundError("Token is required")})
    with pytest.raises(PublishError, match="hf auth login"):
        publish(variant, api=api)


def test_publishes_what_quantize_mtp_writes(tmp_path: Path) -> None:
    """The converter's real output (VLM names, copied source card) verifies and gets a card."""
    from fixtures.checkpoints import write_checkpoint
    from mtpconv.commands.quantize_mtp import quantize_mtp

    src = write_checkpoint(tmp_path / "Qwen3.5-Tiny", family="qwen3_5_moe", vlm=True, shards=2)
    (src / "README.md").write_text("---\nlicense: apache-2.0\n---\n# source card\n")
    dst = tmp_path / "out"
    quantize_mtp(str(src), dst)
    api = RecordingApi()
    result = publish(dst, api=api)
    assert result.plan.repo_id == "alice/Qwen3.5-Tiny-mtpfp8"
    card = result.plan.card or ""
    assert "license: apache-2.0" in card and "20 drafter linears" in card
    ops = dict(api.calls[-1][1][1])
    assert ops["README.md"] == card.encode("utf-8")
    assert (dst / "README.md").read_text().endswith("# source card\n")


# --------------------------------------------------------------------------- dry run


def test_dry_run_contacts_nothing(variant: Path) -> None:
    # The autouse fixture makes make_api() and socket.connect fail the test, so
    # nothing is uploaded (the plan carries no commit).
    plan = plan_publish(variant, offline=True, token=TOKEN)
    assert plan.repo_id == "<your-username>/Tiny-MTP-mtpfp8"
    assert [i.path_in_repo for i in plan.items] == [n for n, _ in _files_ops(variant)] + ["README.md"]
    assert plan.card is not None and "vllm serve <your-username>/Tiny-MTP-mtpfp8" in plan.card
    assert plan.items[-1].size == len(plan.card.encode("utf-8"))
    assert plan.total_bytes == sum(i.size for i in plan.items)


def test_dry_run_with_repo_id_uses_it(variant: Path) -> None:
    plan: PublishPlan = plan_publish(variant, repo_id="org/x", offline=True)
    assert plan.repo_id == "org/x"


# --------------------------------------------------------------------------- refusals


def test_refuses_directory_without_manifest(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(VerifyError, match="no mtpconv.json"):
        verify(tmp_path)


def test_refuses_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="is not a directory"):
        verify(tmp_path / "nope")


def test_refuses_malformed_manifest(variant: Path) -> None:
    (variant / "mtpconv.json").write_text("{not json")
    with pytest.raises(ManifestError, match="cannot be read as JSON"):
        verify(variant)


def test_refuses_tampered_file_naming_it(variant: Path) -> None:
    with open(variant / "config.json", "a") as f:
        f.write(" ")
    with pytest.raises(VerifyError, match=r"^config\.json in .* does not match its sha256"):
        verify(variant)


def test_refuses_missing_file_naming_it(variant: Path) -> None:
    os.remove(variant / "model-00002-of-00002.safetensors")
    with pytest.raises(VerifyError, match="missing model-00002-of-00002.safetensors"):
        verify(variant)


def test_refuses_unlisted_files_naming_them(variant: Path) -> None:
    (variant / ".DS_Store").write_bytes(b"junk")
    (variant / "sub").mkdir()
    (variant / "sub" / "notes.txt").write_text("x")
    with pytest.raises(VerifyError, match=r"not listed in mtpconv.json: \.DS_Store, sub/notes"):
        verify(variant)


def test_allows_readme_and_hub_bookkeeping_dirs(variant: Path) -> None:
    (variant / "README.md").write_text("# card\n")
    (variant / ".cache" / "huggingface").mkdir(parents=True)
    (variant / ".cache" / "huggingface" / "download.lock").write_text("")
    (variant / ".git").mkdir()
    (variant / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    verify(variant)
    api = RecordingApi()
    publish(variant, repo_id="org/x", api=api)
    uploaded = [p for p, _ in api.calls[-1][1][1]]
    assert not any(p.startswith((".git", ".cache")) for p in uploaded)


def test_refuses_index_shard_not_in_manifest(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    del manifest.files["model-00002-of-00002.safetensors"]
    os.remove(directory / "model-00002-of-00002.safetensors")
    write_manifest(directory, manifest)
    with pytest.raises(VerifyError, match="references shards .* model-00002-of-00002"):
        verify(directory)


@pytest.mark.parametrize("bad", ["../outside.bin", "/etc/passwd", "mtpconv.json"])
def test_refuses_paths_outside_the_variant(tmp_path: Path, bad: str) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    manifest.files[bad] = "0" * 64
    write_manifest(directory, manifest)
    with pytest.raises(ManifestError, match="paths outside the variant"):
        verify(directory)


def test_refuses_manifest_without_config_or_weights(tmp_path: Path) -> None:
    directory, manifest = make_variant(tmp_path / "v")
    manifest.files = {"config.json": manifest.files["config.json"]}
    write_manifest(directory, manifest)
    with pytest.raises(ManifestError, match=r"does not list a \.safetensors file"):
        verify(directory)
    manifest.files = {}
    write_manifest(directory, manifest)
    with pytest.raises(ManifestError, match="lists no files"):
        verify(directory)


def test_verify_reports_progress(variant: Path) -> None:
    events: list[tuple[str, int]] = []

    class Recorder:
        def start(self, description: str, total: int) -> None:
            events.append(("start", total))

        def advance(self, n: int) -> None:
            events.append(("advance", n))

    verify(variant, Recorder())
    total = events[0][1]
    assert events[0][0] == "start" and sum(n for k, n in events[1:]) == total > 0


# --------------------------------------------------------------------------- CLI


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out, err


def test_cli_dry_run_lists_files_sizes_and_card(variant: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["publish", str(variant), "--dry-run", "--token", TOKEN], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("Would upload 7 files (")
    assert lines[0].endswith("to <your-username>/Tiny-MTP-mtpfp8:")
    assert any(line.strip().endswith("config.json") for line in lines)
    assert any(line.strip().endswith("README.md  (generated)") for line in lines)
    assert "--- README.md (generated) ---" in out and "base_model: acme/Tiny-MTP" in out
    assert TOKEN not in out + err


def test_cli_publish_prints_the_commit_url(
    variant: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = RecordingApi()
    monkeypatch.setattr(publish_cmd, "make_api", lambda: api)
    code, out, err = _run(
        ["publish", str(variant), "--repo-id", "org/x", "--private", "--token", TOKEN], capsys
    )
    assert code == 0, err
    assert out == "https://huggingface.co/org/x/commit/c0ffee\n"
    assert "Uploading 7 files" in err and "Published org/x." in err
    assert api.calls[0][2] == {"token": TOKEN, "private": True, "exist_ok": True}
    assert TOKEN not in out + err


def test_cli_dry_run_json_is_the_plan(variant: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["publish", str(variant), "--dry-run", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["dry_run"] is True and doc["repo_id"] == "<your-username>/Tiny-MTP-mtpfp8"
    assert len(doc["files"]) == 7 and doc["total_bytes"] == sum(f["size"] for f in doc["files"])
    card = [f for f in doc["files"] if f["path"] == "README.md"]
    assert card == [
        {"path": "README.md", "size": len(doc["card"].encode()), "generated": True, "sha256": None}
    ]
    assert "base_model: acme/Tiny-MTP" in doc["card"]


def test_cli_json_is_the_result(
    variant: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publish_cmd, "make_api", RecordingApi)
    code, out, err = _run(["publish", str(variant), "--repo-id", "org/x", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["dry_run"] is False and doc["repo_id"] == "org/x"
    assert doc["url"] == doc["commit_url"] == "https://huggingface.co/org/x/commit/c0ffee"
    assert len(doc["files"]) == 7 and "Published" not in err


def test_cli_quiet_prints_only_data(
    variant: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publish_cmd, "make_api", RecordingApi)
    code, out, err = _run(["--quiet", "publish", str(variant), "--repo-id", "org/x"], capsys)
    assert (code, err) == (0, "")
    assert out.strip().endswith("/commit/c0ffee")


def test_cli_tampered_dir_is_one_error_line(
    variant: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = RecordingApi()
    monkeypatch.setattr(publish_cmd, "make_api", lambda: api)
    (variant / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 16)
    code, out, err = _run(["publish", str(variant), "--token", TOKEN], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("Error: model-00001-of-00002.safetensors in ")
    # The username is looked up before hashing (fail fast on auth); nothing is created.
    assert api.names() == ["whoami"]


def test_cli_structure_errors_come_before_any_hub_call(
    variant: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (variant / "stray.bin").write_bytes(b"x")
    code, out, err = _run(["publish", str(variant)], capsys)
    assert (code, out) == (1, "")
    assert err.startswith("Error: ") and "stray.bin" in err and err.count("\n") == 1


def test_cli_hub_failure_never_prints_the_token(
    variant: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = RecordingApi(fail={"create_commit": ValueError(f"bad header Bearer {TOKEN}")})
    monkeypatch.setattr(publish_cmd, "make_api", lambda: api)
    code, out, err = _run(["publish", str(variant), "--repo-id", "org/x", "--token", TOKEN], capsys)
    assert code == 1
    assert err.splitlines()[-1].startswith("Error: uploading to org/x failed: bad header Bearer ***")
    assert TOKEN not in out + err
    assert sum(line.startswith("Error:") for line in err.splitlines()) == 1
