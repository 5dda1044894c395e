"""BASIN's cliff profiles as data: the file format under ``profiles/basin/``.

A cliff profile says where a deployment's prefix hit rate falls off its
cliff and how fast the engine drains sessions at best. It is written by
``basin profile`` (the stepped load ramp lives in
:mod:`basin.experiments.ramp`, the fit of kappa in :mod:`basin.predict.cliff`)
and read by BASIN's factory (:func:`basin.systems.cliff_summary`) and
everything else through :func:`load_profile` and :func:`profile_for`.

The profile's curve is the reference hit curve of :mod:`basin.cliff`
stretched along ``x = W / C_eff`` by ``kappa`` (docs/profiler.md). ``C_eff``
is :func:`basin.catalog.effective_cache_tokens` of the two aggregate tiers.

Besides kappa, a profile stores ``lambda_c_per_min`` (the peak departure
rate, the highest settled completion rate of any ramp step), which is the
deployment's *critical rate* for everything that needs one
(:func:`basin.catalog.critical_rate`), and ``healthy_step_rate_per_min``
(the highest ramp step rate at which the engine stayed healthy, kept for
reference).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from basin.catalog.capacity import effective_cache_tokens
from basin.catalog.deployments import ROUTERS, Deployment, load_deployment
from basin.cliff import DECLINE_START, PLATEAU_DECLINE, REFERENCE_STEEPNESS, reference_hit
from basin.errors import BasinInputError
from basin.paths import PROFILE_DIR
from basin.yamlfile import safe_load

#: Where profiles live by default.
BASIN_PROFILE_DIR = PROFILE_DIR / "basin"
#: The workload profiles are taken with unless told otherwise.
DEFAULT_WORKLOAD = "terminal-bench"
#: File format version written into every profile.
PROFILE_VERSION = 1
PROFILE_KIND = "basin-cliff-profile"
#: Decimals kept for the figures a profile stores (files stay readable and
#: diffable; a ramp's window points are far noisier than 1e-4).
DECIMALS = 4

#: Defaults of the stored ramp settings (docs/profiler.md).
RAMP_STEPS = 15
RAMP_STEP_MIN = 15
RAMP_SETTLE_MIN = 5
RAMP_WINDOW_MIN = 2
#: Sessions synthesised per ramp for a synthetic preset (arrivals reuse them
#: in shuffled passes, each copy with its own cache keys).
RAMP_WORKLOAD_SESSIONS = 2000


# ---------------------------------------------------------------------------
# the reference curve (what the stored kappa, plateau and floor mean: basin.cliff)

#: Quantile of kappa over repeated ramps that a profile keeps (the lower quartile).
KAPPA_QUANTILE = 0.25


# ---------------------------------------------------------------------------
# checks


def check_number(name: str, value: object, *, minimum: float | None = None, strict: bool = False,
                 maximum: float | None = None, fix: str = "") -> float:
    """``value`` as a finite float within the bounds, or an error naming ``name``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating)) \
        and math.isfinite(float(value))
    if ok and minimum is not None:
        ok = float(value) > minimum if strict else float(value) >= minimum  # type: ignore[arg-type]
    if ok and maximum is not None:
        ok = float(value) <= maximum  # type: ignore[arg-type]
    if not ok:
        bound = ""
        if minimum is not None:
            bound = f" {'>' if strict else '>='} {minimum:g}"
        if maximum is not None:
            bound += f"{' and' if bound else ''} <= {maximum:g}"
        raise BasinInputError(f"{name}: expected a finite number{bound}, got {value!r}{'; ' + fix if fix else ''}")
    return float(value)  # type: ignore[arg-type]


