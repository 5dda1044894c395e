"""basin-serve: keep LLM agent serving out of the metastable trap."""

__version__ = "0.1.0"

# Whether the compiled build of the hot modules may be used, decided before
# any of them is imported (basin.accel).
from basin import accel as _accel  # noqa: E402

_accel.install()
