"""The HTTP contract's endpoints (docs/http-api.md), one module each: its route function(s), thin functions of the
replica's `Ingress` (serve/ingress/ingress.py), its request model and how its items are read, its answer model, and
its rows (serve/ingress/http_app.py `Route` / `Probe`), each with its metric labels and its OpenAPI `Operation`.

A work route reads its body into items and hands them to the one scheduling call of the model it names,
`ingress.serving(model).scheduler.answer(Work(...), deadline, render)` (serve/ingress/schedule.py), saying only how to
answer from the rows. What every route shares is written once: the API key, the capability check, the request's place
and deadline (serve/ingress/http_app.py), the limits, admission per tower (drain, readiness), decoding, encoding and
the metrics (serve/ingress/schedule.py); what several endpoints share of the contract is in serve/http/ (items, image
strings, encodings, body reading, the embeddings answer, the document's error table).

A new endpoint is one new module here, whose `ROWS` name the `endpoints` labels its `Work` uses (the metrics export
those) and carry its `Operation` (serve/http/openapi.py builds the document from them), and one entry below. One that
scores pairs (rerank) builds its items, asks `Work(score=True)` and renders `done.scores(...)`, as classify does.
"""

from siglip_serve.serve.ingress.endpoints import classify, cohere_embed, embeddings, image, probes, rerank
from siglip_serve.serve.ingress.http_app import Probe, Route

ROUTES: tuple[Route | Probe, ...] = (
    *image.ROWS, *embeddings.ROWS, *cohere_embed.ROWS, *classify.ROWS, *rerank.ROWS, *probes.ROWS,
)
