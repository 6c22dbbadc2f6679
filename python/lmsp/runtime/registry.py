"""The model registry: files in the models directory, metadata in the store.

The store keeps each model's path, content digest and GGUF metadata; the files
stay on disk. Paths given over the HTTP API are confined to the models
directory; the operator may register any file by absolute path (``lmsp serve
--model``, ``lmsp models add``). The file side (paths, digests, the loaded
files' identities and their watch) is :mod:`.model_files`. Loading re-checks
the digest, so a changed file is never served. Each worker process holds its
own engines (one per loaded model). A loaded model whose file was written,
truncated or replaced since it was loaded shows ``changed``, and the runtime
unloads it (:meth:`ModelRegistry.changed_files`).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import kv
from ..errors import InvalidRequest, LMSPError, ModelChanged, ModelInUse, ModelLoadFailed, NotFound
from lmsp.serving.hubsafe import offload
from ..objects import public_model
from ._threads import allocate_lock
from .filewatch import FileIdentity
from .model_files import ModelFiles
from .rpc import CONNECTED, RpcServers, model_split, placement

if TYPE_CHECKING:
    from ..native import Engine

log = logging.getLogger("lmsp.runtime")

MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")

# states a Model object can show (B.4); unavailable: an RPC server it is split over did not answer
AVAILABLE, LOADING, LOADED, FAILED, MISSING, CHANGED, UNAVAILABLE = (
    "available",
    "loading",
    "loaded",
    "failed",
    "missing",
    "changed",
    "unavailable",
)


def _shown(stored_path: str) -> str:
    """A model file's path as clients may read it: relative to the models directory,
    or the file's name for a file the operator named outside it."""
    return os.path.basename(stored_path) if os.path.isabs(stored_path) else stored_path


def _without(exc: Exception, real: os.PathLike, given: str) -> str:
    """An error's text with the file's real path (where the data directory lies)
    replaced by the path the client gave."""
    return str(exc).replace(str(real), given)


# llama.cpp's encoders: architectures it runs with non-causal attention and no KV
# cache (llama_model::create_memory gives them none). They pool their hidden
# states into embeddings and make no text.
EMBEDDING_ARCHITECTURES = frozenset(
    {
        "bert",
        "nomic-bert",
        "nomic-bert-moe",
        "jina-bert-v2",
        "jina-bert-v3",
        "modern-bert",
        "neo-bert",
        "eurobert",
        "gemma-embedding",
    }
)


def capabilities(architecture: str | None) -> list[str]:
    """What a model of this architecture does: ``embeddings`` always, ``generation`` unless it is an encoder."""
    return ["embeddings"] if architecture in EMBEDDING_ARCHITECTURES else ["generation", "embeddings"]


KV_ELEMENT_BYTES = 2  # the engine's K and V cells: f16 or bf16 (Engine.info["kv_format"])


