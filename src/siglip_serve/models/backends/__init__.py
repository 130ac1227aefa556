"""Encoder backends. Each module registers itself with `siglip_serve.models.encoder.register_backend` on import."""
