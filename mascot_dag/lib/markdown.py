"""Tables of polars frames as text (polars has no `to_markdown`): markdown for Dagster metadata
previews and summaries, plain text for the terminal. Report sections build their tables row by
row (`report_sections.md_table`)."""

from __future__ import annotations


def markdown_table(df, width: int = 0) -> str:
    """A markdown table of a polars frame; text cells over `width` (> 0) are cut,
    floats printed like tabulate's default (`g`), pipes and newlines escaped."""
    def cell(v) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:g}"
        text = str(v)
        if width and isinstance(v, str) and len(text) > width:
            text = text[: width - 1] + "…"
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "|".join("---" for _ in df.columns) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.rows()]
    return "\n".join(lines)


def text_table(df) -> str:
    """A plain-text table of a frame for the terminal: right-aligned columns separated by two
    spaces, every row and cell whole (polars' own repr cuts long frames and cells)."""
    def cell(v) -> str:
        if v is None:
            return "NULL"
        return str(round(v, 6)) if isinstance(v, float) else str(v).replace("\n", " ")

    rows = [list(df.columns)] + [[cell(v) for v in row] for row in df.rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(df.columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
