"""Credentials stay out of what Conveyor prints: URLs lose their password (``mask_url``), and
every log line passes ``mask`` (a URL's password or an API key becomes ``***``)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# scheme://user:password@ in any text (a repr of an exception, a message)
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^:/@\s]*):([^@\s]*)@", re.IGNORECASE)
# an API key (core.apikeys: cvk_<12 hex>_<43 url-safe>): its secret part
_API_KEY = re.compile(r"(cvk_[0-9a-f]{12}_)[A-Za-z0-9_-]{8,}")


def mask_url(url: str) -> str:
    """``postgresql://u:secret@h/db`` → ``postgresql://u:***@h/db``."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
    except ValueError:
        return mask(url)


def mask(text: str) -> str:
    """Any URL password and API key secret in ``text`` replaced by ``***``."""
    if "@" in text:
        text = _URL_PASSWORD.sub(r"\1:***@", text)
    if "cvk_" in text:
        text = _API_KEY.sub(r"\1***", text)
    return text


class MaskedStream:
    """A text stream (``cli.main`` wraps stderr) that masks what is written to it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return int(self.stream.write(mask(text)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
