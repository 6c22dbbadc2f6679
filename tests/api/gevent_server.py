"""Serve the app under gevent (monkey-patched, like a gunicorn gevent worker)
with the scripted worker holding every task; used by ``test_gevent.py``.

Usage: python gevent_server.py DATA_DIR  -> prints {"port", "token"} on one line.
"""
from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from api_fakes import ScriptedRuntime  # noqa: E402
from gevent.pywsgi import WSGIServer  # noqa: E402

from lmsp import auth  # noqa: E402
from lmsp.app import create_app  # noqa: E402
from lmsp.config import Config  # noqa: E402
from lmsp.store import Store  # noqa: E402


def main() -> None:
    data = Path(sys.argv[1])
    config = Config(data_dir=data, heartbeat_seconds=0.2).validated()
    store = Store.open(config.db_path, durability="off")
    store.put_model({"id": "tiny", "path": "tiny.gguf", "digest": "sha256:" + "0" * 64, "size_bytes": 1})
    token = auth.new_token()
    store.create_client(name="gevent", scopes=["admin"], token_hash=auth.hash_token(token))
    runtime = ScriptedRuntime(store, auto=False)
    server = WSGIServer(("127.0.0.1", 0), create_app(config, store, runtime), log=None)
    server.start()
    print(json.dumps({"port": server.server_port, "token": token}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
