"""Session arrival processes: Poisson with surges and rate changes, shaped by a
production rate trace, and the draw of sessions onto arrival times.

Everything is deterministic by seed and sampled exactly: an inhomogeneous
Poisson process with a piecewise-constant rate is a unit-rate process pushed
through the inverse of its cumulative rate, so there is no time stepping.

Randomness is split into independent streams so that comparisons stay paired:

* the base stream depends only on the base rate (and its changes): adding a
  surge, or a thinning window, leaves every base arrival where it was, as in
  the paper's runs ("both runs retain the same base arrivals");
* a surge adds a separate burst stream; a factor below 1 drops base arrivals
  by an independent coin per arrival;
* :func:`draw_arrivals` draws arrival times, base sessions, burst sessions
  and warm sessions from four streams of one seed, so changing the workload,
  the burst workload or the warm start never moves an arrival.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Protocol

import numpy as np

from basin.errors import BasinInputError, where
from basin.paths import DATA_DIR
from basin.workload.io import SESSION_START_KEY
from basin.workload.records import Session, Workload

#: Tags of arrivals: the base stream, a surge's surplus, sessions active at time zero.
BASE, BURST, WARM = "base", "burst", "warm"

#: Exponential draws per chunk; fixed so results never depend on it.
_CHUNK = 1024


class ArrivalSchedule(Protocol):
    """What a run needs from an arrival process."""

    def rate_at(self, t_s: float) -> float:
        """Session arrival rate (sessions per minute) at run time ``t_s``."""
        ...

    def sample(self, duration_s: float, rng: np.random.Generator) -> list[tuple[float, str]]:
        """Arrival times in ``[0, duration_s)`` in order, each with its tag."""
        ...


def _finite(name: str, value: object, minimum: float = 0.0, strict: bool = False) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < minimum or (strict and value == minimum)):
        relation = ">" if strict else ">="
        raise BasinInputError(f"{name}: expected a finite number {relation} {minimum:g}, got {value!r}")
    return float(value)


def _check_duration(duration_s: float) -> float:
    return _finite("duration_s", duration_s, strict=True)


def _poisson_times(edges_s: np.ndarray, rate_per_s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process with rate ``rate_per_s[i]`` on
    ``[edges_s[i], edges_s[i+1])``, by inverting the cumulative rate.

    The unit-rate arrivals are consumed in order, so the arrivals before a
    time depend only on the rate before it.
    """
    cumulative = np.concatenate([[0.0], np.cumsum(rate_per_s * np.diff(edges_s))])
    total = cumulative[-1]
    masses: list[np.ndarray] = []
    reached = 0.0
    while reached < total:
        points = reached + np.cumsum(rng.standard_exponential(_CHUNK))
        masses.append(points[points < total])
        reached = points[-1]
    mass = np.concatenate(masses) if masses else np.zeros(0)
    # Segment i holds cumulative[i] <= mass < cumulative[i + 1], so its rate is positive.
    seg = np.searchsorted(cumulative, mass, side="right") - 1
    times = edges_s[seg] + (mass - cumulative[seg]) / rate_per_s[seg]
    return np.minimum(times, np.nextafter(edges_s[seg + 1], edges_s[seg]))


# --------------------------------------------------------------------------
# Poisson arrivals with surges and rate changes


@dataclass(frozen=True, slots=True)
class Surge:
    """Arrivals multiplied by ``factor`` during ``[start_min, end_min)``.

    A factor above 1 adds a burst stream of rate ``(factor - 1) * base``;
    below 1 it thins the base stream; 0 stops arrivals in the window.
    """

    start_min: float
    end_min: float
    factor: float

    def __post_init__(self) -> None:
        _finite("surge start_min", self.start_min)
        _finite("surge end_min", self.end_min)
        _finite("surge factor", self.factor)
        if self.end_min <= self.start_min:
            raise BasinInputError(
                f"surge {self.start_min:g}-{self.end_min:g} min: end_min must be after start_min")


