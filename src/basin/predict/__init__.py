"""basin.predict: BASIN's offline estimates.

* :mod:`basin.predict.peak`: the peak-context predictors the controller asks
  at a session's first call (:class:`PeakPredictor`, :func:`make_predictor`);
  :mod:`basin.predict.ridge` holds the scikit-learn model behind the ridge one
  and is imported only when a model is fitted or evaluated.
* ``basin.predict.profile`` and ``basin.predict.cliff``: the cache-cliff
  profiler (imported from their modules).
"""

from basin.predict.peak import (
    NoisyOraclePredictor,
    OraclePredictor,
    PeakEvaluation,
    PeakPredictor,
    RidgePeakPredictor,
    evaluate,
    make_predictor,
)

__all__ = [
    "NoisyOraclePredictor",
    "OraclePredictor",
    "PeakEvaluation",
    "PeakPredictor",
    "RidgePeakPredictor",
    "evaluate",
    "make_predictor",
]
