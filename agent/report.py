"""`report`: best time so far against evaluations spent, per trace and kernel, as a picture.

PNG through matplotlib when it is installed; otherwise (or for .html / .svg) a self-contained
HTML page with an inline SVG chart and a table of the best rows.
"""

from __future__ import annotations

import html
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from agent.evaluator import BadInput
from agent.trace import Trace

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
W, H, PAD = 760, 380, 60


@dataclass
class Curve:
    label: str
    method: str
    points: list[tuple[int, float]]     # (evaluations spent, best median so far in µs)
    best_row: str | None


def curves(traces: list[Trace]) -> list[Curve]:
    """One curve per (trace, kernel): the best ok time after each evaluation of that kernel."""
    out = []
    for t in traces:
        kernels = dict.fromkeys(r.kernel for r in t.evaluations)
        for k in kernels:
            best, best_row, pts, method = None, None, [], ""
            for i, r in enumerate(x for x in t.evaluations if x.kernel == k):
                if r.verdict == "ok" and r.timing and (best is None or r.timing.median_us < best):
                    best, best_row, method = r.timing.median_us, r.row, r.timing.method
                if best is not None:
                    pts.append((i + 1, best))
            if pts:
                out.append(Curve(f"{t.path.stem} · {k} ({t.header.policy})", method, pts, best_row))
    return out


def write(traces: list[Trace], out: Path) -> Path:
    cs = curves(traces)
    if out.suffix == ".png":
        if importlib.util.find_spec("matplotlib") is None:
            raise BadInput("a PNG needs matplotlib, which is not installed; write .html or .svg "
                           "instead (-o report.html)")
        _png(cs, out)
    elif out.suffix == ".svg":
        out.write_text(svg(cs))
    elif out.suffix in (".html", ".htm"):
        out.write_text(page(cs, traces))
    else:
        raise BadInput(f"-o {out}: write .html, .svg or .png")
    return out


def _png(cs: list[Curve], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for c in cs:
        xs, ys = zip(*c.points)
        ax.step(xs, ys, where="post", label=f"{c.label} [{c.method}]")
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best time so far (µs)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def svg(cs: list[Curve]) -> str:
    """A step chart of the curves, self-contained."""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 20 * len(cs)}" '
             f'font-family="sans-serif" font-size="11">',
             '<rect width="100%" height="100%" fill="white"/>']
    if not cs:
        parts.append(f'<text x="{PAD}" y="{H // 2}">no timed evaluation in these traces</text></svg>')
        return "\n".join(parts)
    xmax = max(x for c in cs for x, _ in c.points)
    ys = [y for c in cs for _, y in c.points]
    ylo, yhi = min(ys), max(ys)
    if yhi - ylo < 1e-12:
        ylo, yhi = ylo * 0.9, yhi * 1.1 + 1e-9
    sx = lambda x: PAD + (W - 2 * PAD) * (x - 1) / max(1, xmax - 1)
    sy = lambda y: H - PAD + (2 * PAD - H) * (y - ylo) / (yhi - ylo)
    parts.append(f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>')
    parts.append(f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>')
    for i in range(5):
        y = ylo + (yhi - ylo) * i / 4
        parts.append(f'<text x="{PAD - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.3g}</text>')
    for x in sorted({1, xmax, (1 + xmax) // 2}):
        parts.append(f'<text x="{sx(x):.1f}" y="{H - PAD + 16}" text-anchor="middle">{x}</text>')
    parts.append(f'<text x="{W // 2}" y="{H - PAD + 34}" text-anchor="middle">evaluations</text>')
    parts.append(f'<text x="14" y="{H // 2}" transform="rotate(-90 14 {H // 2})" '
                 f'text-anchor="middle">best time so far (µs)</text>')
    for n, c in enumerate(cs):
        colour = PALETTE[n % len(PALETTE)]
        d, prev = [], None
        for x, y in c.points:
            if prev is not None:
                d.append(f"L{sx(x):.1f},{sy(prev):.1f}")
            d.append(f"{'M' if prev is None else 'L'}{sx(x):.1f},{sy(y):.1f}")
            prev = y
        parts.append(f'<path d="{" ".join(d)}" fill="none" stroke="{colour}" stroke-width="2"/>')
        ly = H + 20 * n
        parts.append(f'<rect x="{PAD}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{PAD + 16}" y="{ly}">{html.escape(c.label)} [{c.method}]</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def page(cs: list[Curve], traces: list[Trace]) -> str:
    rows = []
    for t in traces:
        s = t.summary
        for b in (s.best if s else []):
            t_text = f"{b.median_us:.3f} µs {b.method}" if b.median_us is not None else b.note
            rows.append(f"<tr><td>{html.escape(t.path.name)}</td><td>{t.header.policy}</td>"
                        f"<td>{html.escape(b.kernel)}</td><td><code>{html.escape(b.row or '-')}"
                        f"</code></td><td>{html.escape(t_text)}</td>"
                        f"<td>{b.speedup_vs_default or '-'}</td><td>{b.evaluations}</td></tr>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>emmy-agent report</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:4px 10px;"
            "border-bottom:1px solid #ddd;text-align:left}</style></head><body>"
            "<h1>emmy-agent report</h1>" + svg(cs) +
            "<table><tr><th>trace</th><th>policy</th><th>kernel</th><th>best row</th>"
            "<th>time</th><th>× default</th><th>evaluations</th></tr>" + "".join(rows) +
            "</table></body></html>\n")
