"""``basin calibrate``: measure a running OpenAI-compatible engine over HTTP
and write a calibrated profile (docs/calibrate.md).

An HTTP client that writes catalogue data: it imports the catalogue and
nothing of the simulator.
"""

from basin.calibrate.measure import CalibrationSettings, Measured, calibrate
from basin.calibrate.profile import build_profile, output_path, write_profile

__all__ = ["CalibrationSettings", "Measured", "build_profile", "calibrate", "output_path", "write_profile"]
