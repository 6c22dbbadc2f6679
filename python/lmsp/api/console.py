"""``GET /console`` and its script and style sheet: the operator's page, served from
the files of ``lmsp/console/``.

The page holds no data and needs no token to be fetched: it asks its user for one
and calls the API with it, as any script could. Its answers carry a strict
Content-Security-Policy (only this origin's script, style and connections; no
inline code, no frames) and never a cookie.
"""

from __future__ import annotations

from pathlib import Path

import falcon

FOLDER = Path(__file__).resolve().parent.parent / "console"

#: the page's files: (route, file name, content type)
FILES = (
    ("/console", "index.html", "text/html; charset=utf-8"),
    ("/console/console.js", "console.js", "text/javascript; charset=utf-8"),
    ("/console/console.css", "console.css", "text/css; charset=utf-8"),
)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class ConsoleFileResource:
    """One file of the console, read once when the app is made."""

    def __init__(self, name: str, content_type: str) -> None:
        self.body = (FOLDER / name).read_bytes()
        self.content_type = content_type

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.status = 200
        resp.content_type = self.content_type
        resp.set_headers(HEADERS)
        resp.data = self.body

    on_head = on_get  # Falcon sends the GET's status and headers without the body


def routes() -> list[tuple[str, object]]:
    """The console's routes with their resources."""
    return [(path, ConsoleFileResource(name, content_type)) for path, name, content_type in FILES]
