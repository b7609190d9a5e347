"""Reproducible, relocatable vLLM bundles for AMD GPUs."""

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic)
