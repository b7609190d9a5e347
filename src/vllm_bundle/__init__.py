"""Reproducible, relocatable vLLM bundles for AMD GPUs."""

__version__ = "0.1.0"
