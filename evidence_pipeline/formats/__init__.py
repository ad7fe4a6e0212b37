"""The workspace's shared formats: what authoring, validation and publishing all speak.

Mechanical normalization of source text, the manifest, the evaluation set, the YAML round-trip
of curated files, and how a unit is rendered into fragments (with the atomic-size rule). It
sits below the three stages and imports none of them.
"""
