"""Render one run's received spans as a waterfall PNG (docs/trace.png), with headless Chromium.

    TRACE_WATERFALL_JSON=var/trace.json scripts/with-postgres.sh .venv/bin/pytest \
        tests/crash/test_run_trace.py -n 0
    .venv/bin/python scripts/trace_waterfall.py var/trace.json docs/trace.png

The JSON is what the test's OTLP receiver decoded (tests/otlp_receiver.py); the page is a plain
HTML table of bars, the tree by parent span id, children in start order.
"""

from __future__ import annotations

import html
import json
import subprocess
import sys
import tempfile
from pathlib import Path

COLOURS = {
    "invoke_agent": "#6b4fbb",
    "advance_run": "#1f78b4",
    "chat": "#33a02c",
    "execute_tool": "#ff7f00",
    "await_approval": "#e6ab02",
}
DETAIL_KEYS = (
    "agentruns.worker",
    "agentruns.slice.outcome",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "agentruns.approval.decided_by",
    "gen_ai.tool.call.id",
)


def ordered(spans: list[dict]) -> list[tuple[int, dict]]:
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict]] = {}
    for span in spans:
        parent = span["parent_span_id"] if span["parent_span_id"] in ids else ""
        children.setdefault(parent, []).append(span)
    out: list[tuple[int, dict]] = []

    def walk(parent: str, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s["start_ns"]):
            out.append((depth, span))
            walk(span["span_id"], depth + 1)

    walk("", 0)
    return out


def detail(span: dict) -> str:
    attrs = span["attributes"]
    parts = []
    for key in DETAIL_KEYS:
        if key in attrs and attrs[key] not in ("", None):
            value = str(attrs[key])
            if key == "agentruns.worker":
                value = value.rsplit(":", 2)[-2] + ":" + value.rsplit(":", 1)[-1]  # pid:tag
            parts.append(f"{key.split('.')[-1]}={value}")
    parts.append(span["service"])
    return " · ".join(parts)


def page(spans: list[dict]) -> str:
    start = min(s["start_ns"] for s in spans)
    total = max(s["end_ns"] for s in spans) - start
    rows = []
    for depth, span in ordered(spans):
        left = (span["start_ns"] - start) / total * 100
        width = max((span["end_ns"] - span["start_ns"]) / total * 100, 0.25)
        ms = (span["end_ns"] - span["start_ns"]) / 1e6
        colour = COLOURS.get(span["name"].split(" ")[0], "#888")
        error = " error" if span["status_code"] == 2 else ""
        rows.append(
            f'<tr><td class="name" style="padding-left:{8 + depth * 18}px">'
            f"{html.escape(span['name'])}</td>"
            f'<td class="bar"><div class="b{error}" style="left:{left:.3f}%;width:{width:.3f}%;'
            f'background:{colour}"></div></td><td class="ms">{ms:,.0f} ms</td>'
            f'<td class="detail">{html.escape(detail(span))}</td></tr>'
        )
    trace_id = spans[0]["trace_id"]
    return f"""<!doctype html><meta charset="utf-8"><style>
body{{font:13px system-ui,sans-serif;margin:16px;color:#222;background:#fff}}
h1{{font-size:15px;margin:0 0 10px}} table{{border-collapse:collapse;width:100%}}
td{{border-bottom:1px solid #eee;padding:3px 6px;white-space:nowrap}}
td.name{{width:240px;font-family:ui-monospace,monospace}} td.bar{{position:relative;width:52%}}
.b{{position:absolute;top:4px;height:14px;border-radius:2px}}
.b.error{{outline:2px solid #d00;background-image:repeating-linear-gradient(45deg,transparent 0 4px,
rgba(255,255,255,.45) 4px 8px)}}
td.ms{{font-size:11px;color:#555;text-align:right;width:70px}}
td.detail{{font-size:11px;color:#555}}</style>
<h1>trace {trace_id} · {len(spans)} spans · {total / 1e9:.1f} s · received over OTLP/HTTP
from daphne and two qcluster workers (the first SIGKILLed; red: error status)</h1>
<table>{"".join(rows)}</table>"""


def main() -> None:
    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    spans = json.loads(source.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        page_path = Path(tmp) / "trace.html"
        page_path.write_text(page(spans))
        height = 90 + 23 * len(spans)
        subprocess.run(
            [
                "/usr/bin/chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={tmp}/profile",
                f"--window-size=1400,{height}",
                f"--screenshot={target.resolve()}",
                page_path.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    print(f"{target}: {len(spans)} spans")


if __name__ == "__main__":
    main()
