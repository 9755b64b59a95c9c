"""Reports: terminal tables, CSV, Markdown and JSON renderings of an Analysis; the Chrome trace, the closure memo
and the self-contained HTML dashboard (dashboard.py, html.py) with its PNG figures (figures.py)."""
