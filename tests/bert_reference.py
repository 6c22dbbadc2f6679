"""An independent reference for a sentence-transformers BERT model, in numpy.

It shares no code with the service or its converter: it reads the
checkpoint's own files (``tokenizer.json``, ``config.json``,
``model.safetensors``) and computes what sentence-transformers computes with
the model: BERT's WordPiece tokenization (the normalizer, the pre-tokenizer and
the greedy longest-match of the reference tokenizers library), the encoder in
float32 with the exact (erf) GELU, the pooling of ``1_Pooling/config.json``
(mean or CLS) and L2 normalisation. No truncation: a text is taken whole.

    python tests/bert_reference.py CHECKPOINT_DIR TEXTS.json OUT.npz

writes the token ids and vectors of the texts (a JSON list of strings); the
tests run it so, in a process whose BLAS uses one thread (on a busy machine
its threads spin each other out).
"""

from __future__ import annotations

import json
import math
import struct
import unicodedata
from pathlib import Path

import numpy as np


def _cjk(cp: int) -> bool:
    return any(
        lo <= cp <= hi
        for lo, hi in (
            (0x4E00, 0x9FFF),
            (0x3400, 0x4DBF),
            (0x20000, 0x2A6DF),
            (0x2A700, 0x2B73F),
            (0x2B740, 0x2B81F),
            (0x2B920, 0x2CEAF),
            (0xF900, 0xFAFF),
            (0x2F800, 0x2FA1F),
        )
    )


def _whitespace(ch: str) -> bool:
    """White_Space, less the control characters among it (cleaning removes those first)."""
    return ch in " \t\n\r\u2028\u2029" or unicodedata.category(ch) == "Zs"


def _control(ch: str) -> bool:
    """What cleaning removes: the categories Cc, Cf, Cn and Co, but for tab, newline and return."""
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf", "Cn", "Co")


def _punctuation(ch: str) -> bool:
    cp = ord(ch)
    ascii_punct = 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
    return ascii_punct or unicodedata.category(ch).startswith("P")


class WordPiece:
    """BERT's tokenizer as tokenizer.json describes it (BertNormalizer, BertPreTokenizer,
    WordPiece, [CLS] text [SEP])."""

    def __init__(self, tokenizer_json: Path) -> None:
        spec = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
        model, norm = spec["model"], spec["normalizer"]
        self.vocab: dict[str, int] = model["vocab"]
        self.unk = self.vocab[model["unk_token"]]
        self.prefix = model["continuing_subword_prefix"]
        self.max_chars = model["max_input_chars_per_word"]
        self.lowercase = norm["lowercase"]
        self.strip_accents = self.lowercase if norm["strip_accents"] is None else norm["strip_accents"]
        self.chinese = norm["handle_chinese_chars"]
        self.clean = norm["clean_text"]
        self.added = sorted((t["content"] for t in spec["added_tokens"]), key=len, reverse=True)
        single = spec["post_processor"]["single"]
        self.cls = self.vocab[single[0]["SpecialToken"]["id"]]
        self.sep = self.vocab[single[2]["SpecialToken"]["id"]]

    def encode(self, text: str) -> list[int]:
        ids = [self.cls]
        for piece, special in self._split_added(text):
            if special:
                ids.append(self.vocab[piece])
            else:
                for word in self._words(self._normalize(piece)):
                    ids += self._wordpiece(word)
        return ids + [self.sep]

    def _split_added(self, text: str) -> list[tuple[str, bool]]:
        """The text cut around the added tokens it holds (matched as written, before normalising)."""
        out: list[tuple[str, bool]] = []
        start = i = 0
        while i < len(text):
            hit = next((t for t in self.added if text.startswith(t, i)), None)
            if hit is None:
                i += 1
                continue
            if i > start:
                out.append((text[start:i], False))
            out.append((hit, True))
            i = start = i + len(hit)
        if start < len(text):
            out.append((text[start:], False))
        return out

    def _normalize(self, text: str) -> str:
        chars = []
        for ch in text:
            if self.clean:
                if ord(ch) in (0, 0xFFFD) or _control(ch):
                    continue
                ch = " " if _whitespace(ch) else ch
            chars.append(f" {ch} " if self.chinese and _cjk(ord(ch)) else ch)
        text = "".join(chars)
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
        return "".join(c.lower() for c in text) if self.lowercase else text  # one character at a time

    @staticmethod
    def _words(text: str) -> list[str]:
        words, current = [], ""
        for ch in text:
            if _whitespace(ch) or _punctuation(ch):
                if current:
                    words.append(current)
                current = ""
                if not _whitespace(ch):
                    words.append(ch)
            else:
                current += ch
        return words + ([current] if current else [])

    def _wordpiece(self, word: str) -> list[int]:
        if len(word) > self.max_chars:
            return [self.unk]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    out.append(self.vocab[piece])
                    break
                end -= 1
            if end == start:
                return [self.unk]
            start = end
        return out