def check_whole(name: str, value: object, minimum: int, fix: str = "") -> int:
    """``value`` as a whole number ``>= minimum``, or an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float)) or \
            (isinstance(value, float) and not value.is_integer()) or int(value) < minimum:
        raise BasinInputError(f"{name}: expected a whole number >= {minimum}, got {value!r}{'; ' + fix if fix else ''}")
    return int(value)


def check_router(router: str) -> str:
    if router not in ROUTERS:
        raise BasinInputError(f"router '{router}': use one of {', '.join(ROUTERS)}")
    return router


def override_deployment(deployment: str | Deployment, router: str | None = None,
                        host_ratio: float | None = None) -> Deployment:
    """The deployment as profiled: ``deployment`` with the router and host tier overridden when given."""
    dep = deployment if isinstance(deployment, Deployment) else load_deployment(str(deployment))
    update: dict[str, Any] = {}
    if router is not None:
        update["router"] = check_router(router)
    if host_ratio is not None:
        update["host_ratio"] = check_number("host_ratio (--host-ratio)", host_ratio, minimum=0,
                                            fix="give 0 for GPU-only or a multiple of the GPU prefix cache")
    return dep.model_copy(update=update) if update else dep


def round_figure(value: float) -> float:
    """A stored figure, rounded to :data:`DECIMALS`."""
    return round(float(value), DECIMALS)


def round_figures(values: Sequence[float] | np.ndarray) -> tuple[float, ...]:
    return tuple(round_figure(v) for v in values)


# ---------------------------------------------------------------------------
# the records


@dataclass(frozen=True)
class RampSettings:
    """The stepped ramp a profile was taken with (stored in the file):
    ``steps`` rates from ``start_per_min`` to ``end_per_min`` (geometric),
    each held ``step_min`` minutes; per-step figures cover the minutes after
    ``settle_min``; cliff points are ``window_min`` windows."""

    start_per_min: float
    end_per_min: float
    steps: int = RAMP_STEPS
    step_min: int = RAMP_STEP_MIN
    settle_min: int = RAMP_SETTLE_MIN
    window_min: int = RAMP_WINDOW_MIN
    #: Sessions active at time zero (about the first step's settled population).
    warm_sessions: int = 0
    #: Sessions synthesised for a synthetic preset (None: the whole workload).
    workload_sessions: int | None = RAMP_WORKLOAD_SESSIONS
    #: The uncontrolled engine being profiled.
    policy: str = "hicache"

    def __post_init__(self) -> None:
        start = check_number("ramp start_per_min (--start-rate)", self.start_per_min, minimum=0, strict=True)
        check_number("ramp end_per_min (--end-rate)", self.end_per_min, minimum=start, strict=True,
                     fix="the ramp must rise: give an end rate above the start rate")
        check_whole("ramp steps (--steps)", self.steps, 2)
        step = check_whole("ramp step_min (--step-min)", self.step_min, 2)
        window = check_whole("ramp window_min", self.window_min, 1)
        settle = check_whole("ramp settle_min (--settle-min)", self.settle_min, 0)
        if settle > step - window:
            raise BasinInputError(
                f"ramp settle_min (--settle-min): {settle} leaves less than one {window}-minute window of a "
                f"{step}-minute "
                f"step; use a settle time of at most {step - window} minutes or longer steps")
        check_whole("ramp warm_sessions", self.warm_sessions, 0)
        if self.workload_sessions is not None:
            check_whole("ramp workload_sessions", self.workload_sessions, 1)
        for name in ("steps", "step_min", "settle_min", "window_min", "warm_sessions"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "start_per_min", float(self.start_per_min))
        object.__setattr__(self, "end_per_min", float(self.end_per_min))

    def rates(self) -> tuple[float, ...]:
        """Arrival rate of each step (sessions per minute)."""
        return tuple(float(r) for r in np.geomspace(self.start_per_min, self.end_per_min, self.steps))

    @property
    def duration_min(self) -> int:
        return self.steps * self.step_min

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RampRun:
    """One ramp (one seed): its fit, its steps and its cliff points."""

    seed: int
    kappa: float
    plateau_hit: float
    floor_hit: float
    fit_rmse: float
    #: Peak departure rate: the highest settled completion rate of any step.
    lambda_c_per_min: float
    #: Highest step rate (as set) the engine stayed healthy at; NaN if none.
    healthy_step_rate_per_min: float
    #: Per step, over its settled minutes.
    step_rate_per_min: tuple[float, ...]
    step_arrivals_per_min: tuple[float, ...]
    step_completions_per_min: tuple[float, ...]
    step_active_sessions: tuple[float, ...]
    step_hit_rate: tuple[float, ...]
    step_working_set_ratio: tuple[float, ...]
    #: Cliff points: one per window (working set / C_eff, hit rate).
    points_x: tuple[float, ...]
    points_hit: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class CliffProfile:
    """A deployment's cliff profile, as the controller reads it.

    The cliff is ``W_c = kappa * x_knee * C_eff`` with ``C_eff = max(C_gpu,
    C_host)`` (both aggregate over prefill instances); ``lambda_c_per_min`` is
    the peak departure rate used for shedding.
    """

    deployment: str
    router: str
    workload: str
    #: The lower quartile of ``kappas``.
    kappa: float
    x_knee: float
    lambda_c_per_min: float
    gpu_cache_tokens: int
    host_cache_tokens: int
    #: Kappa and lambda_c of each repeated ramp (seeds ``seed``, ``seed + 1``, ...).
    kappas: tuple[float, ...]
    lambda_c_per_repeat: tuple[float, ...]
    #: Median over ramps of the highest step rate the engine stayed healthy at
    #: (resolution: one step of the ramp). Not the critical rate (the
    #: catalogue's steady-load figure), only a ramp's view of it.
    healthy_step_rate_per_min: float
    #: Median plateau and floor hit rates of the fitted curves.
    plateau_hit: float
    floor_hit: float
    hardware: str
    prefill_instances: int
    decode_instances: int
    host_ratio: float
    seed: int
    ramp: RampSettings
    steepness: float = REFERENCE_STEEPNESS
    plateau_decline: float = PLATEAU_DECLINE
    decline_start: float = DECLINE_START
    kappa_quantile: float = KAPPA_QUANTILE
    runs: tuple[RampRun, ...] = field(default=(), repr=False)
    version: int = PROFILE_VERSION

    @property
    def effective_cache_tokens(self) -> int:
        """``C_eff = max(C_gpu, C_host)`` (:func:`basin.catalog.effective_cache_tokens`)."""
        return effective_cache_tokens(self.gpu_cache_tokens, self.host_cache_tokens)

    @property
    def cliff_ratio(self) -> float:
        """Working set at the cliff over ``C_eff``: ``kappa * x_knee``."""
        return self.kappa * self.x_knee

    @property
    def cliff_tokens(self) -> float:
        """``W_c = kappa * x_knee * C_eff`` (tokens)."""
        return self.cliff_ratio * self.effective_cache_tokens

    @property
    def repeats(self) -> int:
        return len(self.kappas)

    def hit(self, x: np.ndarray | float) -> np.ndarray:
        """The profiled hit curve at working-set ratio ``x = W / C_eff``."""
        return reference_hit(x, self.kappa, self.plateau_hit, self.floor_hit, self.x_knee, self.steepness,
                             self.plateau_decline, self.decline_start)

    def to_dict(self) -> dict[str, Any]:
        """Plain types, summary first (the file layout)."""
        return {
            "kind": PROFILE_KIND,
            "version": self.version,
            "deployment": self.deployment,
            "router": self.router,
            "workload": self.workload,
            "kappa": self.kappa,
            "x_knee": self.x_knee,
            "cliff_ratio": round_figure(self.cliff_ratio),
            "cliff_tokens": int(round(self.cliff_tokens)),
            "lambda_c_per_min": self.lambda_c_per_min,
            "gpu_cache_tokens": self.gpu_cache_tokens,
            "host_cache_tokens": self.host_cache_tokens,
            "effective_cache_tokens": self.effective_cache_tokens,
            "kappas": list(self.kappas),
            "kappa_quantile": self.kappa_quantile,
            "lambda_c_per_repeat": list(self.lambda_c_per_repeat),
            "healthy_step_rate_per_min": self.healthy_step_rate_per_min,
            "plateau_hit": self.plateau_hit,
            "floor_hit": self.floor_hit,
            "steepness": self.steepness,
            "plateau_decline": self.plateau_decline,
            "decline_start": self.decline_start,
            "hardware": self.hardware,
            "prefill_instances": self.prefill_instances,
            "decode_instances": self.decode_instances,
            "host_ratio": self.host_ratio,
            "seed": self.seed,
            "ramp": self.ramp.to_dict(),
            "runs": [r.to_dict() for r in self.runs],
        }


# ---------------------------------------------------------------------------
# names and paths


def _workload_stem(workload: str) -> str:
    path = Path(workload)
    stem = path.name.split(".")[0] if path.suffix else workload
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in stem)


def profile_name(deployment: str | Deployment, router: str | None = None, workload: str = DEFAULT_WORKLOAD,
                 host_ratio: float | None = None) -> str:
    """File stem of a profile: ``<deployment>[-gpu-only|-host<r>][-<router>][-<workload>]``.

    The host suffix appears when ``host_ratio`` overrides the deployment's,
    the router when the deployment has several prefill instances (a single
    instance routes nothing), the workload when it is not terminal-bench.
    """
    base = deployment if isinstance(deployment, Deployment) else load_deployment(str(deployment))
    dep = override_deployment(base, router, host_ratio)
    parts = [dep.name]
    if dep.host_ratio != base.host_ratio:
        parts.append("gpu-only" if dep.host_ratio == 0 else f"host{dep.host_ratio:g}")
    if dep.prefill_instances > 1:
        parts.append(dep.router)
    if workload != DEFAULT_WORKLOAD:
        parts.append(_workload_stem(workload))
    return "-".join(parts)


def default_profile_path(deployment: str | Deployment, router: str | None = None,
                         workload: str = DEFAULT_WORKLOAD, host_ratio: float | None = None) -> Path:
    """Where ``basin profile`` writes (and the controller looks for) a profile:
    ``profiles/basin/<profile_name>.yaml``."""
    return BASIN_PROFILE_DIR / f"{profile_name(deployment, router, workload, host_ratio)}.yaml"


def scenario_profile_path(scenario: str) -> Path:
    """Where ``basin profile --scenario`` writes the profile of a deployment
    as one scenario runs it (its workload scaled, say): beside the shipped
    profiles, named after the scenario, and used only when a run names it."""
    return BASIN_PROFILE_DIR / "scenarios" / f"{scenario}.yaml"


def profile_path_as_run(deployment: Deployment, workload: str = DEFAULT_WORKLOAD) -> Path:
    """The profile of ``deployment`` as a run uses it (its host tier and router
    applied, its name a shipped deployment's): where BASIN's cliff and the
    critical rate are read from."""
    return default_profile_path(deployment.name, deployment.router, workload, deployment.host_ratio)


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise BasinInputError(f"{path}: a profile file ends in .yaml, .yml or .json")
    return suffix


# ---------------------------------------------------------------------------
# writing


def profile_text(profile: CliffProfile, fmt: str = "yaml") -> str:
    data = profile.to_dict()
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"

    header = (f"# BASIN cliff profile of {profile.deployment} ({profile.router}, {profile.workload}); written by "
              "`basin profile`, regenerate rather than edit.\n")
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def save_profile(profile: CliffProfile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile`` as YAML or JSON (by the file's suffix)."""
    out = Path(path)
    fmt = "json" if _suffix(out) == ".json" else "yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_text(profile, fmt), encoding="utf-8")
    return out


# ---------------------------------------------------------------------------
# reading


def _profile_file(path_or_name: str | os.PathLike[str]) -> Path:
    path = Path(path_or_name)
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        if not path.is_file():
            raise BasinInputError(
                f"{path}: profile file not found; write it with `basin profile DEPLOYMENT --out {path}`")
        return path
    for suffix in (".yaml", ".json"):
        candidate = BASIN_PROFILE_DIR / f"{path_or_name}{suffix}"
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in BASIN_PROFILE_DIR.glob("*.yaml")) if BASIN_PROFILE_DIR.is_dir() else []
    raise BasinInputError(
        f"unknown profile '{path_or_name}': use one of {', '.join(known) or '(none yet)'}, a .yaml/.json path, "
        f"or create it with `basin profile DEPLOYMENT`")


