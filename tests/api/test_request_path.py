"""The path of a request through the service's modules (docs/ARCHITECTURE.md): from
its resource to the runtime, each module is entered once, never again after the
call has gone on to another one."""
from __future__ import annotations

import inspect

import pytest


def package_path(frames: list[inspect.FrameInfo]) -> list[str]:
    """The lmsp modules of a call stack from the outermost frame in, consecutive frames
    of one module counted once."""
    out: list[str] = []
    for info in reversed(frames):
        module = info.frame.f_globals.get("__name__", "")
        if module.startswith("lmsp.") and (not out or out[-1] != module):
            out.append(module)
    return out


@pytest.fixture
def path_to_runtime(scripted, monkeypatch):
    """The modules on the stack when the runtime is asked to create a task."""
    seen: list[list[str]] = []
    create = scripted.create_task

    def create_task(new):
        seen.append(package_path(inspect.stack()))
        return create(new)

    monkeypatch.setattr(scripted, "create_task", create_task)
    return seen


@pytest.mark.parametrize(
    ("path", "body", "resource"),
    [
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, "lmsp.api.chat"),
        ("/v1/completions", {"model": "tiny", "prompt": "hi"}, "lmsp.api.completions"),
        ("/v1/responses", {"model": "tiny", "input": "hi"}, "lmsp.api.responses"),
    ],
)
def test_a_create_request_reaches_the_runtime_through_the_task_service(user, path_to_runtime, path, body, resource):
    assert user.post(path, json=body).status_code == 200
    [modules] = path_to_runtime
    start = modules.index(resource)
    walk = modules[start:]
    assert walk == [resource, "lmsp.service.tasks"], walk
    assert len(set(modules)) == len(modules), modules  # no module entered twice on the way