def _safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    kinds = {"F32": "<f4", "F16": "<f2"}
    out = {}
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] not in kinds:
            continue
        begin, end = entry["data_offsets"]
        data = np.frombuffer(raw[8 + n + begin : 8 + n + end], dtype=kinds[entry["dtype"]])
        out[name.removeprefix("bert.")] = data.reshape(entry["shape"]).astype(np.float32)
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    """math.erf of each element, in float32 (numpy has no erf)."""
    return np.fromiter(map(math.erf, x.ravel().tolist()), dtype=np.float32, count=x.size).reshape(x.shape)


class SentenceEncoder:
    """A sentence-transformers BERT model's forward pass: BERT, pooling, L2 normalisation."""

    def __init__(self, folder: Path) -> None:
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        self.tokenizer = WordPiece(folder / "tokenizer.json")
        self.w = _safetensors(folder / "model.safetensors")
        self.n_layer = config["num_hidden_layers"]
        self.n_head = config["num_attention_heads"]
        self.eps = config["layer_norm_eps"]
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        self.cls_pooling = bool(pooling.get("pooling_mode_cls_token"))

    def _norm(self, x: np.ndarray, prefix: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def _linear(self, x: np.ndarray, prefix: str) -> np.ndarray:
        return x @ self.w[prefix + ".weight"].T + self.w[prefix + ".bias"]

    def _layer(self, x: np.ndarray, i: int) -> np.ndarray:
        p = f"encoder.layer.{i}."
        n, e = x.shape
        d = e // self.n_head
        q, k, v = (
            self._linear(x, p + "attention.self." + t).reshape(n, self.n_head, d) for t in ("query", "key", "value")
        )
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        context = np.einsum("hqk,khd->qhd", scores, v).reshape(n, e)
        x = self._norm(x + self._linear(context, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        h = self._linear(x, p + "intermediate.dense")
        h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))
        return self._norm(x + self._linear(h, p + "output.dense"), p + "output.LayerNorm")

    def embed_ids(self, ids: list[int]) -> np.ndarray:
        w = self.w
        x = w["embeddings.word_embeddings.weight"][ids]
        x = x + w["embeddings.position_embeddings.weight"][: len(ids)] + w["embeddings.token_type_embeddings.weight"][0]
        x = self._norm(x, "embeddings.LayerNorm")
        for i in range(self.n_layer):
            x = self._layer(x, i)
        pooled = x[0] if self.cls_pooling else x.mean(0)
        return pooled / np.linalg.norm(pooled)

    def embed(self, text: str) -> np.ndarray:
        return self.embed_ids(self.tokenizer.encode(text))


def main(argv: list[str]) -> int:
    folder, texts_file, out = argv
    encoder = SentenceEncoder(Path(folder))
    texts = json.loads(Path(texts_file).read_text(encoding="utf-8"))
    ids = [encoder.tokenizer.encode(text) for text in texts]
    vectors = np.stack([encoder.embed_ids(t) for t in ids]) if ids else np.zeros((0, 0), np.float32)
    lengths = np.array([len(t) for t in ids], dtype=np.int64)
    flat = np.array([i for t in ids for i in t], dtype=np.int64)
    np.savez(out, vectors=vectors, lengths=lengths, ids=flat)
    return 0


def reference(folder: Path, texts: list[str], scratch: Path,
              cache: Path | None = None) -> tuple[list[list[int]], np.ndarray]:
    """The reference's token ids and vectors of ``texts``, computed in a child process with one BLAS thread.

    With ``cache`` (a folder), the result is kept there under a digest of
    everything it depends on (this file, numpy's version, the checkpoint's
    files, the texts) and read back instead of computed again."""
    import hashlib
    import os
    import subprocess
    import sys

    out = scratch / "reference.npz"
    kept = None
    if cache is not None:
        digest = hashlib.sha256(Path(__file__).read_bytes() + np.__version__.encode())
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
        digest.update(json.dumps(texts).encode())
        kept = cache / f"{digest.hexdigest()}.npz"
    if kept is not None and kept.exists():
        out = kept
    else:
        texts_file = scratch / "texts.json"
        texts_file.write_text(json.dumps(texts), encoding="utf-8")
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        subprocess.run([sys.executable, __file__, str(folder), str(texts_file), str(out)], check=True, env=env)
        if kept is not None:
            partial = kept.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(out.read_bytes())
            partial.replace(kept)  # whole or not at all, whichever process writes it
    with np.load(out) as data:
        bounds = np.cumsum(data["lengths"])[:-1]
        ids = [part.tolist() for part in np.split(data["ids"], bounds)]
        return ids, data["vectors"]


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
