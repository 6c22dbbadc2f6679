"""lmsp: a durable local model service implementing LMSP 1.0 on llama.cpp."""

__version__ = "0.1.0"
PROTOCOL = "LMSP/1.0"

__all__ = ["PROTOCOL", "__version__"]
