"""The workspace's shared formats: what authoring, validation and publishing all speak.

Mechanical normalization of source text, the manifest, the evaluation set, the YAML round-trip
of curated files, how a unit is rendered into fragments (with the atomic-size rule), and a
file's change as a unified diff (the review page, suggest's patch). It sits below the three
stages and imports none of them.
"""
