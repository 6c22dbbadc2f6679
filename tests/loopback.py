"""What the tests that start ``lmsp`` processes on this machine share: a free
port on loopback and the command that runs ``lmsp``."""
from __future__ import annotations

import socket
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lmsp_command() -> list[str]:
    script = Path(sys.executable).with_name("lmsp")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lmsp.cli"]
