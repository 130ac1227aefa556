"""/v1/embeddings' request (serve/ingress/endpoints/embeddings.py) and answer (serve/http/embedding_output.py): how
items are read, the encoding alias, `dimensions`, and the quantized encodings against numpy."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from pydantic import ValidationError

from siglip_serve.serve.http.embedding_output import check_dimensions, cut_dimensions, encode_rows
from siglip_serve.serve.http.errors import ApiError
from siglip_serve.serve.ingress.endpoints.embeddings import EmbeddingsRequest, looks_like_image, read_items


def request(**body: object) -> EmbeddingsRequest:
    return EmbeddingsRequest.model_validate(body)


def kinds(**body: object) -> list[str]:
    return [item.kind for item in read_items(request(**body))]


def test_the_compatibility_rule_reads_image_signatures_not_base64_looks(photo_jpegs: list[bytes]) -> None:
    from PIL import Image

    bare = base64.b64encode(photo_jpegs[0]).decode()
    assert looks_like_image("data:image/jpeg;base64," + bare) and looks_like_image(bare)
    assert looks_like_image("data:,anything")  # a data URI is always an image (and fails as one if bad)
    for fmt in ("PNG", "GIF", "BMP", "TIFF", "WEBP"):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buf, format=fmt)
        assert looks_like_image(base64.b64encode(buf.getvalue()).decode()), fmt
    assert looks_like_image(base64.urlsafe_b64encode(photo_jpegs[0]).decode())
    # Base64-looking words that are no image file: texts now (before: images, then a 400).
    for text in ("a photo of a cat", "cat", "/9j/", bare[:31], "not base64!!", "https://example.com/cat.jpg",
                 base64.b64encode(b"\x00" * 100).decode(), "Supercalifragilisticexpialidocious0123456789"):
        assert not looks_like_image(text), text


def test_base64_with_whitespace_is_read_by_its_signature_too(photo_jpegs: list[bytes]) -> None:
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, format="PNG")
    for data in (photo_jpegs[0], png.getvalue()):
        bare = base64.b64encode(data).decode()
        mime = base64.encodebytes(data).decode()  # a line break every 76 characters, one at the end
        assert "\n" in mime.strip()
        for spaced in (mime, mime.replace("\n", "\r\n"), " ".join(bare[i:i + 4] for i in range(0, len(bare), 4)),
                       "\t" + bare[:40] + "\n  " + bare[40:] + " \n"):
            # Before: text (and refused as text_too_long), the whitespace failing the alphabet.
            assert looks_like_image(spaced), repr(spaced[:90])
            assert kinds(input=[spaced, "a cat"]) == ["image", "text"]
    # Words and spaces stay texts: no sentence is base64 of an image's signature without its spaces.
    for text in ("a photo of a cat sitting on a red mat next to a dog", "the quick brown fox jumps over the lazy dog",
                 "iVBOR is how a PNG's base64 starts", "/9j/ is how a JPEG's base64 starts, said someone",
                 "R0lG OD lh " * 2, base64.encodebytes(b"\x00" * 100).decode(), " \n\t " * 20):
        assert not looks_like_image(text), text


def test_typed_items_and_modality_decide_without_guessing(photo_jpegs: list[bytes]) -> None:
    bare = base64.b64encode(photo_jpegs[0]).decode()
    broken = bare[:40] + "!" + bare[41:]  # one bad character: by the rule alone this reads as text
    assert kinds(input=[bare, "a cat", broken]) == ["image", "text", "text"]
    assert kinds(input=[broken], modality="image") == ["image"]  # then answered 400 invalid_base64 as an image
    assert kinds(input=bare, modality="text") == ["text"]
    typed = read_items(request(input=[{"type": "text", "text": bare}, {"type": "image", "image": "cat"}, "dog"]))
    assert [(i.kind, i.value, i.label) for i in typed] == [("text", bare, "input[0]"), ("image", "cat", "input[1]"),
                                                            ("text", "dog", "input[2]")]
    assert kinds(input={"type": "image", "image": bare}) == ["image"]
    with pytest.raises(ApiError) as contradiction:
        read_items(request(input=[{"type": "text", "text": "a cat"}], modality="image"))
    assert contradiction.value.status == 422 and "input[0] is typed text" in contradiction.value.message
    with pytest.raises(ApiError):
        read_items(request(input=[]))
    for bad in ({"input": [{"type": "audio", "audio": "x"}]}, {"input": "x", "modality": "video"},
                {"input": [{"type": "text", "text": "x", "image": "y"}]}, {"input": "x", "dimensions": 0}):
        with pytest.raises(ValidationError):
            EmbeddingsRequest.model_validate(bad)


def test_embedding_types_is_an_alias_of_encoding_format() -> None:
    assert request(input="x").encoding() == "float"
    assert request(input="x", embedding_types=["int8"]).encoding() == "int8"
    assert request(input="x", embedding_types="ubinary", encoding_format="ubinary").encoding() == "ubinary"
    for body in ({"embedding_types": ["int8", "binary"]}, {"embedding_types": "int8", "encoding_format": "float"}):
        with pytest.raises(ApiError) as error:
            request(input="x", **body).encoding()
        assert error.value.status == 422


def unit_rows(count: int, width: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((count, width)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_dimensions_are_refused_unless_truncation_is_allowed_then_cut_and_renormalised() -> None:
    assert check_dimensions(None, 64, False) is None and check_dimensions(64, 64, False) is None
    for dimensions, allowed in ((32, False), (65, True)):
        with pytest.raises(ApiError) as error:
            check_dimensions(dimensions, 64, allowed)
        assert error.value.status == 400
    assert "allow_dimension_truncation" in str(pytest.raises(ApiError, check_dimensions, 32, 64, False).value)
    assert check_dimensions(32, 64, True) == 32
    rows = unit_rows(3, 64)
    cut = cut_dimensions(rows, 32)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(cut, rows[:, :32] / np.linalg.norm(rows[:, :32], axis=1, keepdims=True), rtol=1e-6)


def test_quantized_encodings_round_trip_against_numpy() -> None:
    rows = unit_rows(4, 1152)
    floats, none = encode_rows(rows, "float")
    assert none is None and np.array_equal(np.stack(floats), rows)
    packed, _ = encode_rows(rows, "base64")
    assert np.array_equal(np.stack([np.frombuffer(base64.b64decode(p), "<f4") for p in packed]), rows)

    q8, scales = encode_rows(rows, "int8")
    assert scales is not None and all(r.dtype == np.int8 and np.abs(r).max() == 127 for r in q8)
    back = np.stack(q8).astype(np.float32) / np.array(scales)[:, None]
    assert np.abs(back - rows).max() <= 0.5 / min(scales) + 1e-7  # half a step of each row's scale
    q8f = np.stack(q8).astype(np.float64)
    cosines = np.sum(q8f * rows, axis=1) / np.linalg.norm(q8f, axis=1)
    assert cosines.min() >= 0.999
    u8, uscales = encode_rows(rows, "uint8")
    assert uscales == scales and np.array_equal(np.stack(u8).astype(np.int16) - 128, np.stack(q8))

    ubits, _ = encode_rows(rows, "ubinary")
    assert np.stack(ubits).shape == (4, 144) and np.array_equal(np.unpackbits(np.stack(ubits), axis=1), rows > 0)
    bits, _ = encode_rows(rows, "binary")
    assert np.array_equal(np.stack(bits).astype(np.int16) + 128, np.stack(ubits))
    odd, _ = encode_rows(unit_rows(1, 12), "ubinary")  # 12 dimensions: the last byte's low 4 bits are 0
    assert len(odd[0]) == 2 and int(odd[0][1]) & 0x0F == 0


def test_cohere_shape_reads_into_the_same_items() -> None:
    from siglip_serve.serve.ingress.endpoints.cohere_embed import CohereEmbedRequest, read_cohere_items

    def items(**body: object) -> list[tuple[str, str, str]]:
        return [(i.kind, i.value, i.label) for i in read_cohere_items(CohereEmbedRequest.model_validate(body))]

    assert items(texts=["a", "b"]) == [("text", "a", "texts[0]"), ("text", "b", "texts[1]")]
    assert items(images=["data:image/png;base64,xx"]) == [("image", "data:image/png;base64,xx", "images[0]")]
    assert items(inputs=[{"content": [{"type": "text", "text": "a"}]},
                         {"content": [{"type": "image_url", "image_url": {"url": "data:,x"}}]}]) == [
        ("text", "a", "inputs[0]"), ("image", "data:,x", "inputs[1]")]
    for body, needle in (({"texts": ["a"], "images": ["b"]}, "exactly one"), ({}, "exactly one"),
                         ({"texts": []}, "at least one"),
                         ({"inputs": [{"content": [{"type": "text", "text": "a"},
                                                   {"type": "image_url", "image_url": {"url": "x"}}]}]}, "2 contents")):
        with pytest.raises(ApiError) as error:
            read_cohere_items(CohereEmbedRequest.model_validate(body))
        assert error.value.status == 422 and needle in error.value.message, body
    for truncate in ("START", "NONE"):  # texts are cut at the end only, and counted only in the replica
        with pytest.raises(ValidationError):
            CohereEmbedRequest.model_validate({"texts": ["a"], "truncate": truncate})


def test_image_urls_are_read_as_url_items_where_an_image_is_expected(photo_jpegs: list[bytes]) -> None:
    from siglip_serve.serve.ingress.endpoints.cohere_embed import CohereEmbedRequest, read_cohere_items

    url = "https://images.example.com/cat.jpg"  # parsed only: nothing here fetches
    data_uri = "data:image/jpeg;base64," + base64.b64encode(photo_jpegs[0]).decode()

    def read(**body: object) -> list[tuple[str, str | bytes, str, bool]]:
        return [(i.kind, i.value, i.label, i.url) for i in read_items(request(**body))]

    # OpenAI's content part, the typed image, and a string under modality image (Infinity's way).
    assert read(input=[{"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                       {"type": "image", "image": f" {url} "}, {"type": "image_url", "image_url": {"url": data_uri}},
                       {"type": "text", "text": url}]) == [
        ("image", url, "input[0]", True), ("image", url, "input[1]", True), ("image", data_uri, "input[2]", False),
        ("text", url, "input[3]", False)]
    assert read(input=[url, "http://10.0.0.1/a.png"], modality="image") == [
        ("image", url, "input[0]", True), ("image", "http://10.0.0.1/a.png", "input[1]", True)]
    # Other schemes are URL items too: the fetcher refuses them as url_not_allowed, not as broken base64.
    assert read(input=["ftp://x/a.jpg"], modality="image")[0][3] is True
    # Without modality or a type, a URL is a text (a text may be a URL), as before.
    assert read(input=url) == [("text", url, "input", False)]
    assert [i.kind for i in read_items(request(input=[url, "a cat"]))] == ["text", "text"]
    with pytest.raises(ApiError) as contradiction:
        read_items(request(input=[{"type": "image_url", "image_url": {"url": url}}], modality="text"))
    assert contradiction.value.status == 422

    cohere = read_cohere_items(CohereEmbedRequest.model_validate(
        {"inputs": [{"content": [{"type": "image_url", "image_url": {"url": url}}]}]}))
    assert [(i.kind, i.value, i.url) for i in cohere] == [("image", url, True)]
    images = read_cohere_items(CohereEmbedRequest.model_validate({"images": [url, data_uri]}))
    assert [i.url for i in images] == [True, False]


def test_a_request_can_bypass_the_embedding_cache() -> None:
    from siglip_serve.serve.ingress.endpoints.cohere_embed import CohereEmbedRequest

    assert request(input="x").cache is True and request(input="x", cache=False).cache is False
    assert CohereEmbedRequest.model_validate({"texts": ["a"], "cache": False}).cache is False
    with pytest.raises(ValidationError):
        request(input="x", cache="sometimes")


def test_url_items_are_replaced_by_their_bytes_and_the_first_refusal_names_its_item() -> None:
    import asyncio
    import time

    import httpx

    from siglip_serve.serve.http.embed_request import Item, image_item
    from siglip_serve.serve.ingress.url_fetch import UrlFetcher, fetch_url_items
    from siglip_serve.serve.plan.config import FetchSettings

    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:  # a mock transport: nothing leaves the process
        asked.append(request.url.path)
        return httpx.Response(200, stream=httpx.ByteStream(b"image:" + request.url.path.encode()))

    async def resolver(host: str, port: int) -> list[str]:
        return {"img.test": ["127.0.0.2"], "inside.test": ["10.0.0.7"]}[host]

    async def run(items: list[Item]) -> list[Item]:
        fetcher = UrlFetcher(FetchSettings(allowlist=("*.test", "127.0.0.2/32")), resolver=resolver,
                             transport=httpx.MockTransport(answer))
        try:
            return await fetch_url_items(items, fetcher, time.monotonic() + 5)
        finally:
            await fetcher.aclose()

    items = [Item("text", "a cat", "input[0]"), image_item("http://img.test/a.jpg", "input[1]"),
             Item("image", "data:,x", "input[2]"), image_item("https://img.test/b.jpg", "input[3]")]
    out = asyncio.run(run(items))
    assert [(i.kind, i.value, i.label, i.url) for i in out] == [
        ("text", "a cat", "input[0]", False), ("image", b"image:/a.jpg", "input[1]", False),
        ("image", "data:,x", "input[2]", False), ("image", b"image:/b.jpg", "input[3]", False)]
    with pytest.raises(ApiError) as refused:
        asyncio.run(run([image_item("http://img.test/c.jpg", "input[0]"),
                         image_item("http://inside.test/d.jpg", "input[1]")]))
    assert (refused.value.status, refused.value.error_type.value) == (400, "url_not_allowed")
    assert refused.value.message.startswith("input[1]: inside.test resolves to a private address")
    with pytest.raises(ApiError, match=r"^images\[0\]: only http and https URLs are fetched, not ftp"):
        asyncio.run(run([image_item("ftp://img.test/e.jpg", "images[0]")]))