@dataclass(frozen=True, slots=True)
class RateChange:
    """From ``at_min`` on, the base rate is ``per_min`` sessions per minute."""

    at_min: float
    per_min: float

    def __post_init__(self) -> None:
        _finite("rate change at_min", self.at_min)
        _finite(f"rate change at {self.at_min:g} min: per_min", self.per_min)


def _records(values: Iterable[object], cls: type, label: str) -> tuple:
    """Records of ``cls`` from records or mappings (as read from a scenario file)."""
    if isinstance(values, (str, Mapping)) or not isinstance(values, Iterable):
        raise BasinInputError(f"{label}s: expected a list, got {values!r}")
    out = []
    names = [f.name for f in fields(cls)]
    for i, value in enumerate(values, start=1):
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(names))
            missing = [n for n in names if n not in value]
            if unknown or missing:
                problem = f"unknown field '{unknown[0]}'" if unknown else f"missing field '{missing[0]}'"
                raise BasinInputError(f"{label} {i}: {problem}; expected fields {', '.join(names)}")
            value = cls(**value)
        if not isinstance(value, cls):
            raise BasinInputError(f"{label} {i}: expected a {cls.__name__} or a mapping, got {value!r}")
        out.append(value)
    return tuple(out)


@dataclass(frozen=True)
class PoissonSchedule:
    """Poisson session arrivals at ``base_per_min``, changed at ``rate_changes``
    and multiplied in ``surges`` (which may not overlap)."""

    base_per_min: float
    surges: tuple[Surge, ...] = ()
    rate_changes: tuple[RateChange, ...] = ()

    def __post_init__(self) -> None:
        _finite("base_per_min", self.base_per_min)
        surges = sorted(_records(self.surges, Surge, "surge"), key=lambda s: s.start_min)
        for a, b in zip(surges, surges[1:]):
            if b.start_min < a.end_min:
                raise BasinInputError(
                    f"surges {a.start_min:g}-{a.end_min:g} min and {b.start_min:g}-{b.end_min:g} min "
                    "overlap; merge them into one surge or move one")
        changes = sorted(_records(self.rate_changes, RateChange, "rate change"), key=lambda c: c.at_min)
        for a, b in zip(changes, changes[1:]):
            if a.at_min == b.at_min:
                raise BasinInputError(f"two rate changes at {a.at_min:g} min; keep one")
        object.__setattr__(self, "surges", tuple(surges))
        object.__setattr__(self, "rate_changes", tuple(changes))

    def base_rate_at(self, t_s: float) -> float:
        """Base rate (sessions per minute) at ``t_s``, before any surge."""
        rate = self.base_per_min
        for change in self.rate_changes:
            if change.at_min * 60 <= t_s:
                rate = change.per_min
        return rate

    def factor_at(self, t_s: float) -> float:
        """Surge factor at ``t_s`` (1 outside surges)."""
        return next((s.factor for s in self.surges if s.start_min * 60 <= t_s < s.end_min * 60), 1.0)

    def rate_at(self, t_s: float) -> float:
        """Total arrival rate (sessions per minute) at ``t_s``, surges included."""
        return self.base_rate_at(t_s) * self.factor_at(t_s)

    def _segments(self, duration_s: float, with_surges: bool) -> np.ndarray:
        points = {0.0, duration_s}
        points.update(c.at_min * 60 for c in self.rate_changes)
        if with_surges:
            points.update(t * 60 for s in self.surges for t in (s.start_min, s.end_min))
        return np.array(sorted(p for p in points if 0 <= p <= duration_s))

    def sample(self, duration_s: float, rng: np.random.Generator) -> list[tuple[float, str]]:
        """Arrivals in ``[0, duration_s)``: base arrivals (thinned where a
        factor is below 1) and burst arrivals, merged in time order."""
        duration_s = _check_duration(duration_s)
        base_rng, thin_rng, burst_rng = rng.spawn(3)
        edges = self._segments(duration_s, with_surges=False)
        base_rates = np.array([self.base_rate_at(t) for t in edges[:-1]]) / 60
        base = _poisson_times(edges, base_rates, base_rng)
        keep = thin_rng.random(base.size) < np.array([min(self.factor_at(t), 1.0) for t in base])
        edges = self._segments(duration_s, with_surges=True)
        surplus = np.array([self.base_rate_at(t) * max(self.factor_at(t) - 1, 0.0) for t in edges[:-1]]) / 60
        burst = _poisson_times(edges, surplus, burst_rng)
        merged = [(float(t), BASE) for t in base[keep]] + [(float(t), BURST) for t in burst]
        return sorted(merged, key=lambda a: a[0])


