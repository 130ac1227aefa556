"""`siglip-serve determinism`: does the same input give the same vector whatever it rides with?

For the sample photos (core/sample_photos.py) it compares, bit for bit and by the largest absolute difference,
each photo's vector alone against: the photo in every batch bucket at every position beside the other photos,
another replica's (a tower built in a second process), an embedding-cache hit stored from a batch, bulk
embedding's stages, the other input forms (multipart, base64 JSON, a URL from a loopback server), and the
int8/uint8/binary answers derived from it. Each comparison runs with the model as configured and with
`deterministic: true` (models/settings.py), and `--cost-rounds` times both, alternating.

It runs the service's own pieces in this process (the tower, the ingress's decoding, its cache, bulk's
stages), without Ray: the comparisons are of arithmetic, not of scheduling. The HTTP path that chooses the
batch is held by the suite (tests/unit/test_determinism.py).
"""
