"""The operator's console is served by the service: its page, script and style sheet,
with no token, under a strict Content-Security-Policy, with no cookie, and the page
names no file but its own."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from lmsp.api.console import FILES

PAGE, SCRIPT, STYLE = (path for path, _, _ in FILES)


class Refs(HTMLParser):
    """What the page loads (src, href) and whether it holds inline code or style."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.inline: list[str] = []
        self._tag = ""

    def handle_starttag(self, tag, attrs):
        self._tag = tag
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.refs.append(value)
            if name == "style" or name.startswith("on"):
                self.inline.append(f"{tag} {name}")
        if tag == "style":
            self.inline.append("style element")

    def handle_data(self, data):
        if self._tag == "script" and data.strip():
            self.inline.append("script text")

    def handle_endtag(self, tag):
        self._tag = ""


@pytest.mark.parametrize(("path", "media"), [(PAGE, "text/html"), (SCRIPT, "text/javascript"), (STYLE, "text/css")])
def test_each_file_is_served_without_a_token_under_a_strict_policy(anon, path, media):
    result = anon.get(path)
    assert result.status_code == 200
    assert result.headers["Content-Type"].split(";")[0] == media
    assert "charset=utf-8" in result.headers["Content-Type"]
    policy = dict(part.strip().split(" ", 1) for part in result.headers["Content-Security-Policy"].split(";"))
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    assert policy["connect-src"] == "'self'" and policy["frame-ancestors"] == "'none'"
    assert "unsafe" not in result.headers["Content-Security-Policy"]
    assert result.headers["X-Content-Type-Options"] == "nosniff"
    assert "Set-Cookie" not in result.headers and result.cookies == {}
    assert result.content


def test_head_answers_as_get_without_a_body(anon):
    for path, _, _ in FILES:
        got, head = anon.get(path), anon.request("HEAD", path)
        assert head.status_code == 200 and head.content == b""
        assert head.headers["Content-Security-Policy"] == got.headers["Content-Security-Policy"]


def test_a_token_changes_nothing_and_sets_no_cookie(user, anon):
    assert user.get(PAGE).content == anon.get(PAGE).content
    assert "Set-Cookie" not in user.get(PAGE).headers


def test_the_page_loads_only_its_own_files_and_holds_no_inline_code(anon):
    parser = Refs()
    parser.feed(anon.get(PAGE).text)
    assert sorted(parser.refs) == sorted([SCRIPT, STYLE])
    assert parser.inline == []


def test_the_script_calls_only_this_service_and_keeps_the_token_in_the_tab(anon):
    script = anon.get(SCRIPT).text
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", script)  # the SVG namespace is a name, not a call
    assert "localStorage" not in script and "document.cookie" not in script
    assert "sessionStorage" in script and "Authorization" in script
    assert not re.search(r"\binnerHTML\b|\beval\(|new Function", script)
    assert not re.search(r"@import|url\(", anon.get(STYLE).text)


def test_other_paths_under_the_console_are_not_found(anon):
    assert anon.get("/console/index.html").status_code == 404
    assert anon.get("/console/../v1/models").status_code in (401, 404)
