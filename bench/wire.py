"""The checks of typical request bodies: CPU microseconds per body, in-process.

What a request costs the service before it makes a task: its body read as its
wire type (`lmsp.wire`), every field checked and the task's request filled in.
Three bodies: a Responses request (8 messages, instructions, a function tool),
a Chat Completions request (a system and 8 messages, a stream with usage,
metadata) and an Embeddings request (16 texts).

`--against PATH` also times the `python/` folder of another checkout (a
worktree of an earlier commit, say); each run is a process of its own, the
trees take turns, and the ratios are this tree's time over that one's: of
the best process (the code's cost) and of the median one.

    .venv/bin/python bench/wire.py
    git worktree add /tmp/before <commit> && .venv/bin/python bench/wire.py --against /tmp/before/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

from results_path import ROOT, git_state, machine, result_path, utc

MESSAGES = [{"role": "system", "content": "You are terse."}] + [
    {"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 40} for i in range(8)
]
CHAT = {"model": "tiny", "messages": MESSAGES, "max_tokens": 64, "temperature": 0.7, "stream": True,
        "stream_options": {"include_usage": True}, "metadata": {"k": "v"}}
RESPONSES = {"model": "tiny", "input": MESSAGES[1:], "instructions": "You are terse.", "max_output_tokens": 64,
             "temperature": 0.7, "stream": True,
             "tools": [{"type": "function", "name": "get_weather",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                       "required": ["city"]}}]}
EMBEDDINGS = {"model": "tiny", "input": ["a sentence to embed"] * 16}


def measure(number: int, repeat: int) -> dict[str, float]:
    """Microseconds per body, the best of ``repeat`` runs of ``number`` checks each."""
    import lmsp
    from lmsp.config import Config
    from lmsp.wire.chat import parse_chat
    from lmsp.wire.embeddings import parse_embeddings
    from lmsp.wire.responses import parse_create

    config = Config().validated()
    cases = {
        "responses": lambda: parse_create(RESPONSES, config, lambda: 7),
        "chat": lambda: parse_chat(CHAT, config, lambda: 7),
        "embeddings": lambda: parse_embeddings(EMBEDDINGS),
    }
    times = {name: min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6 for name, fn in cases.items()}
    return {"source": str(Path(lmsp.__file__).parent.parent), **times}


def run_tree(source: Path, number: int, repeat: int) -> dict[str, float]:
    """:func:`measure` in a process that imports ``lmsp`` from ``source`` (the editable
    install's redirection skipped: it names its build folders in SKBUILD_EDITABLE_SKIP)."""
    builds = os.pathsep.join(str(p) for p in (ROOT / "build").glob("cp*"))
    env = {**os.environ, "PYTHONPATH": str(source), "SKBUILD_EDITABLE_SKIP": builds}
    argv = [sys.executable, __file__, "--one", "--number", str(number), "--repeat", str(repeat)]
    out = json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout)
    if Path(out.pop("source")).resolve() != source.resolve():
        raise SystemExit(f"lmsp was not imported from {source}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", type=Path, default=None, help="the python/ folder of another checkout")
    p.add_argument("--rounds", type=int, default=5, help="runs of each tree, taking turns")
    p.add_argument("--number", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.number, args.repeat)))
        return 0
    started = time.time()
    trees = {"this": ROOT / "python", **({"against": args.against} if args.against else {})}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, source in trees.items():
            rounds[name].append(run_tree(source, args.number, args.repeat))
    # a process runs in one of two speeds on some machines, whatever its code: the best
    # process is the code's cost, the median what a process may see
    record = {"kind": "wire", "started": utc(started), "machine": machine(), "git": git_state(),
              "command": " ".join(["bench/wire.py", *sys.argv[1:]]), "against": str(args.against or ""),
              "against_git": git_state(args.against.parent) if args.against else None,
              "rounds": rounds}
    for stat, fn in (("best", min), ("median", statistics.median)):
        values = {name: {case: fn(r[case] for r in runs) for case in runs[0]} for name, runs in rounds.items()}
        record[f"{stat}_us"] = values
        for name, cases in values.items():
            print(f"{stat:6} {name:8}", " ".join(f"{case} {us:.1f} us" for case, us in cases.items()))
        if args.against:
            ratio = {case: values["this"][case] / values["against"][case] for case in values["this"]}
            record[f"{stat}_ratio"] = ratio
            print(f"{stat:6} this/against", " ".join(f"{case} {r:.2f}" for case, r in ratio.items()))
    path = result_path("wire", None, started, args.results_dir)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
