"""Writing a benchmark's section of docs/BENCHMARKS.md: each harness owns the text between its
own markers and leaves the rest of the file (the other harnesses' sections, the prose) alone."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"


def write_marked_section(name: str, text: str) -> None:
    """Replace what stands between `<!-- name:start -->` and `<!-- name:end -->` with `text`
    (appended at the end of the file the first time)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    body = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    block = f"{start}\n{text.rstrip(chr(10))}\n{end}"
    if start in body and end in body:
        body = body[: body.index(start)] + block + body[body.index(end) + len(end) :]
    else:
        body = body.rstrip() + "\n\n" + block + "\n"
    DOCS.write_text(body)
    print(f"wrote the {name} section of {DOCS}")