def memory_bytes(info: dict[str, Any]) -> int:
    """What a loaded engine holds, from its ``info``: the model file's bytes (its
    weights, read into memory) and, for a model with a KV cache, the cache's cells
    (layers x context x parallel sequences x KV heads x head size, K and V). The
    extension reports no compute buffers: they are not counted."""
    weights = int(info.get("size_bytes") or 0)
    if info.get("architecture") in EMBEDDING_ARCHITECTURES:
        return weights
    shape = [info.get(k) for k in ("n_layer", "n_ctx", "n_parallel", "n_head_kv", "n_embd", "n_head")]
    sizes = [v for v in shape if isinstance(v, int) and v > 0]
    if len(sizes) < len(shape):
        return weights
    n_layer, n_ctx, n_parallel, n_head_kv, n_embd, n_head = sizes
    return weights + 2 * n_layer * n_ctx * n_parallel * n_head_kv * (n_embd // n_head) * KV_ELEMENT_BYTES


def model_object(
    row: dict,
    state: str | None = None,
    has_chat_template: bool | None = None,
    *,
    memory: int | None = None,
    kv_files: tuple[int, int] = (0, 0),
    layers: list[dict[str, Any]] | None = None,
    rpc_servers: list[dict[str, Any]] | None = None,
) -> dict:
    """The Model object of LMSP B.4 from a store model (its path shown as :func:`_shown`
    does), ``state`` and ``has_chat_template`` overriding, with its ``capabilities``,
    the ``memory`` its engine holds here, its KV files (count, bytes), where its
    ``layers`` are while loaded here and the ``rpc_servers`` it is split over."""
    out = public_model(row)
    out["file"] = _shown(row["path"])
    out["capabilities"] = capabilities(row.get("architecture"))
    out["memory_bytes"] = memory
    out["kv_files"], out["kv_bytes"] = kv_files
    out["layers"] = layers
    out["rpc_servers"] = rpc_servers or []
    if state is not None:
        out["state"] = state
    if has_chat_template is not None:
        out["has_chat_template"] = has_chat_template
    return out


class ModelRegistry:
    """Registration, digest checks, and this process's loaded engines."""

    def __init__(self, config, store, engine_factory=None) -> None:
        self.config = config
        self.store = store
        self._factory = engine_factory
        self._lock = allocate_lock()  # guards the dicts below (never held while loading)
        self._engines: dict[str, Engine] = {}  # model id -> engine
        self._loading: set[str] = set()
        self._load_locks: dict[str, Any] = {}
        self.files = ModelFiles(config, self._lock)  # paths, digests, the loaded files (under the same lock)
        self._templates: dict[str, bool] = {}  # digest -> has a chat template, for models registered
        # before the store recorded it
        self.kv_files = kv.Holdings(Path(config.data_dir) / "kv")  # each model file's KV files (lmsp.kv)
        self.rpc = RpcServers(config.rpc_server_list)  # the servers models are split over, as seen here
        # model id -> why: models whose engine lost an RPC server while it ran; the runtime
        # loads them again once their servers answer (tasks wait for them meanwhile)
        self._lost: dict[str, str] = {}

    # registration
    def resolve(self, path: str, *, confined: bool = True) -> Path:
        """The real path of a model file (:meth:`ModelFiles.resolve`)."""
        return self.files.resolve(path, confined=confined)

    def register(
        self,
        path: str,
        model_id: str | None = None,
        progress=None,
        *,
        confined: bool = True,
        rpc_servers: list[str] | None = None,
        tensor_split: list[float] | None = None,
    ) -> dict:
        from .. import native

        split = model_split(rpc_servers, tensor_split, self.config.workers)  # (checked before any work)
        real = self.resolve(path, confined=confined)
        if model_id is None:
            model_id = real.name[:-5] if real.name.lower().endswith(".gguf") else real.name
        if not isinstance(model_id, str) or not MODEL_ID.match(model_id):
            raise InvalidRequest(
                "id must be 1-128 characters: letters, digits, '.', '_', ':' or '-', starting with a letter or digit",
                param="id",
            )
        try:
            info = native.read_gguf_info(str(real))
        except native.ModelFormatError as exc:
            raise InvalidRequest(
                f"{path} is not a usable GGUF model: {_without(exc, real, path)}", param="path"
            ) from None
        except FileNotFoundError:
            raise InvalidRequest(f"no such model file: {path}", param="path") from None
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"cannot read {path}: {_without(exc, real, path)}", param="path") from None
        digest, size = self.digest(real, progress)
        stored_path = self.files.stored_path(real, confined)
        with self._lock:
            loaded = model_id in self._engines
        if loaded:
            raise ModelInUse(f"model {model_id} is loaded; unload it before registering it again")
        row = self.store.put_model(
            {
                "id": model_id,
                "path": stored_path,
                "digest": digest,
                "size_bytes": size,
                "format": "gguf",
                "architecture": info.get("architecture"),
                "parameters": info.get("parameters"),
                "quantization": info.get("quantization"),
                "context_length": info.get("context_length"),
                "has_chat_template": bool(info.get("chat_template")),
                "state": AVAILABLE,
                "rpc_split": split,
            }
        )
        log.info("registered model %s (%s, %s)", model_id, stored_path, digest)
        return model_object(
            row, kv_files=self.kv_files.of(digest), rpc_servers=self.rpc.states(self.servers_of(row), model_id)
        )

    def digest(self, path: Path, progress=None) -> tuple[str, int]:
        """The digest of a file, from the cache while the file is unchanged (:meth:`ModelFiles.digest`)."""
        return self.files.digest(path, progress)

    def file_path(self, row: dict) -> Path:
        return self.files.file_path(row)

    # state
    def state(self, row: dict) -> str:
        """Live state: this process's engines first, then the file on disk, then the stored state."""
        model_id = row["id"]
        with self._lock:
            loaded = self.files.loaded(model_id) if model_id in self._engines else None
            if loaded is None and model_id in self._loading:  # (a model waiting for its lost server: tried again)
                return UNAVAILABLE if model_id in self._lost else LOADING
        if loaded is not None:
            path, identity = loaded
            now = FileIdentity.of(path)
            if identity.same_bytes_as(now):  # a moved change time alone: changed_files hashes it
                return LOADED
            return MISSING if now is None else CHANGED  # until the runtime unloads it
        stored = row.get("state") or AVAILABLE
        if stored not in (FAILED, CHANGED, UNAVAILABLE):  # the row may predate an unload here for a changed file
            stored = self._stored_state(model_id, stored)
        try:
            st = os.stat(self.file_path(row))
        except OSError:
            return MISSING
        if stored in (FAILED, CHANGED, UNAVAILABLE):
            return stored
        if st.st_size != row.get("size_bytes"):
            return CHANGED
        return AVAILABLE if stored in (LOADED, LOADING, MISSING) else stored

    def _stored_state(self, model_id: str, read: str) -> str:
        """The model's stored state now. An unload for a changed file records ``changed``
        before the engine leaves, so a row read while the engine was here (by a listing
        that then found it gone) is read again."""
        try:
            return self.store.get_model(model_id).get("state") or AVAILABLE
        except LMSPError:  # deleted since, or a busy store: what was read
            return read

    def has_chat_template(self, row: dict) -> bool:
        """Whether the model's file declares a chat template: recorded at registration; for a
        model registered before that, read from the file once (False when it cannot be read)."""
        if row.get("has_chat_template") is not None:
            return bool(row["has_chat_template"])
        from .. import native

        with self._lock:
            known = self._templates.get(row["digest"])
        if known is None:
            try:
                known = bool(offload(native.read_gguf_info, str(self.file_path(row))).get("chat_template"))
            except (OSError, ValueError, native.NativeError):
                known = False
            with self._lock:
                self._templates[row["digest"]] = known
        return known

    def object(self, model_id: str) -> dict:
        return self._object(self.store.get_model(model_id))

    def objects(self) -> list[dict]:
        return [self._object(row) for row in self.store.list_models()]

    def _object(self, row: dict) -> dict:
        state = self.state(row)
        engine = self.engine(row["id"]) if state == LOADED else None
        info = getattr(engine, "info", None)  # (an engine a test makes may report none)
        memory = memory_bytes(info) if isinstance(info, dict) else None
        return model_object(
            row,
            state,
            self.has_chat_template(row),
            memory=memory,
            kv_files=self.kv_files.of(row["digest"]),
            layers=placement(info.get("layers")) if isinstance(info, dict) else None,
            rpc_servers=self.rpc.states(self.servers_of(row), row["id"]),
        )

    def servers_of(self, row: dict) -> list[str]:
        """The RPC servers the model's layers are split over: its own, else the service's."""
        split = row.get("rpc_split")
        return list(split["servers"]) if split else self.config.rpc_server_list

    def _split_of(self, row: dict) -> dict[str, Any]:
        """The engine's rpc_servers, tensor_split and rpc_timeout for the model (empty: none)."""
        split = row.get("rpc_split")
        shares = list(split.get("tensor_split") or ()) if split else self.config.tensor_split_list
        servers = self.servers_of(row)
        return (
            {"rpc_servers": servers, "tensor_split": shares, "rpc_timeout": self.config.rpc_timeout} if servers else {}
        )

    # engines
    def engine(self, model_id: str) -> Engine | None:
        with self._lock:
            return self._engines.get(model_id)

    def engines(self) -> list[tuple[str, Engine]]:
        with self._lock:
            return list(self._engines.items())

    def file_changed(self, model_id: str) -> bool:
        """The model is loaded here and its file changed since (:meth:`ModelFiles.file_changed`)."""
        return self.files.file_changed(model_id)

    def changed_files(self) -> list[str]:
        """The models loaded here whose files changed since they were loaded."""
        return self.files.changed_files()

    def mark_changed(self, model_id: str) -> None:
        """Record that the model's file changed (its digest stays the registered one):
        it shows ``changed`` until registered again or loaded from a file with that digest.
        Nothing is recorded when the model was registered again since it was loaded here
        (the new registration describes the new file)."""
        loaded_with = self.files.loaded_digest(model_id)
        try:
            registered = self.store.get_model(model_id).get("digest")
        except NotFound:
            return
        except LMSPError as exc:  # a busy store: the next load checks the digest anyway
            log.warning("could not record that the file of model %s changed: %s", model_id, exc)
            return
        if loaded_with is None or registered == loaded_with:
            self._set_state(model_id, CHANGED)

    def watch_fileno(self) -> int | None:
        """A descriptor readable once a loaded model's file may have changed (None: poll
        :meth:`changed_files`)."""
        return self.files.watch_fileno()

    def drain_watch(self) -> None:
        self.files.drain_watch()

    def load(self, model_id: str) -> Engine:
        """Load a model into this process (digest re-checked first); returns the engine.

        Raises NotFound (unknown id), ModelChanged (file changed or missing),
        or LMSPError subclasses for files the engine refuses.
        """
        with self._lock:
            engine = self._engines.get(model_id)
            if engine is not None:
                return engine
            gate = self._load_locks.setdefault(model_id, allocate_lock())
        with gate:  # one load per model at a time; a second caller gets the first one's engine
            with self._lock:
                engine = self._engines.get(model_id)
                if engine is not None:
                    return engine
                self._loading.add(model_id)
            try:
                return self._load(model_id)
            finally:
                with self._lock:
                    self._loading.discard(model_id)

    def _load(self, model_id: str) -> Engine:
        row = self.store.get_model(model_id)
        path = self.file_path(row)
        identity = FileIdentity.of(path)  # before the hash: a change from now on shows after the load
        if identity is None or not path.is_file():
            self._set_state(model_id, MISSING)
            raise ModelChanged(f"the file of model {model_id} is missing: {_shown(row['path'])}")
        digest, _ = self.digest(path)
        if digest != row["digest"]:
            self._set_state(model_id, CHANGED)
            raise ModelChanged(
                f"the file of model {model_id} changed since it was registered "
                f"({digest} != {row['digest']}); register it again to serve the new file"
            )
        engine = self._new_engine(model_id, row, path)
        if FileIdentity.of(path) != identity:  # written while it was hashed or read
            engine.close()
            self._set_state(model_id, CHANGED)
            raise ModelChanged(
                f"the file of model {model_id} changed while it was loaded; register it again to serve the new file"
            )
        with self._lock:
            self._engines[model_id] = engine
            self.files.track(model_id, path, identity, digest)
            back = self._lost.pop(model_id, None) is not None
        self._set_state(model_id, AVAILABLE)  # "loaded" is per process; the store keeps the file's state
        if back:
            log.warning("model %s is back: its RPC servers answer again", model_id)
        info = getattr(engine, "info", {})
        self.rpc.loaded(model_id, self.servers_of(row), info.get("layers"))
        log.info(
            "loaded model %s (%s, batch invariant: %s)",
            model_id,
            info.get("backend", "?"),
            info.get("batch_invariant", "?"),
        )
        if info.get("reference_kernels"):
            log.warning(
                "model %s has K-quant or i-quant weights: batch invariance decodes on llama.cpp's "
                "one-row kernel, which decodes many requests at once at about two thirds of the speed; "
                "batch_invariant = false (LMSP_BATCH_INVARIANT=0) trades invariance for that speed",
                model_id,
            )
        return engine

    def _new_engine(self, model_id: str, row: dict, path: Path):
        """An engine on the model's file (its state ``failed`` when the engine refuses it)."""
        from .. import native

        cfg = self.config
        split = self._split_of(row)  # only where configured: a test's engine factory may take neither
        try:
            factory = self._factory or native.Engine
            return factory(
                str(path),
                n_ctx=cfg.n_ctx,
                n_parallel=cfg.n_parallel,
                n_threads=cfg.n_threads,
                n_gpu_layers=cfg.n_gpu_layers,
                n_batch=cfg.n_batch,
                batch_invariant=cfg.batch_invariant,
                prefix_cache=cfg.prefix_cache,
                use_mmap=cfg.mmap,
                swa_full=cfg.kv_swa_full,
                **split,
            )
        except native.RpcUnreachableError as exc:  # (before NativeError: it is one)
            self.rpc.unreachable(str(exc), split["rpc_servers"])
            self._set_state(model_id, UNAVAILABLE)
            raise ModelLoadFailed(f"model {model_id} is unavailable: {exc}", unreachable=True) from None
        except MemoryError:
            self._set_state(model_id, FAILED)
            raise ModelLoadFailed(f"not enough memory to load model {model_id}", out_of_memory=True) from None
        except (native.NativeError, OSError, ValueError, RuntimeError) as exc:
            self._set_state(model_id, FAILED)
            shown = _without(exc, path, _shown(row["path"]))
            raise ModelLoadFailed(f"model {model_id} failed to load: {shown}") from None

    def _set_state(self, model_id: str, state: str) -> None:
        try:
            if self.store.get_model(model_id).get("state") != state:
                self.store.set_model_state(model_id, state)
        except NotFound:
            pass
        except LMSPError as exc:  # a busy store must not hide the load result
            log.warning("could not record state %s of model %s: %s", state, model_id, exc)

    def lose(self, model_id: str, engine: Engine, message: str) -> None:
        """The engine lost an RPC server while it ran (``message`` names it): it leaves the
        registry and closes, and the model shows ``unavailable`` until it loads again."""
        with self._lock:
            current = self._engines.get(model_id) is engine
        if current:
            self.detach(model_id)
        with self._lock:
            self._lost[model_id] = message
        try:
            servers = self.servers_of(self.store.get_model(model_id))
        except LMSPError:  # deleted meanwhile, or a busy store
            servers = self.config.rpc_server_list
        self.rpc.unreachable(message, servers)
        self._set_state(model_id, UNAVAILABLE)
        log.error(
            "model %s lost an RPC server while it ran; it loads again once the server answers: %s", model_id, message
        )
        try:
            engine.close()
        except Exception:  # closed already
            log.exception("closing the engine of model %s failed", model_id)

    def lost(self) -> list[str]:
        """The models waiting for a lost RPC server to answer again."""
        with self._lock:
            return list(self._lost)

    def waits_for_server(self, model_id: str) -> bool:
        """The model lost an RPC server and has not loaded since."""
        with self._lock:
            return model_id in self._lost

    def servers_answer(self, model_id: str) -> bool:
        """Whether every RPC server of a model waiting for one greets within a second (one
        an engine here holds is not greeted: it serves one client at a time). A silent one
        is recorded as ``unreachable``; a load would wait 5 s for it."""
        from .. import native

        servers = self.servers_of(self.store.get_model(model_id))
        for server in self.rpc.states(servers):
            if server["state"] == CONNECTED:
                continue
            try:
                native.rpc_hello(server["address"], 1000)
            except native.RpcUnreachableError as exc:
                self.rpc.unreachable(str(exc), servers)
                return False
        return True

    def forget_lost(self, model_id: str) -> None:
        """Stop waiting for the model's servers (it was deleted)."""
        with self._lock:
            self._lost.pop(model_id, None)

    def unload(self, model_id: str) -> bool:
        engine = self.detach(model_id)
        if engine is None:
            return False
        self.close_engine(model_id, engine)
        return True

    def detach(self, model_id: str) -> Engine | None:
        """Take a model's engine out of this process's registry (None when it is not
        loaded): from now on nothing finds it, and the caller closes it."""
        self.rpc.unloaded(model_id)
        with self._lock:
            self.files.forget(model_id)
            return self._engines.pop(model_id, None)

    @staticmethod
    def close_engine(model_id: str, engine: Engine) -> None:
        engine.close()
        log.info("unloaded model %s", model_id)

    def close(self) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
            self.files.clear()
        for engine in engines:
            try:
                engine.close()
            except Exception:  # closing is best effort at shutdown
                log.exception("closing an engine failed")
