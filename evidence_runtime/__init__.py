"""Read-only runtime of thoth-evidence: the unit contract, query text, index access and search."""
