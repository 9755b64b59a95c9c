"""Quality evidence on fit cells (``opmap fit --quality FILE ...``): each cell names the format it runs and,
where an ``opmap quality`` file covers that workload in that format, cites the file and its end-to-end figures
(SNR, top-1 / next-token agreement, KL of the next-token distributions against fp32). A cell in a block-scaled
or 4-bit float format (MX, NVFP4, fp8-block) with no such file says "no quality evidence": a narrower format's
throughput is not a win until its accuracy is shown.

The files are read and matched to the fit's models before any cell runs; the cells get their evidence after (typed:
``opmap.explore.results.QualityCited`` / ``QualityMissing``); ``words`` reads a cell of fit.json."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opmap.errors import OpmapError
from opmap.explore.results import FitCell, FitMatrix, QualityCited, QualityMissing

if TYPE_CHECKING:
    from opmap.measure.quality import QualityEvidence

NO_EVIDENCE = "no quality evidence"


def _names(model: str) -> set[str]:
    """The names a quality file may give ``model`` by: as given, and a config or model file's own name (what
    ``opmap quality`` records as its workload)."""
    return {model, Path(model).name}  # path/to/config.json -> config.json; dir/m.py:make -> m.py:make


@dataclass(frozen=True)
class Evidence:
    """One quality file matched to a fit model: where it is and what it says."""

    file: str
    quality: QualityEvidence


def read_evidence(paths: Sequence[Path], models: Sequence[str]) -> dict[tuple[str, str], Evidence]:
    """Each quality file (``opmap.measure.quality.read_quality``) by (fit model, format): its path and figures.
    A file for a workload that is none of ``models``, or two files for the same workload and format, are
    refused in one line."""
    out: dict[tuple[str, str], Evidence] = {}
    if not paths:
        return out  # no file: torch (the quality module's) stays unimported in fit's parent process
    from opmap.measure.quality import read_quality

    for p in paths:
        q = read_quality(p)
        model = next((m for m in models if q.workload in _names(m)), None)
        if model is None:
            raise OpmapError(f"quality file {p} is for {q.workload}, not one of the fit's models "
                             f"({', '.join(models)})")
        key = (model, q.dtype)
        if key in out:
            raise OpmapError(f"two quality files for {model} at {q.dtype}: {out[key].file} and {p}")
        out[key] = Evidence(str(p), q)
    return out


def needs_evidence(fmt: str) -> bool:
    """A block-scaled format (MX, NVFP4, fp8-block) or a 4-bit float: its quality is never assumed."""
    from opmap.formats import registry

    f = registry().get(fmt)
    return f is not None and (f.scaled or (f.kind == "float" and f.bits <= 4))


def cell_format(cell: FitCell, fit_dtype: str) -> str:
    """The format a cell's matrices run in: the cell's own where it names one (resolved per device), else the
    fit's --dtype."""
    return cell.dtype or fit_dtype


def attach(r: FitMatrix, evidence: dict[tuple[str, str], Evidence]) -> FitMatrix:
    """``r`` with each cell's ``quality``: the file and its figures (``QualityCited``) where a file covers its
    workload and format, "no quality evidence" (``QualityMissing``) where the format needs evidence and none was
    given; none otherwise."""
    cells = []
    for c in r.cells:
        fmt = cell_format(c, r.dtype)
        ev = evidence.get((c.model, fmt))
        if ev is not None:
            q = ev.quality
            weights = "random" if q.weights is None else q.weights  # files before the key: the zoo's random ones
            c = replace(c, quality=QualityCited(fmt, ev.file, q.snr_db, q.agreement, q.agreement_kind, q.kl, weights,
                                                q.rel_error))
        elif needs_evidence(fmt):
            c = replace(c, quality=QualityMissing(fmt, NO_EVIDENCE))
        cells.append(c)
    return replace(r, cells=tuple(cells))


def words(c: dict[str, Any]) -> str:
    """A cell's quality evidence in words ("" where it has none to state)."""
    q = c.get("quality")
    if not q:
        return ""
    if q.get("file") is None:
        return f"{NO_EVIDENCE} for {q['format']}"
    snr = "exact" if q.get("snr_db") is None else f"SNR {q['snr_db']:.1f} dB"
    kl = f", KL {q['kl']:.3g} nats" if q.get("kl") is not None else ""
    top1 = "top-1" if q["agreement_kind"] == "next-token agreement" else q["agreement_kind"]
    return f"quality {q['format']} vs fp32 ({q['file']}): {snr}, {top1} {q['agreement']:.1%}{kl}"
