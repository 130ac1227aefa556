"""The error contract's one handler, on a bare FastAPI app (no Ray needed)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from siglip_serve.serve.http.errors import ApiError, ErrorType, install_error_handlers


class Body(BaseModel):
    input: list[str]


def make_app() -> tuple[FastAPI, list[ApiError]]:
    app = FastAPI()
    seen: list[ApiError] = []
    install_error_handlers(app, seen.append)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret database password in /etc/shadow")

    @app.get("/teapot")
    async def teapot() -> None:
        raise ApiError(415, ErrorType.UNSUPPORTED_MEDIA_TYPE, "no SVG", {"X-Hint": "png"})

    @app.post("/schema")
    async def schema(body: Body) -> dict:
        return {"n": len(body.input)}

    return app, seen


def test_unexpected_exception_is_500_without_its_text() -> None:
    app, seen = make_app()
    response = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert response.status_code == 500
    assert response.json() == {"error": {"message": "internal error; see the server log",
                                         "type": "internal_error", "code": 500}}
    assert "secret" not in response.text and "RuntimeError" not in response.text
    assert [e.error_type for e in seen] == [ErrorType.INTERNAL]


def test_api_error_keeps_status_type_and_headers() -> None:
    app, seen = make_app()
    response = TestClient(app).get("/teapot")
    assert response.status_code == 415 and response.headers["x-hint"] == "png"
    assert response.json()["error"] == {"message": "no SVG", "type": "unsupported_media_type", "code": 415}
    assert seen[0].status == 415


def test_schema_mismatch_and_unknown_routes_use_the_contract() -> None:
    app, seen = make_app()
    client = TestClient(app)
    bad = client.post("/schema", json={"input": [1, {"x": 2}]})
    assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request"
    assert "input" in bad.json()["error"]["message"]
    missing = client.get("/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    wrong_method = client.get("/schema")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "method_not_allowed"
    assert [e.status for e in seen] == [422, 404, 405]


def test_every_image_error_of_models_has_one_answer_in_the_table() -> None:
    from siglip_serve.models import image_errors
    from siglip_serve.serve.http.errors import REJECTIONS

    raised = {cls for cls in vars(image_errors).values()
              if isinstance(cls, type) and issubclass(cls, image_errors.ImageRejected)} - {image_errors.ImageRejected}
    IMAGE_ERRORS = {cls: answer for cls, answer in REJECTIONS.items() if issubclass(cls, image_errors.ImageRejected)}
    assert set(IMAGE_ERRORS) == raised
    assert {status for status, _ in IMAGE_ERRORS.values()} == {400, 413, 415}


def test_an_image_error_reaching_the_handler_is_answered_from_the_table() -> None:
    from siglip_serve.models.image_errors import ImageTooLarge

    app, seen = make_app()

    @app.get("/huge")
    async def huge() -> None:
        raise ImageTooLarge("image is 9x9, over the 8-pixel side length limit")

    response = TestClient(app).get("/huge")
    assert response.status_code == 413
    assert response.json()["error"] == {"message": "image is 9x9, over the 8-pixel side length limit",
                                        "type": "image_too_large", "code": 413}
    assert [e.error_type for e in seen] == [ErrorType.IMAGE_TOO_LARGE]


def test_every_rejection_of_every_family_has_one_answer_in_the_one_table() -> None:
    """Images, texts and URLs: one base, one table, one adapter (serve/http/errors.py)."""
    from siglip_serve.core.errors import Rejected
    from siglip_serve.core.texts import EmptyText
    from siglip_serve.serve.http.errors import REJECTIONS, rejection_error

    def leaves(cls: type[Rejected]) -> set[type[Rejected]]:
        below = cls.__subclasses__()
        return {cls} if not below else set().union(*(leaves(sub) for sub in below))

    assert set(REJECTIONS) == leaves(Rejected) and len(REJECTIONS) == 11
    error = rejection_error(EmptyText("text is blank (whitespace only)"), "input[1]")
    assert (error.status, error.error_type.value, error.message) == (422, "invalid_request",
                                                                     "input[1]: text is blank (whitespace only)")
