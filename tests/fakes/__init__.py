"""Deterministic fakes for the true external boundaries of the model step."""
