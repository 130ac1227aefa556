"""What more than one package needs and no package should pay torch for: environment variable names,
shared defaults and the user-error types (Ray Serve's `_private/constants.py` is the model). Nothing here
imports torch, Ray or any other package of the project (tests/unit/test_core.py checks both)."""