#: Fields renamed since profiles were first written: old name -> new name.
_RENAMED = {"critical_rate_per_min": "healthy_step_rate_per_min"}


class _Reader:
    """Typed field access that names the file and field in every error."""

    def __init__(self, path: Path, data: Mapping[str, Any], prefix: str = "") -> None:
        self.path, self.data, self.prefix = path, data, prefix
        for old, new in _RENAMED.items():
            if old in data and new not in data:
                raise BasinInputError(f"{path}: field '{prefix}{old}' is now called '{new}' (the highest healthy "
                                      "ramp step rate; the critical rate is the profile's lambda_c_per_min); "
                                      "rename it or regenerate the profile with `basin profile`")

    def _fail(self, key: str, what: str) -> BasinInputError:
        got = self.data.get(key, "(missing)")
        return BasinInputError(f"{self.path}: field '{self.prefix}{key}': expected {what}, got {got!r}; "
                               "regenerate the profile with `basin profile`")

    def get(self, key: str) -> Any:
        if key not in self.data:
            raise self._fail(key, "a value")
        return self.data[key]

    def number(self, key: str, positive: bool = False) -> float:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) or math.isnan(v)) \
                or (positive and not v > 0):
            raise self._fail(key, "a positive number" if positive else "a number")
        return float(v)

    def whole(self, key: str, minimum: int = 0) -> int:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self._fail(key, f"a whole number >= {minimum}")
        return int(v)

    def text(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str) or not v:
            raise self._fail(key, "a name")
        return v

    def numbers(self, key: str, positive: bool = False) -> tuple[float, ...]:
        v = self.get(key)
        if not isinstance(v, list) or any(isinstance(e, bool) or not isinstance(e, (int, float)) for e in v) \
                or (positive and any(not e > 0 for e in v)):
            raise self._fail(key, "a list of positive numbers" if positive else "a list of numbers")
        return tuple(float(e) for e in v)

    def mapping(self, key: str) -> _Reader:
        v = self.get(key)
        if not isinstance(v, Mapping):
            raise self._fail(key, "a mapping")
        return _Reader(self.path, v, f"{self.prefix}{key}.")


