"""What more than one package needs and no package should pay torch for: environment variable names,
shared defaults, the user-error types and the contract's check of a text (served and bulk); Ray Serve's
`_private/constants.py` is the model. Nothing here imports torch, Ray or any other package of the
project (tests/unit/test_core.py checks both)."""
