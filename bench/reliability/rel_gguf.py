"""Hostile GGUF files: a tiny valid file to start from, named corruptions and a
hypothesis strategy that builds headers with absurd counts, sizes and types.

GGUF layout (little endian): ``"GGUF"``, version u32, tensor count u64, KV
count u64; each KV is a string key (u64 length + bytes), a u32 value type and
the value (arrays: u32 element type, u64 count, elements); each tensor info
is a name, u32 dims, u64 per dim, u32 ggml type, u64 offset; then padding to
``general.alignment`` (32) and the tensor data.

Also a reader child: ``ReaderChild`` runs ``lmsp.native.read_gguf_info`` in a
separate process, one path per line, so that a crash on a hostile file fails
one example loudly instead of killing the process that runs the checks.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from dataclasses import dataclass, field

from hypothesis import strategies as st

__all__ = ["ARCH_KEYS", "CORRUPTIONS", "GGUFSpec", "KV", "ReaderChild", "TensorInfo", "hostile_gguf",
           "valid_spec"]

# value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
           U64: "<Q", I64: "<q", F64: "<d"}
GGML_F32 = 0


def _str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


@dataclass
class KV:
    key: bytes
    vtype: int
    value: object                    # bytes for STRING, (etype, [items]) for ARRAY, number otherwise
    declared_len: int | None = None  # a lie about a string's or array's length

    def encode(self) -> bytes:
        out = _str(self.key) + struct.pack("<I", self.vtype)
        return out + _value(self.vtype, self.value, self.declared_len)


def _value(vtype: int, value, declared_len: int | None = None) -> bytes:
    if vtype == STRING:
        raw = value if isinstance(value, bytes) else str(value).encode()
        n = len(raw) if declared_len is None else declared_len
        return struct.pack("<Q", n) + raw
    if vtype == ARRAY:
        etype, items = value
        n = len(items) if declared_len is None else declared_len
        return struct.pack("<IQ", etype, n) + b"".join(_value(etype, i) for i in items)
    fmt = _SCALAR.get(vtype)
    if fmt is None or isinstance(value, bytes):  # unknown or lying type: raw bytes follow
        return value if isinstance(value, bytes) else b""
    return struct.pack(fmt, value)


@dataclass
class TensorInfo:
    name: bytes
    dims: list[int]
    ggml_type: int = GGML_F32
    offset: int = 0
    n_dims: int | None = None        # a lie about the number of dims

    def encode(self) -> bytes:
        n = len(self.dims) if self.n_dims is None else self.n_dims
        out = _str(self.name) + struct.pack("<I", n)
        out += b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in self.dims)
        return out + struct.pack("<IQ", self.ggml_type, self.offset & (2**64 - 1))


@dataclass
class GGUFSpec:
    magic: bytes = b"GGUF"
    version: int = 3
    kvs: list[KV] = field(default_factory=list)
    tensors: list[TensorInfo] = field(default_factory=list)
    n_tensors: int | None = None     # lies about the counts
    n_kv: int | None = None
    data: bytes = b""
    alignment: int = 32

    def encode(self) -> bytes:
        nt = len(self.tensors) if self.n_tensors is None else self.n_tensors
        nk = len(self.kvs) if self.n_kv is None else self.n_kv
        out = self.magic + struct.pack("<IQQ", self.version & 0xFFFFFFFF, nt & (2**64 - 1), nk & (2**64 - 1))
        out += b"".join(kv.encode() for kv in self.kvs)
        out += b"".join(t.encode() for t in self.tensors)
        pad = (-len(out)) % self.alignment if self.alignment > 0 else 0
        return out + b"\0" * pad + self.data


ARCH_KEYS = [
    KV(b"general.architecture", STRING, b"llama"),
    KV(b"general.name", STRING, b"hostile"),
    KV(b"llama.context_length", U32, 128),
    KV(b"llama.embedding_length", U32, 8),
    KV(b"llama.block_count", U32, 1),
    KV(b"llama.feed_forward_length", U32, 16),
    KV(b"llama.attention.head_count", U32, 2),
]


def valid_spec() -> GGUFSpec:
    """A small well-formed GGUF (header and data; not a loadable model)."""
    tensors = [TensorInfo(b"token_embd.weight", [8, 4], GGML_F32, 0),
               TensorInfo(b"output_norm.weight", [8], GGML_F32, 128)]
    return GGUFSpec(kvs=[KV(k.key, k.vtype, k.value) for k in ARCH_KEYS], tensors=tensors, data=b"\0" * 160)


def _corrupt(**changes):
    def make() -> bytes:
        spec = valid_spec()
        for name, value in changes.items():
            if callable(value):
                value(spec)
            else:
                setattr(spec, name, value)
        return spec.encode()
    return make


def _set(attr_path: str, value):
    def apply(spec: GGUFSpec) -> None:
        target: object = spec
        *parts, last = attr_path.split(".")
        for p in parts:
            target = target[int(p)] if p.isdigit() else getattr(target, p)
        setattr(target, last, value)
    return apply


# Named corruptions: each builds the bytes of one hostile file.
CORRUPTIONS = {
    "empty": lambda: b"",
    "three_bytes": lambda: b"GGU",
    "wrong_magic": _corrupt(magic=b"GGML"),
    "zero_magic": _corrupt(magic=b"\0\0\0\0"),
    "text_file": lambda: b"this is not a model\n" * 10,
    "version_0": _corrupt(version=0),
    "version_huge": _corrupt(version=0xFFFFFFFF),
    "header_only": lambda: valid_spec().encode()[:24],
    "truncated_in_kv": lambda: valid_spec().encode()[:40],
    "truncated_in_tensors": lambda: valid_spec().encode()[:-200],
    "truncated_data": lambda: valid_spec().encode()[:-100],
    "tensor_count_2e63": _corrupt(n_tensors=2**63),
    "tensor_count_max": _corrupt(n_tensors=2**64 - 1),
    "kv_count_2e63": _corrupt(n_kv=2**63),
    "kv_count_max": _corrupt(n_kv=2**64 - 1),
    "kv_count_plus_one": _corrupt(n_kv=len(ARCH_KEYS) + 1),
    "key_len_max": lambda: b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**64 - 1) + b"general",
    "string_len_max": _corrupt(kvs=_set("kvs.1.declared_len", 2**64 - 1)),
    "string_len_2e40": _corrupt(kvs=_set("kvs.1.declared_len", 2**40)),
    "array_count_max": lambda: _with_kv(KV(b"tokenizer.ggml.tokens", ARRAY, (STRING, [b"a"]), 2**64 - 1)),
    "array_count_2e61_u64": lambda: _with_kv(KV(b"tokenizer.ggml.scores", ARRAY, (U64, [1]), 2**61)),
    "nested_arrays": lambda: _with_kv(KV(b"x.nested", ARRAY, (ARRAY, []), 3)),
    # a count the reader takes from a number or from the first entry of an array
    # of numbers, given as an array of strings or of floats
    "block_count_strings": lambda: _with_kv(KV(b"llama.block_count", ARRAY, (STRING, [b"a", b"b"])), True),
    "head_count_floats": lambda: _with_kv(KV(b"llama.attention.head_count", ARRAY, (F32, [2.0])), True),
    "unknown_value_type": lambda: _with_kv(KV(b"x.unknown", 99, b"\x01\x02")),
    "arch_not_string": _corrupt(kvs=_set("kvs.0.vtype", U32)),
    "no_architecture": _corrupt(kvs=lambda s: s.kvs.pop(0)),
    "duplicate_key": _corrupt(kvs=lambda s: s.kvs.append(KV(b"general.name", STRING, b"again"))),
    "n_dims_huge": _corrupt(tensors=_set("tensors.0.n_dims", 2**31)),
    "n_dims_5": _corrupt(tensors=_set("tensors.0.n_dims", 5)),
    "dim_zero_negative": _corrupt(tensors=_set("tensors.0.dims", [2**64 - 1, 4])),
    "dims_overflow": _corrupt(tensors=_set("tensors.0.dims", [2**62, 2**62])),
    "dims_huge": _corrupt(tensors=_set("tensors.0.dims", [2**40, 2**20])),
    "bad_ggml_type": _corrupt(tensors=_set("tensors.0.ggml_type", 9999)),
    "offset_past_end": _corrupt(tensors=_set("tensors.1.offset", 2**40)),
    "offset_overflow": _corrupt(tensors=_set("tensors.1.offset", 2**64 - 32)),
    "offset_unaligned": _corrupt(tensors=_set("tensors.1.offset", 3)),
    "overlapping_tensors": _corrupt(tensors=_set("tensors.1.offset", 0)),
    "duplicate_tensor_name": _corrupt(tensors=_set("tensors.1.name", b"token_embd.weight")),
    "alignment_zero": lambda: _with_kv(KV(b"general.alignment", U32, 0)),
    "alignment_not_pow2": lambda: _with_kv(KV(b"general.alignment", U32, 3)),
    "context_length_absurd": lambda: _with_kv(KV(b"llama.context_length", U64, 2**63), replace=True),
    "architecture_not_utf8": lambda: _with_kv(KV(b"general.architecture", STRING, b"\x80llama"), replace=True),
    "name_not_utf8": lambda: _with_kv(KV(b"general.name", STRING, b"\xffname"), replace=True),
    "chat_template_not_utf8": lambda: _with_kv(KV(b"tokenizer.chat_template", STRING, b"\xc3("), replace=True),
}


def _with_kv(kv: KV, replace: bool = False) -> bytes:
    spec = valid_spec()
    if replace:
        spec.kvs = [k for k in spec.kvs if k.key != kv.key]
    spec.kvs.append(kv)
    return spec.encode()


# ------------------------------------------------------------- hypothesis

_u64 = st.one_of(st.integers(0, 64), st.sampled_from([2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63, 2**64 - 1]),
                 st.integers(0, 2**64 - 1))
_key = st.one_of(st.sampled_from([k.key for k in ARCH_KEYS] + [b"general.alignment", b"tokenizer.ggml.tokens"]),
                 st.binary(max_size=24))


@st.composite
def _kv(draw) -> KV:
    vtype = draw(st.one_of(st.sampled_from([U8, U32, I32, F32, BOOL, STRING, ARRAY, U64, F64]),
                           st.integers(0, 2**32 - 1)))
    key = draw(_key)
    lie = draw(st.one_of(st.none(), _u64))
    if vtype == STRING:
        return KV(key, vtype, draw(st.binary(max_size=32)), lie)
    if vtype == ARRAY:
        etype = draw(st.one_of(st.sampled_from([U8, U32, STRING, ARRAY]), st.integers(0, 2**32 - 1)))
        items = draw(st.lists(st.integers(0, 255), max_size=4)) if etype in (U8, U32) else \
            draw(st.lists(st.binary(max_size=8), max_size=4)) if etype == STRING else []
        return KV(key, vtype, (etype, items), lie)
    if vtype in _SCALAR:
        fmt = _SCALAR[vtype]
        if fmt in ("<f", "<d"):
            return KV(key, vtype, draw(st.floats(allow_nan=True, allow_infinity=True, width=32)))
        if fmt == "<?":
            return KV(key, vtype, draw(st.booleans()))
        size = struct.calcsize(fmt) * 8
        lo, hi = (-(2 ** (size - 1)), 2 ** (size - 1) - 1) if fmt.islower() else (0, 2 ** size - 1)
        return KV(key, vtype, draw(st.integers(lo, hi)))
    return KV(key, vtype, draw(st.binary(max_size=16)))


@st.composite
def _tensor(draw) -> TensorInfo:
    dims = draw(st.lists(_u64, min_size=0, max_size=5))
    return TensorInfo(draw(st.binary(max_size=24)), dims,
                      draw(st.one_of(st.integers(0, 40), st.integers(0, 2**32 - 1))), draw(_u64),
                      draw(st.one_of(st.none(), st.integers(0, 2**32 - 1))))


@st.composite
def hostile_gguf(draw) -> bytes:
    """Bytes of a GGUF-like file: a mutated valid file, a structured header with
    absurd fields, or a valid header cut short."""
    mode = draw(st.sampled_from(["structured", "truncate", "flip"]))
    if mode == "truncate":
        raw = valid_spec().encode()
        return raw[:draw(st.integers(0, len(raw) - 1))]
    if mode == "flip":
        raw = bytearray(valid_spec().encode())
        for _ in range(draw(st.integers(1, 8))):
            pos = draw(st.integers(0, len(raw) - 1))
            raw[pos] = draw(st.integers(0, 255))
        return bytes(raw)
    base = valid_spec()
    kvs = draw(st.lists(_kv(), max_size=6))
    if draw(st.booleans()):
        kvs = base.kvs + kvs
    tensors = draw(st.lists(_tensor(), max_size=4))
    spec = GGUFSpec(
        magic=draw(st.sampled_from([b"GGUF", b"GGUF", b"GGUF", b"FUGG", b"GGML"])),
        version=draw(st.sampled_from([3, 3, 3, 2, 1, 0, 4, 2**32 - 1])),
        kvs=kvs, tensors=tensors,
        n_tensors=draw(st.one_of(st.none(), _u64)), n_kv=draw(st.one_of(st.none(), _u64)),
        data=draw(st.binary(max_size=64)))
    return spec.encode()


# ------------------------------------------------------------- reader child

_CHILD = r"""
import json, sys
from lmsp import native
for line in sys.stdin:
    path = line.rstrip("\n")
    try:
        info = native.read_gguf_info(path)
        out = {"ok": True, "info": repr(info)[:200]}
    except Exception as exc:
        out = {"ok": False, "type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}
    print(json.dumps(out), flush=True)
"""


class ReaderChild:
    """``lmsp.native.read_gguf_info`` in a child process; a crash there is reported, not suffered."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    def _ensure(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.restarts += 1
            self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self.proc

    def read(self, path: str) -> dict:
        """``{"ok": True, "info"}``, ``{"ok": False, "type", "message"}``, or
        ``{"crashed": returncode, "stderr"}`` when the reader died on this file."""
        proc = self._ensure()
        try:
            proc.stdin.write(path + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            proc.wait(30)
            err = proc.stderr.read()[-2000:]
            self.proc = None
            return {"crashed": proc.returncode, "stderr": err}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            for stream in (self.proc.stdout, self.proc.stderr):
                stream.close()
        self.proc = None
