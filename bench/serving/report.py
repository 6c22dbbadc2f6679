"""What a serving run prints and keeps: the tables, the goal checks and one model's record."""
from __future__ import annotations

import shlex
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

from .stats import LevelResult, median_rounds, paired_ratios, ratio_rows, round_stats

if TYPE_CHECKING:
    from .load import LoadConfig
    from .servers import ServeSettings

GOALS_TEXT = """Goals (ratio lmsp / llama-server in the same run; with several rounds, tok/s, TTFT and
CPU per token are the median of each round's ratio to llama-server's round, RSS the median round's):
  tok/s >= 1.0 at every level, and no failed request; TTFT p50 <= 1.05 at 1 and 4 clients;
  CPU time per output token <= 1.0; peak PSS <= llama-server's + 40 MB;
  persistence on costs <= 5% tok/s against lmsp-memevents (and, an upper bound, lmsp-noevents)."""


def fmt(v, nd=1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def markdown_table(levels: list[LevelResult]) -> str:
    head = ("| model | server | clients | reqs | failed | short | in tok | tok/s | TTFT p50 ms | TTFT p99 ms "
            "| ITL p50 ms | ITL p99 ms | event gap p50 ms | event gap p99 ms | tok/event | CPU ms/tok "
            "| peak RSS MB | peak PSS MB | load |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in levels:
        lines.append(f"| {r.model} | {r.server} | {r.clients} | {r.requests} | {r.failed} | {r.short_outputs} "
                     f"| {fmt(r.mean_input_tokens)} | {fmt(r.tok_s)} | {fmt(r.ttft_p50_ms)} | {fmt(r.ttft_p99_ms)} "
                     f"| {fmt(r.itl_p50_ms, 2)} | {fmt(r.itl_p99_ms, 2)} | {fmt(r.event_gap_p50_ms, 2)} "
                     f"| {fmt(r.event_gap_p99_ms, 2)} | {fmt(r.tokens_per_event, 2)} "
                     f"| {fmt(r.cpu_ms_per_token, 3)} | {fmt(r.peak_rss_mb)} | {fmt(r.peak_pss_mb)} "
                     f"| {fmt(r.load_avg, 2)} |")
    return "\n".join(lines)




def ratio_table(rows: list[dict]) -> str:
    lines = ["| model | server | clients | tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | event gap p50 "
             "| event gap p99 | CPU/tok | RSS - llama MB | PSS - llama MB | failed (llama) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in rows:
        lines.append(f"| {x['model']} | {x['server']} | {x['clients']} | {fmt(x['tok_s'], 2)} "
                     f"| {fmt(x['ttft_p50'], 2)} | {fmt(x['ttft_p99'], 2)} | {fmt(x['itl_p50'], 2)} "
                     f"| {fmt(x['itl_p99'], 2)} | {fmt(x.get('event_gap_p50'), 2)} "
                     f"| {fmt(x.get('event_gap_p99'), 2)} | {fmt(x.get('cpu_per_token'), 2)} "
                     f"| {fmt(x['rss_delta_mb'])} | {fmt(x.get('pss_delta_mb'))} "
                     f"| {x['failed']} ({x['failed_llama']}) |")
    return "\n".join(lines)


def goal_checks(levels: list[LevelResult], rounds: list[LevelResult] | None = None) -> list[str]:
    """The goals on the median rounds ``levels``; given every round, on the paired ratios."""
    out = []
    rows = [x for x in ratio_rows(levels) if x["server"] == "lmsp"]
    paired = paired_ratios(rounds) if rounds else {}
    for x in rows:
        x = {**x, **{k: v for k, v in paired.get((x["model"], x["server"], x["clients"]), {}).items()
                     if k != "rounds"}}
        tag = f"{x['model']} {x['clients']}c"
        out.append(_check(f"{tag} tok/s ratio >= 1.0", x["tok_s"], lambda v: v >= 1.0))
        if x["clients"] <= 4:
            out.append(_check(f"{tag} TTFT p50 ratio <= 1.05", x["ttft_p50"], lambda v: v <= 1.05))
        out.append(_check(f"{tag} CPU per token ratio <= 1.0", x["cpu_per_token"], lambda v: v <= 1.0))
        out.append(_check(f"{tag} PSS - llama <= 40 MB", x.get("pss_delta_mb"), lambda v: v <= 40))
        out.append(_check(f"{tag} failed == 0", x["failed"], lambda v: v == 0))
    on = {(r.model, r.clients): r for r in levels if r.server == "lmsp"}
    for r in levels:
        if r.server in ("lmsp-memevents", "lmsp-noevents") and (r.model, r.clients) in on:
            cost = None if not r.tok_s else 1.0 - on[(r.model, r.clients)].tok_s / r.tok_s
            against = "streamed from memory" if r.server == "lmsp-memevents" else "no streaming, upper bound"
            out.append(_check(f"{r.model} {r.clients}c persistence cost <= 5% ({against})", cost,
                              lambda v: v <= 0.05))
    return out


def _check(label: str, value, ok) -> str:
    if value is None:
        return f"  n/a   {label}"
    shown = f"{value:.3f}" if isinstance(value, float) else str(value)
    return f"  {'PASS' if ok(value) else 'MISS'}  {label}: {shown}"




def round_stats_table(stats: list[dict]) -> str:
    lines = ["| model | server | clients | rounds | tok/s mean | std | least | most |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in stats:
        lines.append(f"| {x['model']} | {x['server']} | {x['clients']} | {x['rounds']} | {x['tok_s_mean']:.1f} "
                     f"| {x['tok_s_std']:.1f} | {x['tok_s_min']:.1f} | {x['tok_s_max']:.1f} |")
    return "\n".join(lines)


def persistence_on_means(stats: list[dict]) -> list[str]:
    """The persistence goal read on the means of the rounds."""
    on = {(x["model"], x["clients"]): x for x in stats if x["server"] == "lmsp"}
    out = []
    for x in stats:
        if x["server"] in ("lmsp-memevents", "lmsp-noevents") and (x["model"], x["clients"]) in on:
            cost = 1.0 - on[(x["model"], x["clients"])]["tok_s_mean"] / x["tok_s_mean"] if x["tok_s_mean"] else None
            out.append(_check(f"{x['model']} {x['clients']}c persistence cost <= 5% against {x['server']}, "
                              f"means of {x['rounds']} rounds", cost, lambda v: v <= 0.05))
    return out


def model_record(levels: list[LevelResult], args, commands: dict, s: "ServeSettings", cfg: LoadConfig) -> dict:
    """One model's figures for bench/results: medians, ratios, goal checks, every round."""
    summary = median_rounds(levels)
    model = levels[0].model
    return {
        "model": model, "command": shlex.join([sys.executable, *sys.argv]), "rounds": args.rounds,
        "settings": asdict(s), "load": asdict(cfg), "llama_endpoint": args.llama_endpoint, "api": args.api,
        "server_commands": {k: v for k, v in commands.items() if k.endswith(f" {model}")},
        "prompt_tokens": {r.server: r.mean_input_tokens for r in summary
                          if r.clients == min(x.clients for x in summary)},
        "levels": [asdict(x) for x in summary], "ratios": ratio_rows(summary),
        "paired_ratios": [{"model": k[0], "server": k[1], "clients": k[2], **v}
                          for k, v in sorted(paired_ratios(levels).items())],
        "goals": [line.strip() for line in goal_checks(summary, levels if args.rounds > 1 else None)],
        "over_rounds": round_stats(levels), "all_rounds": [asdict(x) for x in levels],
    }


def paired_table(paired: dict[tuple, dict]) -> str:
    lines = ["| model | server | clients | rounds | tok/s | TTFT p50 | CPU/tok |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    show = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for (model, server, clients), x in sorted(paired.items()):
        lines.append(f"| {model} | {server} | {clients} | {x['rounds']} | {show(x['tok_s'])} "
                     f"| {show(x['ttft_p50'])} | {show(x['cpu_per_token'])} |")
    return "\n".join(lines)


def print_summary(levels: list[LevelResult], rounds: int, missed: list[str]) -> None:
    """The run's tables and goal checks, on stdout."""
    summary = median_rounds(levels)
    print()
    if rounds > 1:
        print(f"each row: the median of {rounds} rounds by tok/s")
    print(markdown_table(summary))
    rows = ratio_rows(summary)
    if rows:
        print()
        print(ratio_table(rows))
        print()
        if rounds > 1:
            print("\nratios paired by round (the median of each round's ratio to llama-server's):")
            print(paired_table(paired_ratios(levels)))
        print()
        print(GOALS_TEXT)
        print("\n".join(goal_checks(summary, levels if rounds > 1 else None)))
    if rounds > 1:
        stats = round_stats(levels)
        print(f"\ntok/s over the {rounds} rounds:")
        print(round_stats_table(stats))
        checks = persistence_on_means(stats)
        if checks:
            print("\n".join(checks))
    for what in missed:
        print(f"  MISS  not measured, the server was not running: {what}")