# --------------------------------------------------------------------------
# Rate traces


@dataclass(frozen=True)
class RateSeries:
    """A request-rate trace as steps: ``rate_per_s[i]`` holds on
    ``[t_s[i], t_s[i+1])``, the last step until ``end_s`` (both traces we
    ship are window averages, so steps are what they measured)."""

    t_s: tuple[float, ...]
    rate_per_s: tuple[float, ...]
    name: str
    end_s: float

    def __post_init__(self) -> None:
        t = np.asarray(self.t_s, dtype=float)
        r = np.asarray(self.rate_per_s, dtype=float)
        if t.ndim != 1 or t.size == 0 or t.size != r.size:
            raise BasinInputError(f"rate series '{self.name}': needs as many rates as times, at least one")
        if not (np.all(np.isfinite(t)) and np.all(np.diff(np.append(t, self.end_s)) > 0)):
            raise BasinInputError(f"rate series '{self.name}': times must increase and end before end_s")
        if not np.all(np.isfinite(r)) or np.any(r < 0) or not np.any(r > 0):
            raise BasinInputError(f"rate series '{self.name}': rates must be >= 0 and not all zero")
        object.__setattr__(self, "t_s", tuple(float(v) for v in t))
        object.__setattr__(self, "rate_per_s", tuple(float(v) for v in r))

    def to_csv(self, path: str | Path) -> None:
        """Write ``t_s,rate_per_s``; ``load_rate_series("servegen", path)`` reads it back."""
        with Path(path).open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["t_s", "rate_per_s"])
            writer.writerows(zip(self.t_s, self.rate_per_s))


SERVEGEN_DEFAULT = ("servegen_rates/servegen_language_aggregate_rate_10min.csv", "m_large_req_per_s")
AZURE_DEFAULT = "azure_llm_2023/AzureLLMInferenceTrace_code.csv"


def load_rate_series(source: str, path: str | Path | None = None, column: str | None = None) -> RateSeries:
    """Read a rate trace.

    ``servegen``: a CSV with ``t_s`` and rate columns in requests per second
    (default: the shipped ServeGen language aggregate, column
    ``m_large_req_per_s``; a file with a single rate column needs no column).
    ``azure``: an Azure LLM inference trace; the rate is its per-minute request
    count over complete minutes from the first request (the last, partial
    minute is left out so it cannot read as a dip).
    """
    if source == "servegen":
        return _load_servegen(DATA_DIR / SERVEGEN_DEFAULT[0] if path is None else Path(path), column)
    if source == "azure":
        if column is not None:
            raise BasinInputError("an Azure trace has no rate columns; choose the trace by its path")
        return _load_azure(DATA_DIR / AZURE_DEFAULT if path is None else Path(path))
    raise BasinInputError(f"unknown rate source '{source}'; choose servegen or azure")


