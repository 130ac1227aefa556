"""POST /v1/embeddings/image: one image as the raw body, or any number as multipart file parts; the model by
`?model=` (or the default) (docs/http-api.md)."""

# No `from __future__ import annotations`: route modules keep FastAPI-facing types resolvable at runtime.
from fastapi import Request, Response
from pydantic import BaseModel

from siglip_serve.serve.http.embed_request import Item, image_items
from siglip_serve.serve.http.http_body import (
    IMAGE_MEDIA_TYPES,
    check_image_content_type,
    file_labels,
    is_multipart,
    multipart_files,
    read_body,
    render_embeddings,
)
from siglip_serve.serve.http.openapi import WORK_ERRORS, Files, Operation, form
from siglip_serve.serve.http.responses import EmbeddingsResponse
from siglip_serve.serve.ingress.http_app import Route
from siglip_serve.serve.ingress.ingress import Ingress
from siglip_serve.serve.ingress.schedule import Work


async def embeddings_image(ingress: Ingress, request: Request, deadline: float) -> Response:
    served = ingress.serving(request.query_params.get("model"))
    multipart = is_multipart(request)
    if not multipart:
        check_image_content_type(request)
    body = await read_body(request, ingress.front.max_body_bytes)
    if not multipart:
        work = Work("image", [Item("image", body, "image")])
    else:
        files = await multipart_files(request, body)
        work = Work("multipart", image_items([data for _, data in files], file_labels(files)))
    return await served.scheduler.answer(work, deadline, lambda done: render_embeddings(
        done.rows, served.name, "float", images=done.images))


class ImageForm(BaseModel):
    """every file part is an image; the part names do not matter"""

    file: Files


# The raw bytes are read as they come, the multipart form by hand (ImageForm says it for the document).
_BODIES = {**{media: {"schema": {"type": "string", "format": "binary"}} for media in IMAGE_MEDIA_TYPES},
           **form(ImageForm)}

ROWS = (
    Route("POST", "/v1/embeddings/image", embeddings_image, endpoints=("image", "multipart"), doc=Operation(
        "Embed raw image bytes, or the file parts of a multipart form", EmbeddingsResponse,
        "one embedding per image, in order", WORK_ERRORS, bodies=_BODIES, model_in="query")),
)
