"""An unreachable Hub: fail in seconds, one line, with the close matches (no mock network).

HF_ENDPOINT points at a local port that was bound and closed again, so every
connection is refused for real, the way a machine without internet behaves.
"""

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from moetune.extract import sources

ROOT = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def extract(args, tmp_path, endpoint):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf_home"))
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "moetune", "extract", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    return result, time.monotonic() - start


def test_typo_with_the_hub_unreachable_fails_fast_with_a_suggestion(tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    result, wall_s = extract(["--model", "Qwen/Qwen3-30B-A3"], tmp_path, endpoint)
    assert result.returncode == 1
    assert wall_s < 5, f"took {wall_s:.1f} s"
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "Error: Qwen/Qwen3-30B-A3 is not in the Hugging Face cache or the bundled snapshots, "
        f"and the Hub cannot be reached ({endpoint}: "
    )
    assert "did you mean Qwen/Qwen3-30B-A3B" in lines[0]


def test_models_in_the_hf_cache_are_suggested_too(tmp_path):
    (tmp_path / "hf_home" / "hub" / "models--my-org--Private-MoE-8x1B").mkdir(parents=True)
    endpoint = f"http://127.0.0.1:{closed_port()}"
    result, _ = extract(["--model", "my-org/Private-MoE-8x1"], tmp_path, endpoint)
    assert result.returncode == 1
    assert result.stderr.rstrip().endswith("did you mean my-org/Private-MoE-8x1B?")


def test_a_bundled_model_at_a_revision_is_not_offered_back_as_a_guess(tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    args = ["--model", "Qwen/Qwen3-30B-A3B", "--revision", "main"]
    result, _ = extract(args, tmp_path, endpoint)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert "did you mean" not in line and "bundled snapshots" not in line
    assert line.endswith("--revision skips the bundled snapshot of it: drop --revision to use that")


def test_no_suggestion_when_nothing_is_close(tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    result, _ = extract(["--model", "zz/unrelated"], tmp_path, endpoint)
    assert result.returncode == 1 and "did you mean" not in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.fixture
def answering_server():
    """A local HTTP server that answers every request with 404: a Hub that is there."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 - the http.server API
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_probe_tells_a_dead_endpoint_from_one_that_answers(monkeypatch, answering_server):
    monkeypatch.setenv("HF_ENDPOINT", answering_server)
    assert sources.hub_reachable(timeout_s=2) == (True, "")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    reachable, why = sources.hub_reachable(timeout_s=2)
    assert not reachable and "refused" in why.lower()


def test_close_matches_prefer_the_bundled_repo_id():
    assert sources.close_matches("qwen/qwen3-30b-a3")[0] == "Qwen/Qwen3-30B-A3B"
    assert sources.close_matches("nothing/alike-at-all") == []
