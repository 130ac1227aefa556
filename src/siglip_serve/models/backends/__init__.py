"""Encoder backends: one module per backend holding its Runner and its Implementation
(implementation.py says what that is); their records, and the loader of a record's "module:attribute",
are core/backends.py's."""
