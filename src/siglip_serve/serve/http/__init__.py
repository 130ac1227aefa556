"""The HTTP contract (docs/http-api.md): what a request holds, what an answer holds, every error and the
OpenAPI document. Nothing here knows Ray or the config."""
