"""Collapsed stacks (py-spy's `--format raw`: `frame;frame;... count` per line) to an SVG flame
graph and to tables of the top costs, so the picture and the numbers come from the same samples."""

from __future__ import annotations

import html
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r" \(([^():]+):\d+\)$")  # "fn (path:line)" -> "fn (path)"
WIDTH, ROW = 1200, 16


# a sample inside an import is start-up (or a lazy first import), not the work measured
STARTUP = "importlib._bootstrap"


def read_stacks(path: Path) -> Counter:
    """The samples of `path`, those taken inside an import left out."""
    stacks: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit() and STARTUP not in stack:
            frames = tuple(_LINE.sub(r" (\1)", f) for f in stack.split(";"))
            stacks[frames] += int(count)
    return stacks


def top_costs(stacks: Counter, limit: int = 15, only: str = "") -> tuple[list, list, int]:
    """(inclusive, self) top functions as (frame, samples), and the total samples. `only`: a
    substring a frame's file must contain to be listed (e.g. "agentruns/")."""
    total = sum(stacks.values())
    inclusive: Counter = Counter()
    own: Counter = Counter()
    for frames, count in stacks.items():
        for frame in set(frames[1:]):  # frames[0]: the process
            inclusive[frame] += count
        own[frames[-1]] += count
    pick = [(f, c) for f, c in inclusive.most_common() if only in f][:limit]
    return pick, own.most_common(limit), total


def share(stacks: Counter, needle: str) -> float:
    """Share of the samples with a frame containing `needle` anywhere in the stack."""
    total = sum(stacks.values()) or 1
    return sum(c for frames, c in stacks.items() if any(needle in f for f in frames)) / total


def _colour(frame: str) -> str:
    if "agentruns/" in frame:
        return "#f2a65a"
    if "psycopg" in frame or "django/db" in frame:
        return "#6fa8dc"
    if "django_q" in frame:
        return "#93c47d"
    return "#e6c36a"


def write_svg(stacks: Counter, path: Path, title: str) -> None:
    tree: dict = {}
    for frames, count in stacks.items():
        node = tree
        for frame in frames:
            entry = node.setdefault(frame, [0, {}])
            entry[0] += count
            node = entry[1]
    total = sum(stacks.values()) or 1
    rects: list[str] = []
    depth_max = [0]

    def draw(node: dict, x: float, depth: int) -> None:
        depth_max[0] = max(depth_max[0], depth)
        for frame, (count, children) in sorted(node.items()):
            width = count / total * WIDTH
            if width >= 0.3:
                label = html.escape(f"{frame} ({count} samples, {count / total:.1%})")
                short = html.escape(frame[: int(width / 7)]) if width > 35 else ""
                rects.append(
                    f'<g><title>{label}</title><rect x="{x:.1f}" y="{{y{depth}}}" '
                    f'width="{width:.1f}" height="{ROW - 1}" fill="{_colour(frame)}"/>'
                    f'<text x="{x + 2:.1f}" y="{{t{depth}}}">{short}</text></g>'
                )
                draw(children, x, depth + 1)
            x += width

    draw(tree, 0.0, 0)
    height = (depth_max[0] + 3) * ROW
    body = "\n".join(rects)
    for depth in range(depth_max[0] + 1):  # icicle: the process on top, callees below
        y = ROW * (depth + 2)
        body = body.replace(f"{{y{depth}}}", str(y)).replace(f"{{t{depth}}}", str(y + ROW - 4))
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="11">\n'
        f'<text x="4" y="14" font-size="13">{html.escape(title)} ({total} samples; hover '
        "a frame for its share; orange: agentruns, blue: psycopg/Django DB, green: django-q2)"
        f"</text>\n{body}\n</svg>\n"
    )
