"""basin.predict: BASIN's offline estimates.

* :mod:`basin.predict.peak`: the peak-context predictors the controller asks
  at a session's first call (:class:`PeakPredictor`, :func:`make_predictor`);
  :mod:`basin.predict.ridge` holds the scikit-learn model behind the ridge one
  and is imported only when a model is fitted or evaluated.
* :mod:`basin.predict.cliff`: the fit of the cache cliff's scale kappa
  (pure numerics, imported from its module). The profile files it feeds are
  the catalogue's (:mod:`basin.catalog.cliff_profiles`); the load ramps they
  are measured on are experiments (:mod:`basin.experiments.ramp`).

It knows nothing of the simulator.
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
