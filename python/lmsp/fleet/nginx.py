"""``lmsp fleet nginx``: the nginx configuration of a fleet, made from its boxes.

The router needs nothing but nginx's own modules. An id in the path names its box
(:data:`lmsp.ids.OWNER`), so a ``map`` on ``$uri`` picks that box's upstream; a box
that cannot be reached answers 503 ``box_unavailable`` from nginx itself. Everything
else goes to the least busy box that is up (``least_conn`` with passive health
checks); the box that takes a create naming an earlier id forwards it once to that
id's box, and a box asked for a list (header ``X-LMSP-Gather``) gathers its peers'
pages into one.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmsp.config import parse_peers

RETRY_AFTER = 5
#: the paths that carry an id (the routes of /v1 with {id} next)
ID_PATH = r"^/v1/(?:responses|tasks|conversations|chat/completions)/[a-z]+[_-]([a-z0-9]{1,8})_[0-9A-HJKMNP-TV-Z]{26}"
UNAVAILABLE_BODY = (
    '{"error":{"code":"box_unavailable","message":"the box that holds this id cannot be reached; '
    'retry later","param":null}}'
)
FLEET_DOWN_BODY = '{"error":{"code":"unavailable","message":"no box of the fleet can be reached","param":null}}'


@dataclass(frozen=True)
class Fleet:
    listen: str
    boxes: dict[str, str]
    tls_cert: str | None = None
    tls_key: str | None = None


def parse(listen: str, boxes: list[str], tls_cert: str | None, tls_key: str | None) -> Fleet:
    """The fleet of the command's arguments (a ValueError says what is wrong)."""
    if not listen or ":" not in listen or not listen.rpartition(":")[2].isdigit():
        raise ValueError(f"--listen is HOST:PORT, not {listen!r}")
    found = parse_peers(",".join(boxes))
    if not found:
        raise ValueError("name every box with --box ID=HOST:PORT")
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    return Fleet(listen, found, tls_cert, tls_key)


def _proxy(upstream: str, *, gather: bool = False) -> list[str]:
    """What every location that passes a request on says (SSE passes unbuffered)."""
    return [
        f"proxy_pass http://{upstream};",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "proxy_set_header Host $host;",
        "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "proxy_set_header X-Forwarded-Proto $scheme;",
        'proxy_set_header X-LMSP-Forwarded "";',
        "proxy_set_header X-LMSP-Gather " + ("$lmsp_gather;" if gather else '"";'),
        "proxy_buffering off;",
        "proxy_cache off;",
        "gzip off;",
        "proxy_connect_timeout 5s;",
        "proxy_send_timeout 300s;",
        "proxy_read_timeout 300s;",
    ]


def _upstreams(fleet: Fleet) -> list[str]:
    out = []
    for box, address in fleet.boxes.items():
        out += [f"upstream lmsp_box_{box} {{", f"    server {address} max_fails=1 fail_timeout={RETRY_AFTER}s;"]
        out += ["    keepalive 8;", "}"]
    out += ["# creates and lists: the box with the fewest open requests among those up", "upstream lmsp_fleet {"]
    out.append("    least_conn;")
    out += [f"    server {address} max_fails=1 fail_timeout={RETRY_AFTER}s;" for address in fleet.boxes.values()]
    out += ["    keepalive 16;", "}"]
    out += ["# a create under an Idempotency-Key: the same box for every retry (keys are kept per box)"]
    out += ["upstream lmsp_fleet_keyed {", "    hash $http_idempotency_key consistent;"]
    out += [f"    server {address} max_fails=1 fail_timeout={RETRY_AFTER}s;" for address in fleet.boxes.values()]
    out += ["    keepalive 16;", "}"]
    return out


