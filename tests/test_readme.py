"""The README's commands name only files the repository holds: every file path an ``opmap`` / ``make`` command in
a fenced code block of README.md reads exists in a clean clone (before: ``bench --launch tiny-llama.json``, a file
the repository did not ship).

What counts as a path read: an argument or option value with a file extension or a ``/``. Not a read: what a
command writes (``--out``), URLs and ``hf:`` ids, a model id (``--model``), upper-case placeholders (RUN_ID), and
the user's own files, which the README always writes under ``path/to/``. A file under a folder an earlier README
command wrote (``--out out/q`` then ``--quality out/q/quality.json``), or what it wrote itself (``--out runs/c1`` then
``--from-bench runs/c1``), is one the reader has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILE_EXT = re.compile(r"\.(json|jsonl|py|onnx|toml|yaml|yml|csv|md|txt|pt|safetensors|duckdb)(:\w+)?$")
WRITES = {"--out", "--store"}  # a folder or a file a command creates
NOT_PATHS = {"--model", "--layer-type", "--dim", "--where"}


def commands(text: str) -> list[list[str]]:
    """The commands of the README's fenced code blocks: continuation lines joined, comments and the optional
    ``[...]`` brackets of a synopsis dropped, leading ``NAME=value`` settings skipped; only opmap and make."""
    out = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        joined = re.sub(r"\\\n", " ", block)
        for line in joined.splitlines():
            line = re.split(r"\s#", line, maxsplit=1)[0].replace("[", " ").replace("]", " ")
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words = words[1:]
            if words and Path(words[0]).name in ("opmap", "make"):
                out.append(words)
    return out


def paths_read(words: list[str]) -> list[str]:
    found = []
    prev = ""
    for w in words[1:]:
        skip = prev in WRITES or prev in NOT_PATHS or w.startswith("-")
        prev = w
        if skip or "://" in w or w.startswith("hf:") or w.startswith("path/to/") or w.isupper():
            continue
        if FILE_EXT.search(w) or "/" in w:
            found.append(w.split(":")[0] if FILE_EXT.search(w) and ":" in w else w)
    return found


def written(words: list[str]) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w in WRITES]


def test_every_file_a_readme_command_reads_is_in_the_repository():
    cmds = commands((ROOT / "README.md").read_text())
    assert len(cmds) > 40  # the tour, the serving, bench, fit and report sections were all parsed
    missing, made, checked = [], [], []
    for words in cmds:
        for p in paths_read(words):
            checked.append(p)
            if not (ROOT / p).exists() and not any(p == d or p.startswith(d.rstrip("/") + "/") for d in made):
                missing.append(f"{p} in: {' '.join(words)}")
        made += written(words)
    assert not missing, "\n".join(missing)
    assert "examples/tiny-llama.json" in checked  # the bench --launch example


def test_the_checker_catches_a_missing_file_and_spares_the_rest():
    text = ("```\nopmap bench --launch tiny-llama.json --predict   # a comment naming gone.json\n"
            "opmap analyze path/to/config.json --out out/x \\\n  --dtype bf16\n"
            "opmap analyze gpt2 --quality out/x/quality.json --store runs.duckdb\n"
            "RAY_ADDRESS=ray://h:1 opmap fit --models gpt2 --config hf:org/name\n```\n")
    cmds = commands(text)
    assert [paths_read(c) for c in cmds] == [["tiny-llama.json"], [], ["out/x/quality.json"], []]
    assert written(cmds[1]) == ["out/x"]
