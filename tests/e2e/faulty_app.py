"""The service's app with one fault planted, for the end-to-end tests: an exception
that escapes the WSGI app (past Falcon's error handlers) on one path.

gunicorn serves it with the service's configuration, named by its APP argument
(``gunicorn -c python:lmsp.serving.gunicorn_conf faulty_app:get_app()``), with this
directory on PYTHONPATH: ``Server(..., app="faulty_app:get_app()")``.
"""
from __future__ import annotations

FAULT_PATH = "/test-fault"
SECRET = "the planted fault's detail, which no client may see"


def get_app():
    from lmsp.app import get_app as service_app

    app = service_app()

    def faulty(environ, start_response):
        if environ.get("PATH_INFO") == FAULT_PATH:
            raise RuntimeError(SECRET)
        if environ.get("PATH_INFO") == FAULT_PATH + "/body":
            def body():
                raise RuntimeError(SECRET)
                yield b""  # a generator that fails before its first item, so before any header is sent
            start_response("200 OK", [("Content-Type", "text/plain")])
            return body()
        return app(environ, start_response)

    return faulty
