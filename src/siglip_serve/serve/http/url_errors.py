"""The refusals and failures of an image URL's fetch (serve/ingress/url_fetch.py raises them), each a
`Rejected` (core/errors.py) that knows no transport; serve/http/errors.py's REJECTIONS gives each its status
and contract type, for the service and for bulk's errors table."""

from __future__ import annotations

from siglip_serve.core.errors import Rejected


class UrlRejected(Rejected):
    """Base of every URL refusal or failure; raise one of the subclasses."""


class UrlNotAllowed(UrlRejected):
    """The URL may not be fetched: URLs are off, another scheme, a host or address the allowlist does not allow."""


class UrlFetchFailed(UrlRejected):
    """The fetch was tried and failed: no such name, no connection, a status other than 200, too many redirects,
    a redirect to nowhere, an encoded body, an answer that is not HTTP or a connection that broke."""


class UrlTooLarge(UrlRejected):
    """The body is over the image byte limit (declared or streamed)."""


class UrlTimeout(UrlRejected):
    """The wait for a fetch slot did not end within the deadline, or the fetch not within url_fetch_timeout_s
    (or the deadline)."""
