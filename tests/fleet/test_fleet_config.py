"""``lmsp fleet``: the router's nginx configuration (accepted by the nginx installed, with
and without TLS), the fleet key's files, fleet tokens and the merge of gathered lists."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lmsp import ids
from lmsp.api.fleet import cursor_for, merge, named_id
from lmsp.fleet import keys, nginx

BOXES = ["a=127.0.0.1:8001", "b=127.0.0.1:8002", "c=10.0.0.3:8080"]


def nginx_t(root: Path, conf: str) -> subprocess.CompletedProcess:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        pytest.fail("nginx is not installed (scripts/dev test installs it where it can)")
    (root / "nginx.conf").write_text(conf)
    return subprocess.run([binary, "-t", "-p", str(root), "-c", str(root / "nginx.conf")],
                          capture_output=True, text=True, check=False)


def test_the_whole_configuration_passes_nginx_t(tmp_path):
    conf = nginx.whole(nginx.parse("127.0.0.1:9000", BOXES, None, None))
    done = nginx_t(tmp_path, conf)
    assert done.returncode == 0, done.stderr
    for box in ("a", "b", "c"):
        assert f"upstream lmsp_box_{box} {{" in conf and f"    {box} lmsp_box_{box};" in conf
    assert "least_conn;" in conf and "proxy_buffering off;" in conf
    assert "limit_conn lmsp_fleet_per_address 64;" in conf and "client_max_body_size 1m;" in conf
    assert '"code":"box_unavailable"' in conf and "Retry-After" in conf


def test_with_tls_and_as_a_site(tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: the TLS lines need a certificate to be checked with")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x",
                    "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem")], check=True,
                   capture_output=True)
    fleet = nginx.parse("127.0.0.1:9443", BOXES, str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    site = nginx.site(fleet)
    assert "listen 127.0.0.1:9443 ssl http2;" in site and "events" not in site
    wrapped = f"pid nginx.pid;\nevents {{}}\nhttp {{\n{site}}}\n"
    done = nginx_t(tmp_path, wrapped)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("listen, boxes, cert, key", [
    ("nowhere", BOXES, None, None),
    ("127.0.0.1:9000", [], None, None),
    ("127.0.0.1:9000", ["A=h:1"], None, None),
    ("127.0.0.1:9000", ["a=h:1", "a=h:2"], None, None),
    ("127.0.0.1:9000", BOXES, "c.pem", None),
])
def test_bad_arguments_are_refused(listen, boxes, cert, key):
    with pytest.raises(ValueError):
        nginx.parse(listen, boxes, cert, key)


def test_the_id_route_finds_the_owner_of_each_kind_of_id():
    pattern = re.compile(nginx.ID_PATH)
    ids.set_box("b")
    try:
        made = {prefix: ids.new_id(prefix) for prefix in ("resp", "task", "conv")}
    finally:
        ids.set_box("")
    for path in (f"/v1/responses/{made['resp']}/cancel", f"/v1/tasks/{made['task']}/events",
                 f"/v1/conversations/{made['conv']}/items", "/v1/chat/completions/chatcmpl-b_" + made["resp"][7:]):
        found = pattern.match(path)
        assert found is not None and found.group(1) == "b", path
    assert pattern.match("/v1/responses/" + ids.new_id("resp")) is None  # an id of no box


def test_fleet_keys_init_join_and_mode(tmp_path):
    first = keys.init(tmp_path / "a")
    assert first.stat().st_mode & 0o777 == 0o600
    assert keys.init(tmp_path / "a").read_text() == first.read_text()  # kept
    joined = keys.join(tmp_path / "b", first)
    assert joined.read_text() == first.read_text() and joined.stat().st_mode & 0o777 == 0o600
    other = keys.init(tmp_path / "c")
    with pytest.raises(keys.FleetKeyError):
        keys.join(tmp_path / "c", first)  # another fleet's key is there
    (tmp_path / "junk").write_text("not a key")
    with pytest.raises(keys.FleetKeyError):
        keys.join(tmp_path / "d", tmp_path / "junk")
    assert other.exists()


def test_a_fleet_token_holds_only_with_its_key():
    key, other = b"k" * 32, b"o" * 32
    token = keys.token(key, "cli_a_X", "n", ["responses:read"], "lmsp_local")
    found = keys.claims(key, token)
    assert found is not None and found.client_id == "cli_a_X" and found.scopes == ["responses:read"]
    assert keys.claims(other, token) is None
    assert keys.claims(key, token[:-2] + "AA") is None
    assert keys.claims(key, "lmsp_plain") is None
    header = keys.peer_header(key, now=1000)
    assert keys.peer_ok(key, header, now=1010)
    assert not keys.peer_ok(key, header, now=2000) and not keys.peer_ok(other, header, now=1000)


def test_named_ids_cursors_and_merged_pages():
    assert named_id({"previous_response_id": "resp_a_X"}) == "resp_a_X"
    assert named_id({"conversation": {"id": "conv_b_Y"}}) == "conv_b_Y"
    assert named_id({"conversation": 3}) is None and named_id([]) is None
    ids.set_box("a")
    try:
        older, newer = ids.new_id("resp"), ids.new_id("resp")
    finally:
        ids.set_box("")
    assert cursor_for(newer, "b") == "resp_b_" + newer[7:]
    old_form = ids.new_id("resp")
    assert cursor_for(old_form, "b") == old_form
    b_newest = "resp_b_" + newer[7:-1] + "Z"
    page = merge([{"data": [{"id": newer}, {"id": older}], "has_more": False},
                  {"data": [{"id": b_newest}], "has_more": False}], 2)
    assert [row["id"] for row in page["data"]] == [b_newest, newer] and page["has_more"]


def test_the_shipped_example_is_what_the_command_prints():
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "fleet" / "fleet.conf"
    boxes = [f"{box}=10.0.0.{n}:8080" for n, box in enumerate("abc", start=1)]
    fleet = nginx.parse("0.0.0.0:443", boxes, "/etc/ssl/certs/lmsp.pem", "/etc/ssl/private/lmsp.key")
    assert shipped.read_text() == nginx.whole(fleet)
