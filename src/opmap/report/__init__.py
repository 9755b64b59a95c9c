"""Reports: terminal tables, CSV, Markdown and JSON renderings of an Analysis."""
