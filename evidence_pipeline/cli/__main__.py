"""``python -m evidence_pipeline.cli``."""

from evidence_pipeline.cli.app import main

main()
