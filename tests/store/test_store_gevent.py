"""The store under gevent: greenlets and a real OS thread in one process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_greenlets_and_a_real_thread_share_the_store(db_path):
    # a separate interpreter: monkey-patching must not leak into the test process
    script = Path(__file__).with_name("store_gevent_child.py")
    done = subprocess.run([sys.executable, str(script), str(db_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bad []" in done.stdout
