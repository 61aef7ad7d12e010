"""A one-page report of a run: one self-contained HTML file (plots inline as PNG data).

It holds the config, the summary (with each metric's interval over seeds when the run directory
has ``intervals.csv``), the timeline, latency CDFs, the per-replica table, the preemption count
and, where the run has them, energy figures. It is made either from a :class:`Results`
(:func:`report_html`) or from a directory that ``simsched run`` wrote (:func:`report_from_dir`:
``summary.csv``, ``requests.csv``, ``iterations.csv``, ``replicas.csv``, ``config.json`` and,
if present, ``intervals.csv``).

The page carries one small script (sortable tables); once the page has loaded it marks
``<body data-rendered="ok" data-images="N/M">`` (M images, N of them decoded), and any script
error is written to ``<html data-error=...>``: the tests read both back from headless Chromium.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:70em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;padding:.2em .5em;
text-align:right}th{background:#f4f4f4;cursor:pointer}img{max-width:100%}
pre{background:#f7f7f7;padding:.8em;font-size:.8em;overflow:auto;max-height:30em}"""

_SCRIPT = """(function(){
  document.querySelectorAll('table.sortable th').forEach(function(th, col){
    th.addEventListener('click', function(){
      var body = th.closest('table').tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var num = function(r){var v = parseFloat(r.cells[col].textContent); return isNaN(v) ? 0 : v;};
      var up = th.dataset.up !== '1'; th.dataset.up = up ? '1' : '0';
      rows.sort(function(a, b){return up ? num(a) - num(b) : num(b) - num(a);});
      rows.forEach(function(r){body.appendChild(r);});
    });
  });
  window.addEventListener('load', function(){
    var imgs = Array.prototype.slice.call(document.images);
    document.body.dataset.images = imgs.filter(function(i){return i.naturalWidth > 0;}).length
      + '/' + imgs.length;
    document.body.dataset.rendered = 'ok';
  });
})();"""
# Before anything else runs: any script error on the page is written where a test can read it.
_ONERROR = ("window.addEventListener('error', function(e){"
            "document.documentElement.dataset.error = String(e.message);});")

SUMMARY_KEYS = ("num_requests", "num_finished", "num_rejected", "ttft_mean", "ttft_p50",
                "ttft_p99", "tpot_mean", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99",
                "e2el_mean", "e2el_p50", "e2el_p99", "queue_time_mean", "request_throughput",
                "output_throughput", "num_preemptions", "kv_usage_mean")
ENERGY_KEYS = ("energy_joules", "busy_energy_joules", "idle_energy_joules", "joules_per_request",
               "joules_per_output_token", "power_mean_watts", "power_peak_watts",
               "num_capped_iterations", "co2_grams")


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _cdf_figure(requests: pd.DataFrame):
    from simsched.analysis.plots import _figure

    fig, axes = _figure(None, 3, (11, 3.2))
    for ax, (col, label) in zip(axes, (("ttft", "TTFT (s)"), ("tpot", "TPOT (s)"),
                                       ("e2el", "E2E latency (s)"))):
        values = np.sort(requests[col].dropna().to_numpy(dtype=float)) \
            if col in requests.columns else np.zeros(0)
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", lw=1)
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return "" if math.isnan(v) else f"{v:.4g}"
    return html.escape(str(v))


def _table(frame: pd.DataFrame, max_rows: int = 200) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row) + "</tr>"
                   for row in frame.head(max_rows).itertuples(index=False))
    more = (f"<p>{len(frame) - max_rows} more rows not shown.</p>" if len(frame) > max_rows
            else "")
    return (f'<div style="overflow-x:auto"><table class="sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{rows}</tbody></table></div>{more}')


def _summary_table(summary: dict, intervals: pd.DataFrame | None) -> str:
    rows = []
    ci = intervals.set_index("metric") if intervals is not None and len(intervals) else None
    for key in SUMMARY_KEYS:
        if key not in summary:
            continue
        row = {"metric": key, "value": summary[key]}
        if ci is not None and key in ci.index:
            row.update(mean=ci.loc[key, "mean"], ci_low=ci.loc[key, "ci_low"],
                       ci_high=ci.loc[key, "ci_high"], num_seeds=int(ci.loc[key, "num_seeds"]))
        rows.append(row)
    return _table(pd.DataFrame(rows))


