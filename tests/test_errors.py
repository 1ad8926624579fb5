"""The one Hub-error map, against real huggingface_hub errors from a loopback server,
and end to end: with the Hub unreachable every command ends in one line, quickly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mtpconv.errors import PublishError, SourceError, hub_errors

TOKEN = "hf_SECRETtoken1234567890"
# path prefix -> (status, X-Error-Code) answered by the loopback Hub
_ANSWERS = {
    "/api/models/acme/missing": (404, "RepoNotFound"),
    "/api/models/acme/gated": (403, "GatedRepo"),
    "/api/models/acme/tiny/revision/v9": (404, "RevisionNotFound"),
    "/api/whoami-v2": (401, ""),
    "/api/repos/create": (403, ""),
    "/api/models/acme/broken": (400, ""),  # 5xx would be retried: slow
}


class _Hub(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        status, code = next((v for k, v in _ANSWERS.items() if self.path.startswith(k)), (404, ""))
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_HEAD = _answer

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def hub_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Hub on 127.0.0.1 that answers with the errors above; offline mode off."""
    from huggingface_hub import constants

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    yield url
    server.shutdown()
    server.server_close()


def _api(url: str):  # type: ignore[no-untyped-def]
    from huggingface_hub import HfApi

    return HfApi(endpoint=url)


@pytest.mark.parametrize(
    ("repo", "revision", "reason"),
    [
        ("acme/missing", None, "Hub repo acme/missing was not found (or needs a token: set HF_TOKEN)."),
        ("acme/gated", None, "acme/gated is gated: accept its terms on the Hub and set HF_TOKEN."),
        ("acme/tiny", "v9", "revision 'v9' does not exist in acme/tiny."),
    ],
)
def test_repo_errors_name_the_repo(hub_url: str, repo: str, revision: str | None, reason: str) -> None:
    with (
        pytest.raises(SourceError) as info,
        hub_errors(f"looking up {repo}", repo_id=repo, revision=revision),
    ):
        _api(hub_url).model_info(repo, revision=revision)
    assert str(info.value) == f"looking up {repo} failed: {reason}"


def test_server_error_is_one_sentence(hub_url: str) -> None:
    refused = r"^looking up acme/broken failed: the Hub refused it: Bad request\.$"
    with (
        pytest.raises(SourceError, match=refused),
        hub_errors("looking up acme/broken", repo_id="acme/broken"),
    ):
        _api(hub_url).model_info("acme/broken")


def test_auth_hints_and_the_token_never_shown(hub_url: str) -> None:
    with pytest.raises(PublishError) as info, hub_errors("whoami", token=TOKEN, error=PublishError):
        _api(hub_url).whoami(token=TOKEN)
    assert "hf auth login" in str(info.value) and TOKEN not in str(info.value)
    with (
        pytest.raises(PublishError) as info,
        hub_errors("creating repo org/x", token=TOKEN, error=PublishError),
    ):
        _api(hub_url).create_repo("org/x", token=TOKEN)
    assert "cannot write there" in str(info.value) and TOKEN not in str(info.value)
    with pytest.raises(PublishError) as info, hub_errors("uploading", token=TOKEN, error=PublishError):
        raise ValueError(f"bad header Bearer {TOKEN}")
    assert str(info.value) == "uploading failed: bad header Bearer ***."


def test_token_from_the_environment_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with pytest.raises(SourceError) as info, hub_errors("fetching acme/x", repo_id="acme/x"):
        raise OSError(f"refused for {TOKEN}")
    assert str(info.value) == "fetching acme/x failed: refused for ***."


def test_offline_mode_is_named() -> None:
    # The autouse fixture sets HF_HUB_OFFLINE; huggingface_hub refuses before connecting.
    offline = r"^looking up acme/x failed: HF_HUB_OFFLINE is set"
    with pytest.raises(SourceError, match=offline), hub_errors("looking up acme/x", repo_id="acme/x"):
        _api("http://127.0.0.1:9").model_info("acme/x")


def test_bugs_are_not_mapped() -> None:
    with pytest.raises(KeyError), hub_errors("fetching acme/x", repo_id="acme/x"):
        raise KeyError("a bug, not a Hub failure")


# --------------------------------------------------------------------------- unreachable Hub


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: connecting to it is refused at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture(scope="module")
def real_variant(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A variant quantize-mtp wrote; also compiles the package, so that the timed
    commands below measure the Hub and not a first run writing .pyc files."""
    import compileall

    import mtpconv
    from fixtures.checkpoints import Spec, write_checkpoint
    from mtpconv.commands.quantize_mtp import quantize_mtp

    compileall.compile_dir(Path(mtpconv.__file__).parent, quiet=1)

    root = tmp_path_factory.mktemp("unreachable")
    src = write_checkpoint(root / "Tiny", Spec(family="qwen3_5"))
    quantize_mtp(str(src), root / "Tiny-mtpfp8", device="cpu")
    return root / "Tiny-mtpfp8"


def _cli_unreachable(args: list[str], port: int, home: Path) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(
        HF_ENDPOINT=f"http://127.0.0.1:{port}",
        HF_HUB_OFFLINE="0",
        HF_HOME=str(home),
        HF_TOKEN=TOKEN,
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mtpconv", *args], env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


@pytest.mark.parametrize(
    ("command", "step"),
    [
        (["inspect", "owner/name"], "looking up owner/name failed: cannot reach the Hub at "),
        (["quantize-mtp", "owner/name", "DST"], "fetching owner/name failed: owner/name is not in the "),
        (["quantize-mtp", "owner/name", "DST", "--dry-run"], "looking up owner/name failed: cannot reach"),
        (
            ["build-draft-vocab", "owner/name", "--corpus", "CORPUS", "--size", "16", "-o", "DST"],
            "fetching owner/name failed: owner/name is not in the ",
        ),
        (
            ["publish", "VARIANT", "--repo-id", "org/x"],
            "creating repo org/x failed: cannot reach the Hub at ",
        ),
        (
            ["publish", "VARIANT"],
            "looking up your Hub username (to publish Tiny-mtpfp8) failed: cannot reach",
        ),
    ],
)
def test_unreachable_hub_is_one_line_fast(
    command: list[str], step: str, closed_port: int, real_variant: Path, tmp_path: Path
) -> None:
    (tmp_path / "corpus.txt").write_text("hello world\n")
    where = {
        "DST": str(tmp_path / "out"),
        "CORPUS": str(tmp_path / "corpus.txt"),
        "VARIANT": str(real_variant),
    }
    code, output, seconds = _cli_unreachable([where.get(a, a) for a in command], closed_port, tmp_path / "hf")
    assert code == 1, output
    (line,) = output.strip().splitlines()  # one line: no traceback, no retry warnings
    assert line.startswith(f"Error: {step}"), line
    assert f"127.0.0.1:{closed_port}" in line and TOKEN not in output
    assert seconds < 15, f"took {seconds:.1f} s"
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- interrupts


def test_one_sigterm_path_nests_and_restores() -> None:
    import signal

    from mtpconv.errors import Interrupted, interruptible, sigterm_interrupts

    before = signal.getsignal(signal.SIGTERM)
    with sigterm_interrupts():  # what the CLI entry point wraps every command in
        expected = r"^interrupted; nothing was written to out/v\.$"
        with pytest.raises(Interrupted, match=expected) as info, interruptible("out/v"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode boundary
        assert info.value.exit_code == 130
        assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is before


def test_interrupted_without_a_target() -> None:
    from mtpconv.errors import interrupted

    assert str(interrupted()) == "interrupted; nothing was left half-written."