def _read_csv(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    if not path.is_file():
        raise BasinInputError(f"{path}: no such file")
    try:
        with path.open("r", encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            rows = [(reader.line_num, row) for row in reader]
            return list(reader.fieldnames or []), rows
    except (csv.Error, UnicodeDecodeError) as exc:
        raise BasinInputError(f"{path}: unreadable CSV ({exc})") from exc


def _load_servegen(path: Path, column: str | None) -> RateSeries:
    header, rows = _read_csv(path)
    rate_columns = [c for c in header if c != "t_s"]
    if column is None:
        column = SERVEGEN_DEFAULT[1] if SERVEGEN_DEFAULT[1] in header else (
            rate_columns[0] if len(rate_columns) == 1 else None)
    if "t_s" not in header or column not in header:
        raise BasinInputError(
            f"{where(path, line=1)}: expected a 't_s' column and a rate column; choose one of "
            f"{', '.join(rate_columns) or '(none)'}")
    times: list[float] = []
    rates: list[float] = []
    for line, row in rows:
        values: list[float] = []
        for name in ("t_s", column):
            try:
                values.append(float(row[name] or "nan"))
            except (TypeError, ValueError):
                values.append(math.nan)
            if not math.isfinite(values[-1]) or (name == column and values[-1] < 0):
                raise BasinInputError(
                    f"{where(path, line=line, field=name)}: expected a number"
                    f"{' >= 0' if name == column else ''}, got {row[name]!r}")
        if times and values[0] <= times[-1]:
            raise BasinInputError(f"{where(path, line=line, field='t_s')}: times must increase")
        times.append(values[0])
        rates.append(values[1])
    if len(times) < 2:
        raise BasinInputError(f"{path}: a rate series needs at least two rows")
    end = times[-1] + (times[-1] - times[-2])
    return RateSeries(tuple(times), tuple(rates), name=f"{path.stem}:{column}", end_s=end)


def _load_azure(path: Path) -> RateSeries:
    header, rows = _read_csv(path)
    if "TIMESTAMP" not in header:
        raise BasinInputError(f"{where(path, line=1)}: expected a TIMESTAMP column (an Azure LLM trace)")
    stamps = []
    for line, row in rows:
        try:
            stamps.append(datetime.fromisoformat(row["TIMESTAMP"] or ""))
        except (TypeError, ValueError):
            raise BasinInputError(
                f"{where(path, line=line, field='TIMESTAMP')}: expected a date and time such as "
                f"2023-11-16 18:17:03.97, got {row['TIMESTAMP']!r}") from None
    if not stamps:
        raise BasinInputError(f"{path}: no requests")
    first = min(stamps)
    offsets = np.array([(t - first).total_seconds() for t in stamps])
    minutes = int(offsets.max() // 60)
    if minutes < 1:
        raise BasinInputError(f"{path}: covers less than one complete minute")
    counts = np.bincount((offsets // 60).astype(int), minlength=minutes + 1)[:minutes]
    return RateSeries(tuple(60.0 * np.arange(minutes)), tuple(counts / 60.0), name=f"{path.stem}:per-minute",
                      end_s=60.0 * minutes)


@dataclass(frozen=True)
class TraceShapedSchedule:
    """Poisson arrivals whose rate follows a trace's shape, rescaled to a mean.

    Run time ``t`` reads the trace at ``start_offset_s + t * time_scale``:
    ``time_scale=10`` plays ten minutes of trace per run minute (a day of
    10-minute ServeGen windows in 2.4 h), ``0.5`` stretches an hour of Azure
    minutes over two. The rate is scaled so that its mean over the first
    ``span_s`` seconds of run time (None: all the trace from the offset on) is
    ``mean_per_min``, so the chosen load is the load of the run.
    """

    series: RateSeries
    mean_per_min: float
    start_offset_s: float = 0.0
    time_scale: float = 1.0
    span_s: float | None = None
    _steps: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _finite("mean_per_min", self.mean_per_min, strict=True)
        _finite("time_scale", self.time_scale, strict=True)
        offset = _finite("start_offset_s", self.start_offset_s, minimum=self.series.t_s[0])
        if offset >= self.series.end_s:
            raise BasinInputError(
                f"start_offset_s {offset:g} is past the end of '{self.series.name}' ({self.series.end_s:g} s)")
        edges = (np.append(self.series.t_s, self.series.end_s) - offset) / self.time_scale
        first = int(np.searchsorted(edges, 0.0, side="right")) - 1
        edges = np.concatenate([[0.0], edges[first + 1:]])
        shape = np.asarray(self.series.rate_per_s[first:])
        span = edges[-1] if self.span_s is None else _finite("span_s", self.span_s, strict=True)
        if span > edges[-1]:
            raise BasinInputError(
                f"span_s {span:g} is longer than the {edges[-1]:g} s of run time the trace covers from "
                f"the offset at time_scale {self.time_scale:g}")
        within = np.clip(np.minimum(edges[1:], span) - edges[:-1], 0.0, None)
        mean_shape = float(np.sum(shape * within) / span)
        if mean_shape == 0:
            raise BasinInputError(f"'{self.series.name}' has no requests in the chosen span")
        object.__setattr__(self, "_steps", (edges, shape * (self.mean_per_min / 60) / mean_shape))

    @property
    def coverage_s(self) -> float:
        """Run time the trace covers from the offset."""
        return float(self._steps[0][-1])

    def rate_at(self, t_s: float) -> float:
        """Arrival rate (sessions per minute) at run time ``t_s``."""
        edges, rates = self._steps
        if not 0 <= t_s < edges[-1]:
            raise BasinInputError(f"t_s {t_s:g} is outside the {edges[-1]:g} s the trace covers")
        return float(rates[np.searchsorted(edges, t_s, side="right") - 1] * 60)

    def sample(self, duration_s: float, rng: np.random.Generator) -> list[tuple[float, str]]:
        """Arrivals in ``[0, duration_s)``, all tagged ``base``."""
        duration_s = _check_duration(duration_s)
        edges, rates = self._steps
        if duration_s > edges[-1]:
            raise BasinInputError(
                f"a {duration_s:g} s run is longer than the {edges[-1]:g} s the trace '{self.series.name}' "
                "covers; raise time_scale, lower start_offset_s or shorten the run")
        cut = int(np.searchsorted(edges, duration_s, side="left"))
        times = _poisson_times(np.append(edges[:cut], duration_s), rates[:cut], rng)
        return [(float(t), BASE) for t in times]


# --------------------------------------------------------------------------
# Shipped production rate shapes, by name (what a scenario's arrivals.shape names)


@dataclass(frozen=True, slots=True)
class ShippedShape:
    """A production rate trace shipped under ``data/``: read with
    :func:`load_rate_series` (``source``, ``path`` under the data folder,
    ``column``)."""

    source: str
    path: str
    column: str | None
    about: str


_SERVEGEN_LANGUAGE = SERVEGEN_DEFAULT[0]
_SERVEGEN_REASON = "servegen_rates/servegen_reason_mm_aggregate_rate_10min.csv"

#: The rate shapes the data folder ships (data/README.md), by the name a scenario gives.
SHIPPED_SHAPES: dict[str, ShippedShape] = {
    "servegen-m-large": ShippedShape("servegen", _SERVEGEN_LANGUAGE, "m_large_req_per_s",
                                     "Alibaba Bailian (ServeGen) language model m-large, 14 days in 10-minute windows"),
    "servegen-m-mid": ShippedShape("servegen", _SERVEGEN_LANGUAGE, "m_mid_req_per_s",
                                   "Alibaba Bailian (ServeGen) language model m-mid, 14 days in 10-minute windows"),
    "servegen-m-small": ShippedShape("servegen", _SERVEGEN_LANGUAGE, "m_small_req_per_s",
                                     "Alibaba Bailian (ServeGen) language model m-small, 14 days in 10-minute windows"),
    "servegen-deepseek-r1": ShippedShape("servegen", _SERVEGEN_REASON, "deepseek_r1_req_per_s",
                                         "Alibaba Bailian (ServeGen) DeepSeek-R1, 1 day in 10-minute windows"),
    "servegen-mm-image": ShippedShape("servegen", _SERVEGEN_REASON, "mm_image_req_per_s",
                                      "Alibaba Bailian (ServeGen) Qwen-VL image, 1 day in 10-minute windows"),
    "azure-code": ShippedShape("azure", "azure_llm_2023/AzureLLMInferenceTrace_code.csv", None,
                               "Azure LLM inference 2023, code, 57 complete minutes"),
    "azure-conv": ShippedShape("azure", "azure_llm_2023/AzureLLMInferenceTrace_conv.csv", None,
                               "Azure LLM inference 2023, conversation, 58 complete minutes"),
}


def shape_names() -> list[str]:
    """Names of the shipped rate shapes, sorted."""
    return sorted(SHIPPED_SHAPES)


def _unknown_shape(name: object) -> str:
    return f"unknown arrival shape {name!r}; the shipped shapes are {', '.join(shape_names())}"


@functools.cache
def _cached_shape(name: str, data_dir: Path) -> RateSeries:
    shape = SHIPPED_SHAPES[name]
    series = load_rate_series(shape.source, data_dir / shape.path, shape.column)
    return replace(series, name=name)


def load_shape(name: str) -> RateSeries:
    """The shipped rate shape ``name`` (:data:`SHIPPED_SHAPES`) as a rate series."""
    if name not in SHIPPED_SHAPES:
        raise BasinInputError(_unknown_shape(name))
    return _cached_shape(name, DATA_DIR)


def shape_minutes(name: str) -> float:
    """Trace minutes the shipped shape ``name`` covers."""
    series = load_shape(name)
    return (series.end_s - series.t_s[0]) / 60.0


def check_shape_window(name: str, duration_min: float, offset_min: float = 0.0,
                       window_min: float | None = None) -> tuple[float, float]:
    """The trace minutes ``(offset_min, window_min)`` a run of ``duration_min``
    plays from shape ``name`` (``window_min`` None: as many as the run lasts),
    or an error naming the field to change when they leave the trace."""
    _finite("duration_min", duration_min, strict=True)
    offset_min = _finite("offset_min", offset_min)
    window = duration_min if window_min is None else _finite("window_min", window_min, strict=True)
    covered = shape_minutes(name)
    if offset_min >= covered:
        raise BasinInputError(f"offset_min {offset_min:g} is past the end of shape '{name}', which covers "
                              f"{covered:g} trace minutes; choose an offset below {covered:g}")
    if offset_min + window > covered * (1 + 1e-12):
        default = "" if window_min is not None else f" (by default the run's duration_min, {duration_min:g})"
        raise BasinInputError(
            f"shape '{name}' covers {covered:g} trace minutes, so offset_min {offset_min:g} plus window_min "
            f"{window:g}{default} runs past its end; set window_min to at most {covered - offset_min:g} "
            "(it is stretched over the run) or lower offset_min")
    return offset_min, window


def shaped_schedule(name: str, mean_per_min: float, duration_s: float, offset_min: float = 0.0,
                    window_min: float | None = None) -> TraceShapedSchedule:
    """Poisson arrivals following the shipped shape ``name`` over a run of
    ``duration_s``: the run plays ``window_min`` trace minutes from
    ``offset_min`` on (None: as many as the run lasts, so trace time is run
    time), rescaled so the mean rate over the run is ``mean_per_min``."""
    duration_s = _check_duration(duration_s)
    offset_min, window = check_shape_window(name, duration_s / 60.0, offset_min, window_min)
    series = load_shape(name)
    start = series.t_s[0] + offset_min * 60.0
    time_scale = window * 60.0 / duration_s
    # Rounding must not leave the trace a hair short of the run it was sized for.
    while (series.end_s - start) / time_scale < duration_s:
        time_scale = float(np.nextafter(time_scale, 0.0))
    return TraceShapedSchedule(series, mean_per_min, start_offset_s=start, time_scale=time_scale,
                               span_s=duration_s)


# --------------------------------------------------------------------------
# Sessions onto arrivals


@dataclass(frozen=True, slots=True)
class SessionArrival:
    """A session entering a run at ``arrival_s``; a warm session is already
    active at time zero and starts at call ``start_call``."""

    arrival_s: float
    session: Session
    tag: str
    start_call: int = 0


class _PassDrawer:
    """Sessions in shuffled passes: every session once before any twice."""

    def __init__(self, workload: Workload, rng: np.random.Generator) -> None:
        self._sessions = workload.sessions
        self._rng = rng
        self._order: list[int] = []

    def next(self) -> Session:
        if not self._order:
            self._order = list(self._rng.permutation(len(self._sessions))[::-1])
        return self._sessions[self._order.pop()]


def _warm(workload: Workload, n: int, call_s: float, rng: np.random.Generator) -> list[SessionArrival]:
    """``n`` sessions as a random moment of steady operation finds them: a
    session with probability proportional to its lifetime (tool gaps plus
    ``call_s`` per call), inside it at a call with probability proportional
    to the time spent from that call's start to the next call's."""
    if n == 0:
        return []  # the weights read every call of the workload; none is drawn from them
    phases = [np.array([c.tool_gap_s for c in s.calls]) + call_s for s in workload.sessions]
    lifetimes = np.array([p.sum() for p in phases])
    picks = rng.choice(len(workload.sessions), size=n, p=lifetimes / lifetimes.sum())
    out = []
    for i in picks:
        start = int(rng.choice(len(phases[i]), p=phases[i] / lifetimes[i]))
        out.append(SessionArrival(0.0, workload.sessions[i], WARM, start))
    return out


def draw_arrivals(workload: Workload, schedule: ArrivalSchedule, duration_s: float, seed: int,
                  warm_sessions: int = 0, burst_workload: Workload | None = None,
                  warm_call_s: float = 5.0) -> list[SessionArrival]:
    """Arrivals of ``schedule`` over ``duration_s`` with sessions drawn onto them.

    Base arrivals take sessions of ``workload`` and burst arrivals sessions of
    ``burst_workload`` (default: ``workload``), each in shuffled passes: every
    session is used once before any is used twice. ``warm_sessions`` sessions
    are active at time zero (tag ``warm``, ``arrival_s`` 0), drawn as steady
    operation would hold them (see :func:`_warm`; ``warm_call_s`` is the
    assumed service time of one call). Warm sessions come first, then the
    arrivals in time order. A session drawn again gets the id suffix ``~2``,
    ``~3``, ... so ids are unique within the result.
    """
    duration_s = _check_duration(duration_s)
    if isinstance(warm_sessions, bool) or not isinstance(warm_sessions, int) or warm_sessions < 0:
        raise BasinInputError(f"warm_sessions: expected a whole number >= 0, got {warm_sessions!r}")
    _finite("warm_call_s", warm_call_s, strict=True)
    times_seq, base_seq, burst_seq, warm_seq = np.random.SeedSequence(seed).spawn(4)
    events = schedule.sample(duration_s, np.random.default_rng(times_seq))
    drawers = {BASE: _PassDrawer(workload, np.random.default_rng(base_seq)),
               BURST: _PassDrawer(burst_workload or workload, np.random.default_rng(burst_seq))}
    arrivals = _warm(workload, warm_sessions, warm_call_s, np.random.default_rng(warm_seq))
    for t, tag in events:
        if tag not in drawers:
            raise BasinInputError(f"the schedule tagged an arrival '{tag}'; expected '{BASE}' or '{BURST}'")
        arrivals.append(SessionArrival(t, drawers[tag].next(), tag))

    used: set[str] = set()
    unique = []
    for a in arrivals:
        sid, copy = a.session.session_id, 1
        while sid in used:
            copy += 1
            sid = f"{a.session.session_id}~{copy}"
        used.add(sid)
        unique.append(a if copy == 1 else replace(a, session=replace(a.session, session_id=sid)))
    return unique


def recorded_arrivals(workload: Workload) -> list[SessionArrival]:
    """A recorded workload's sessions at their own start times (``start_s``), in time order.

    What ``basin gateway --record`` writes, or a trace with arrival times:
    here rather than in the gateway so the simulator can replay it without
    importing the gateway. A session without a start time is refused, not
    given one, because any invented time would be a guess about the traffic.
    """
    starts = workload.extra.get(SESSION_START_KEY)
    if not isinstance(starts, dict) or not starts:
        raise BasinInputError(f"workload '{workload.name}': no session start times (start_s); it was not "
                              "recorded by basin gateway --record or a trace with arrival times")
    missing = [s.session_id for s in workload.sessions if s.session_id not in starts]
    if missing:
        raise BasinInputError(f"workload '{workload.name}': sessions without start_s: {', '.join(missing[:5])}"
                              f"{' ...' if len(missing) > 5 else ''}; every session needs one to replay at "
                              "its own time")
    return sorted((SessionArrival(float(starts[s.session_id]), s, BASE) for s in workload.sessions),
                  key=lambda a: a.arrival_s)
