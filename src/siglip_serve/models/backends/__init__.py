"""Encoder backends: their records (builtin.py), the registry every caller asks (registry.py), and one
module per backend holding its Runner and its Implementation (record.py says what both are)."""
