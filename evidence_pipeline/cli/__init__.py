"""The ``tht`` command line (``main``), one module per concern."""

from evidence_pipeline.cli.app import main

__all__ = ["main"]