def _read_run(r: _Reader) -> RampRun:
    return RampRun(
        seed=r.whole("seed"), kappa=r.number("kappa", positive=True), plateau_hit=r.number("plateau_hit"),
        floor_hit=r.number("floor_hit"), fit_rmse=r.number("fit_rmse"), lambda_c_per_min=r.number("lambda_c_per_min"),
        healthy_step_rate_per_min=r.number("healthy_step_rate_per_min"),
        **{name: r.numbers(name) for name in (
            "step_rate_per_min", "step_arrivals_per_min", "step_completions_per_min", "step_active_sessions",
            "step_hit_rate", "step_working_set_ratio", "points_x", "points_hit")},
    )


def profile_from_dict(data: Any, path: str | os.PathLike[str] = "<profile>") -> CliffProfile:
    """A :class:`CliffProfile` from the plain mapping :meth:`CliffProfile.to_dict` gives."""
    where = Path(path)
    if not isinstance(data, Mapping):
        raise BasinInputError(f"{where}: expected a mapping of profile fields at the top level")
    if data.get("kind") != PROFILE_KIND:
        raise BasinInputError(f"{where}: field 'kind': expected '{PROFILE_KIND}', got {data.get('kind')!r}; "
                              "this is not a BASIN cliff profile")
    r = _Reader(where, data)
    version = r.whole("version", 1)
    if version > PROFILE_VERSION:
        raise BasinInputError(f"{where}: field 'version': {version} is newer than this basin-serve reads "
                              f"({PROFILE_VERSION}); update basin-serve or regenerate the profile")
    ramp_r = r.mapping("ramp")
    ramp_fields = {f.name for f in dataclasses.fields(RampSettings)}
    unknown = sorted(set(ramp_r.data) - ramp_fields)
    if unknown:
        raise BasinInputError(f"{where}: field 'ramp.{unknown[0]}': not a ramp setting")
    try:
        ramp = RampSettings(**dict(ramp_r.data))
    except BasinInputError as exc:
        raise BasinInputError(f"{where}: field 'ramp': {exc}") from None
    except TypeError as exc:  # a setting without a default is missing
        raise BasinInputError(f"{where}: field 'ramp': {exc}; regenerate the profile with `basin profile`") from None
    runs_raw = r.get("runs")
    if not isinstance(runs_raw, list) or any(not isinstance(x, Mapping) for x in runs_raw):
        raise BasinInputError(f"{where}: field 'runs': expected a list of mappings")
    runs = tuple(_read_run(_Reader(where, x, f"runs.{i}.")) for i, x in enumerate(runs_raw))
    kappas = r.numbers("kappas", positive=True)
    if not kappas:
        raise BasinInputError(f"{where}: field 'kappas': expected at least one value")
    router = r.text("router")
    if router not in ROUTERS:
        raise BasinInputError(f"{where}: field 'router': '{router}' is not one of {', '.join(ROUTERS)}")
    return CliffProfile(
        deployment=r.text("deployment"), router=router, workload=r.text("workload"),
        kappa=r.number("kappa", positive=True), x_knee=r.number("x_knee", positive=True),
        lambda_c_per_min=r.number("lambda_c_per_min"),
        gpu_cache_tokens=r.whole("gpu_cache_tokens", 1), host_cache_tokens=r.whole("host_cache_tokens", 0),
        kappas=kappas, lambda_c_per_repeat=r.numbers("lambda_c_per_repeat"),
        healthy_step_rate_per_min=r.number("healthy_step_rate_per_min"),
        plateau_hit=r.number("plateau_hit"), floor_hit=r.number("floor_hit"),
        hardware=r.text("hardware"), prefill_instances=r.whole("prefill_instances", 1),
        decode_instances=r.whole("decode_instances", 1), host_ratio=r.number("host_ratio"),
        seed=r.whole("seed"), ramp=ramp, steepness=r.number("steepness", positive=True),
        plateau_decline=r.number("plateau_decline"), decline_start=r.number("decline_start"),
        kappa_quantile=r.number("kappa_quantile"), runs=runs, version=version,
    )


