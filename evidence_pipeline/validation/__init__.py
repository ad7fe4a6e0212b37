"""The deterministic validator: problem types, corpus reading, rules, and the entry points."""
