"""Encoder backends. Each module registers itself with `models.encoder.register_backend` on import."""
