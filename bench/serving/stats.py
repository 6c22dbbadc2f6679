"""The figures of a level: percentiles, one level's summary, the median round, the
spread over rounds and the ratios to llama-server."""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
from dataclasses import dataclass

from .load import RequestResult


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class LevelResult:
    model: str
    server: str
    clients: int
    requests: int
    failed: int
    output_tokens: int
    wall_s: float
    tok_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    peak_rss_mb: float | None
    short_outputs: int          # successful requests that stopped before max tokens
    mean_input_tokens: float
    tokens_per_event: float     # output tokens per text event: >1 when a server bunches tokens
    load_avg: float             # 1-minute load average of the machine at the end of the level
    errors: list[str]
    round: int = 0
    peak_pss_mb: float | None = None   # sampled sum of the tree's proportional set sizes
    cpu_ms_per_token: float | None = None  # CPU time of the server's processes / output tokens
    # the gaps between text events: a server that sends tokens in bunches has fewer,
    # longer ones, which the per-token ITL (each gap spread over its tokens) hides
    event_gap_p50_ms: float | None = None
    event_gap_p99_ms: float | None = None


def summarize(model: str, server: str, clients: int, results: list[RequestResult],
              max_tokens: int, peak_rss: int | None) -> LevelResult:
    ok = [r for r in results if r.ok]
    out = sum(r.output_tokens for r in ok)
    wall = (max(r.t_end for r in results) - min(r.t_start for r in results)) if results else 0.0
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    gaps = [g for r in ok for g in r.gaps]
    event_gaps = [g for r in ok for g in r.event_gaps]
    ms = lambda v: None if v is None else round(v * 1000.0, 2)  # noqa: E731
    errors = sorted({r.error or "?" for r in results if not r.ok})
    return LevelResult(
        model=model, server=server, clients=clients, requests=len(results),
        failed=len(results) - len(ok), output_tokens=out, wall_s=round(wall, 3),
        tok_s=round(out / wall, 2) if wall > 0 else 0.0,
        ttft_p50_ms=ms(percentile(ttfts, 50)), ttft_p99_ms=ms(percentile(ttfts, 99)),
        itl_p50_ms=ms(percentile(gaps, 50)), itl_p99_ms=ms(percentile(gaps, 99)),
        event_gap_p50_ms=ms(percentile(event_gaps, 50)), event_gap_p99_ms=ms(percentile(event_gaps, 99)),
        peak_rss_mb=None if peak_rss is None else round(peak_rss / 1048576.0, 1),
        short_outputs=sum(1 for r in ok if r.output_tokens < max_tokens),
        mean_input_tokens=round(sum(r.input_tokens for r in ok) / len(ok), 1) if ok else 0.0,
        tokens_per_event=round(out / max(1, sum(r.text_events for r in ok)), 2),
        load_avg=round(os.getloadavg()[0], 2),
        errors=errors[:5],
    )


def median_rounds(levels: list[LevelResult]) -> list[LevelResult]:
    """Per (model, server, clients), the round whose tok/s is the median (the lower one of two)."""
    groups: dict[tuple, list[LevelResult]] = {}
    for lvl in levels:
        groups.setdefault((lvl.model, lvl.server, lvl.clients), []).append(lvl)
    out = []
    for group in groups.values():
        ranked = sorted(group, key=lambda x: x.tok_s)
        # failures lower tok/s, so the median round tends to be one without: the row
        # counts the requests and failures of every round, and its errors
        pick = ranked[(len(ranked) - 1) // 2]
        out.append(dataclasses.replace(pick, requests=sum(x.requests for x in group),
                                       failed=sum(x.failed for x in group),
                                       errors=sorted({e for x in group for e in x.errors})))
    return out


def round_stats(levels: list[LevelResult]) -> list[dict]:
    """Per (model, server, clients): tok/s over the rounds (mean, standard deviation,
    least, most). On a small shared machine the rounds of one level spread by more
    than a 5% goal, and the mean uses every round where the median picks one."""
    groups: dict[tuple, list[float]] = {}
    for lvl in levels:
        if lvl.tok_s is not None:
            groups.setdefault((lvl.model, lvl.server, lvl.clients), []).append(lvl.tok_s)
    out = []
    for (model, server, clients), values in groups.items():
        mean = statistics.fmean(values)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append({"model": model, "server": server, "clients": clients, "rounds": len(values),
                    "tok_s_mean": mean, "tok_s_std": std, "tok_s_min": min(values), "tok_s_max": max(values)})
    return out


def ratio(a, b) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def ratio_rows(levels: list[LevelResult]) -> list[dict]:
    base = {(r.model, r.clients): r for r in levels if r.server == "llama"}
    rows = []
    for r in levels:
        if r.server == "llama" or (r.model, r.clients) not in base:
            continue
        b = base[(r.model, r.clients)]
        rss_delta = None if r.peak_rss_mb is None or b.peak_rss_mb is None else r.peak_rss_mb - b.peak_rss_mb
        pss_delta = None if r.peak_pss_mb is None or b.peak_pss_mb is None else r.peak_pss_mb - b.peak_pss_mb
        rows.append({
            "model": r.model, "server": r.server, "clients": r.clients,
            "tok_s": ratio(r.tok_s, b.tok_s), "ttft_p50": ratio(r.ttft_p50_ms, b.ttft_p50_ms),
            "ttft_p99": ratio(r.ttft_p99_ms, b.ttft_p99_ms), "itl_p50": ratio(r.itl_p50_ms, b.itl_p50_ms),
            "itl_p99": ratio(r.itl_p99_ms, b.itl_p99_ms),
            "event_gap_p50": ratio(r.event_gap_p50_ms, b.event_gap_p50_ms),
            "event_gap_p99": ratio(r.event_gap_p99_ms, b.event_gap_p99_ms),
            "rss_delta_mb": rss_delta, "pss_delta_mb": pss_delta,
            "cpu_per_token": ratio(r.cpu_ms_per_token, b.cpu_ms_per_token),
            "failed": r.failed, "failed_llama": b.failed,
        })
    return rows


PAIRED_FIELDS = {"tok_s": "tok_s", "ttft_p50": "ttft_p50_ms", "cpu_per_token": "cpu_ms_per_token"}


def paired_ratios(levels: list) -> dict[tuple, dict]:
    """Per (model, server, clients), each figure of PAIRED_FIELDS as the median over the
    rounds of the server's round over llama-server's round of the same number: the two
    ran back to back, so a change in the machine's load between rounds cancels out.
    ``levels`` are every round's LevelResult."""
    llama = {(x.model, x.clients, x.round): x for x in levels if x.server == "llama"}
    ratios: dict[tuple, dict[str, list[float]]] = {}
    for x in levels:
        base = llama.get((x.model, x.clients, x.round))
        if x.server == "llama" or base is None:
            continue
        got = ratios.setdefault((x.model, x.server, x.clients), {k: [] for k in PAIRED_FIELDS})
        for key, attr in PAIRED_FIELDS.items():
            a, b = getattr(x, attr), getattr(base, attr)
            if a is not None and b:
                got[key].append(a / b)
    return {k: {"rounds": max(len(v) for v in d.values()),
                **{f: (statistics.median(v) if v else None) for f, v in d.items()}}
            for k, d in ratios.items()}