def _maps(fleet: Fleet) -> list[str]:
    out = ["# the box in an id of the path", "map $uri $lmsp_owner {", '    default "";', f'    "~{ID_PATH}" $1;', "}"]
    out += ["map $lmsp_owner $lmsp_upstream {", "    default lmsp_fleet;"]
    out += [f"    {box} lmsp_box_{box};" for box in fleet.boxes]
    out += [
        "}",
        "map $http_idempotency_key $lmsp_create_upstream {",
        "    default lmsp_fleet_keyed;",
        '    "" lmsp_fleet;',
    ]
    out += ["}", "# a list asked through the router is gathered from every box", "map $request_method $lmsp_gather {"]
    out += ['    default "";', "    GET 1;", "}"]
    return out


def _server(fleet: Fleet) -> list[str]:
    tls = fleet.tls_cert is not None
    out = ["server {", f"    listen {fleet.listen}{' ssl http2' if tls else ''};"]
    if tls:
        out += [f"    ssl_certificate {fleet.tls_cert};", f"    ssl_certificate_key {fleet.tls_key};"]
    out += [
        "    client_max_body_size 1m;",
        "    client_header_timeout 10s;",
        "    client_body_timeout 30s;",
        "    keepalive_timeout 65s;",
        "    reset_timedout_connection on;",
        "    limit_conn lmsp_fleet_per_address 64;",
        "    limit_conn_status 429;",
        "    # a request naming an id: the box in the id, or 503 box_unavailable",
        f'    location ~ "{ID_PATH}" {{',
        *(f"        {line}" for line in _proxy("$lmsp_upstream")),
        "        proxy_request_buffering off;",
        "        proxy_next_upstream off;",
        "        error_page 502 504 = @lmsp_box_unavailable;",
        "    }",
        "    # creates go to a box that is up, the least busy (or, under an Idempotency-Key, the",
        "    # key's box); the body is buffered so that a refused connection can pass it to",
        "    # the next box; lists are gathered",
        "    location / {",
        *(f"        {line}" for line in _proxy("$lmsp_create_upstream", gather=True)),
        "        proxy_request_buffering on;",
        "        proxy_next_upstream error timeout;",
        "        error_page 502 504 = @lmsp_fleet_unavailable;",
        "    }",
        "    location ~ ^/metrics/?$ {",
        "        allow 127.0.0.1;",
        "        deny all;",
        *(f"        {line}" for line in _proxy("lmsp_fleet")),
        "    }",
        "    location @lmsp_box_unavailable {",
        "        default_type application/json;",
        f"        add_header Retry-After {RETRY_AFTER} always;",
        f"        return 503 '{UNAVAILABLE_BODY}';",
        "    }",
        "    location @lmsp_fleet_unavailable {",
        "        default_type application/json;",
        f"        add_header Retry-After {RETRY_AFTER} always;",
        f"        return 503 '{FLEET_DOWN_BODY}';",
        "    }",
        "}",
    ]
    return out


def site(fleet: Fleet) -> str:
    """The ``http`` part: upstreams, maps and the server (to include in an nginx.conf)."""
    head = [
        "# lmsp fleet: " + ", ".join(f"{box}={address}" for box, address in fleet.boxes.items()),
        "limit_conn_zone $binary_remote_addr zone=lmsp_fleet_per_address:10m;",
    ]
    return "\n".join(head + _upstreams(fleet) + _maps(fleet) + _server(fleet)) + "\n"


def whole(fleet: Fleet) -> str:
    """A complete nginx.conf, every path relative to nginx's prefix (``nginx -p DIR -c FILE``)."""
    body = "\n".join("    " + line if line else "" for line in site(fleet).splitlines())
    return (
        "# run: nginx -p DIR -c FILE (pid, logs and temporary files under DIR)\n"
        "worker_processes auto;\npid nginx.pid;\nerror_log error.log;\n"
        "events {\n    worker_connections 1024;\n}\n"
        "http {\n    access_log off;\n"
        "    client_body_temp_path client_body;\n    proxy_temp_path proxy;\n"
        "    fastcgi_temp_path fastcgi;\n    uwsgi_temp_path uwsgi;\n    scgi_temp_path scgi;\n"
        f"{body}\n}}\n"
    )