def load_profile(path_or_name: str | os.PathLike[str]) -> CliffProfile:
    """Read a profile: a ``.yaml``/``.yml``/``.json`` path, or a name under
    ``profiles/basin/`` such as ``1p3d-h200`` or ``2p6d-h200-least-loaded``."""
    path = _profile_file(path_or_name)
    text = path.read_text(encoding="utf-8")
    if _suffix(path) == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BasinInputError(f"{path}: not valid JSON ({exc})") from None
    else:
        try:
            data = safe_load(text)
        except yaml.YAMLError as exc:
            raise BasinInputError(f"{path}: not valid YAML ({exc})") from None
    return profile_from_dict(data, path)


def profile_for(deployment: str | Deployment, router: str | None = None, workload: str = DEFAULT_WORKLOAD,
                host_ratio: float | None = None) -> CliffProfile:
    """The shipped (or previously written) profile of a deployment as run:
    ``load_profile(default_profile_path(...))``, with an error that gives the
    command creating it when there is none."""
    path = default_profile_path(deployment, router, workload, host_ratio)
    if not path.is_file():
        dep = override_deployment(deployment, router, host_ratio)
        cmd = [f"basin profile {dep.name if isinstance(deployment, Deployment) else deployment}"]
        if dep.prefill_instances > 1:
            cmd.append(f"--router {dep.router}")
        if host_ratio is not None:
            cmd.append(f"--host-ratio {host_ratio:g}")
        if workload != DEFAULT_WORKLOAD:
            cmd.append(f"--workload {workload}")
        raise BasinInputError(f"no cliff profile at {path}; create it with `{' '.join(cmd)}`")
    return load_profile(path)
