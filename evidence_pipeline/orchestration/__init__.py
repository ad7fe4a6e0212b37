"""The Dagster code location: the pipeline's stages as assets, checks, sensors and a schedule.

``evidence_pipeline.definitions`` builds the one ``dg.Definitions``; the modules here hold one
concept each. Importing this package does not import Dagster (the CLI imports ``runs`` only
when ``DAGSTER_HOME`` is set).
"""