def build_html(*, title: str, config: dict, summary: dict, requests: pd.DataFrame,
               iterations: pd.DataFrame, replicas: pd.DataFrame | None, num_blocks: int | None,
               intervals: pd.DataFrame | None = None) -> str:
    """The page from its parts (frames as :class:`Results` holds them)."""
    from simsched.analysis.plots import timeline

    parts = [f"<h1>{html.escape(title)}</h1>"]
    parts.append("<h2>Summary</h2>" + _summary_table(summary, intervals))
    if intervals is not None and len(intervals):
        n = int(intervals["num_seeds"].max())
        level = float(intervals["confidence"].iloc[0]) if "confidence" in intervals else 0.95
        parts.append(f"<p>Intervals: Student-t, {level:.0%} two-sided, over {n} seeds.</p>")
    if len(iterations) and num_blocks:
        parts.append("<h2>Timeline</h2>"
                     f'<img alt="timeline" src="{_png(timeline(iterations, num_blocks=num_blocks))}">')
    parts.append("<h2>Latency distributions</h2>"
                 f'<img alt="latency CDFs" src="{_png(_cdf_figure(requests))}">')
    if replicas is not None and len(replicas):
        parts.append("<h2>Replicas</h2>" + _table(replicas))
    status = requests["status"].value_counts().rename_axis("status").reset_index(name="count")
    parts.append("<h2>Requests by outcome</h2>" + _table(status))
    energy = {k: summary[k] for k in ENERGY_KEYS if k in summary}
    parts.append("<h2>Energy</h2>" + (_table(pd.DataFrame([energy])) if energy else
                                       "<p>This run has no power model figures.</p>"))
    parts.append("<h2>Config</h2><pre>" + html.escape(json.dumps(config, indent=1)) + "</pre>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><script>{_ONERROR}</script><style>{_CSS}</style>"
            "</head><body>"
            + "".join(parts) + f"<script>{_SCRIPT}</script></body></html>")


def report_html(res, title: str = "simsched run", intervals: pd.DataFrame | None = None) -> str:
    """The report of a :class:`~simsched.analysis.metrics.Results` as an HTML string (with the
    power model's energy figures where every replica's GPU has power figures)."""
    summary = res.summary()
    try:
        summary.update(res.energy().summary)
    except ValueError:      # a GPU without power figures: the page says it has none
        pass
    return build_html(title=title, config=res.resolved_config(), summary=summary,
                      requests=res.requests, iterations=res.iterations, replicas=res.replicas,
                      num_blocks=res.info.get("num_blocks"), intervals=intervals)


def report_from_dir(directory, path=None) -> Path:
    """Write ``report.html`` (or ``path``) for a directory that ``simsched run`` wrote."""
    from simsched.analysis.export import read_frames

    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"report: {directory} is not a directory (give the --out of a run)")
    needed = ("summary.csv", "requests.csv", "iterations.csv", "config.json")
    missing = [n for n in needed if not (directory / n).is_file()]
    if missing:
        raise ValueError(f"report: {directory} lacks {', '.join(missing)} (write it with "
                         "simsched run --out DIR)")
    frames = read_frames(directory)
    config = json.loads((directory / "config.json").read_text())
    summary = pd.read_csv(directory / "summary.csv").iloc[0].to_dict()
    intervals = pd.read_csv(directory / "intervals.csv") \
        if (directory / "intervals.csv").is_file() else None
    derived = config.get("derived", {})
    text = build_html(title=f"simsched run: {directory.name}", config=config, summary=summary,
                      requests=frames["requests"], iterations=frames["iterations"],
                      replicas=frames.get("replicas"), num_blocks=derived.get("num_blocks")
                      or config.get("cache", {}).get("num_blocks"), intervals=intervals)
    out = Path(path) if path is not None else directory / "report.html"
    out.write_text(text)
    return out


def write_report(res, path, title: str = "simsched run",
                 intervals: pd.DataFrame | None = None) -> Path:
    """Write :func:`report_html` of ``res`` to ``path``; return the path."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"report path {path} is a directory: give a file name")
    text = report_html(res, title, intervals)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
