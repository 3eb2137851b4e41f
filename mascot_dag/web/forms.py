"""Form bodies for the pages (no python-multipart): read with a size limit, then parse.

Both pages post small urlencoded forms; reading the stream ourselves lets an oversized body be
refused before it is buffered whole or parsed.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import Request


class FormError(ValueError):
    """The body is too large (status 413) or not a parseable UTF-8 form (status 400)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_form(request: Request, max_bytes: int, max_fields: int | None = None
                    ) -> dict[str, list[str]]:
    """The posted urlencoded fields (name -> values, blanks kept); FormError past `max_bytes`."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise FormError(413, f"request body over {max_bytes} bytes")
    try:
        return parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=max_fields)
    except UnicodeDecodeError as exc:
        raise FormError(400, "form body is not UTF-8 text") from exc
    except ValueError as exc:  # more fields than max_fields
        raise FormError(400, f"form could not be parsed: {exc}") from exc


async def read_page_form(request: Request, max_bytes: int, max_fields: int | None,
                         token_field: str) -> dict[str, list[str]]:
    """A page's posted form: urlencoded only (415 otherwise), size-limited, without the form
    token (the guard checked it; it is not one of the page's fields)."""
    if "urlencoded" not in request.headers.get("content-type", ""):
        raise FormError(415, "send the form as application/x-www-form-urlencoded")
    form = await read_form(request, max_bytes, max_fields)
    form.pop(token_field, None)
    return form
