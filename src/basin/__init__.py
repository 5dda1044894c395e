"""basin-serve: keep LLM agent serving out of the metastable trap."""

__version__ = "0.1.0"
