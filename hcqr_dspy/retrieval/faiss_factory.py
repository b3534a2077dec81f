"""The faiss ``index_factory`` strings hcqr builds, checked before faiss sees them.

faiss parses a factory string in C++ and checks few of its numbers: some
bad ones raise an error, but others abort or crash the whole process while
the index is built (``HNSW0`` fails a C++ assertion when vectors are added,
exit 134; ``HNSW1`` and ``RQ0x8`` crash with a segmentation fault; ``PQ8x0``
with a floating-point exception; ``IVF16_HNSW0,Flat`` and
``Refine(HNSW0)`` abort like ``HNSW0``), leaving no message and a half-made
index folder behind. So hcqr builds only the forms below, with their
numbers in range, and refuses any other string in one line that lists them
(faiss's wiki, "The index factory", documents each component)::

    [OPQ<m>[_<dim>],] BASE [,RFlat]

    BASE := Flat                                    exact search
          | SQ<t>                                   scalar quantizer, t: 4, 6, 8, fp16, bf16
          | PQ<m>[x<bits>][np]                      product quantizer
          | HNSW[<M>][,Flat | ,SQ<t> | ,PQ...]      graph (M defaults to 32), storing those codes
          | IVF<lists>[_HNSW[<M>]],{Flat | SQ<t> | PQ...}   inverted lists (coarse quantizer: flat or HNSW)

Ranges: HNSW's ``M`` (neighbours per node) 2 to 512 (0 aborts faiss, 1
crashes it; its wiki uses 4 to 64); ``lists`` 1 to 2^20 (its largest suggestion, for a billion vectors); PQ's ``m``
(sub-quantizers) at least 1 and a divisor of the dimension it encodes,
``bits`` 1 to 16 (0 crashes faiss; it trains 2^bits centroids per sub-quantizer, so 24 bits asks
about 25 GB of codebooks at 384-d before failing, and 16 is the most its PQ codes use in practice); OPQ's ``m``
at least 1, its output ``dim`` 1 to the vectors' dimension and a multiple of
its ``m``, and it must come before a PQ (the PQ then encodes ``dim``
dimensions); ``,RFlat`` (exact re-ranking, ``IndexRefineFlat``) follows any
base but ``Flat``. Numbers are decimal digits.
"""

from __future__ import annotations

import re

from hcqr_dspy.errors import RetrievalIndexError

SQ_TYPES = ("SQ4", "SQ6", "SQ8", "SQfp16", "SQbf16")
HNSW_M = (2, 512)
MAX_LISTS = 2**20  # faiss's wiki suggests IVF1048576 for up to a billion vectors
PQ_BITS = (1, 16)
SUPPORTED = (
    "Flat, SQ<t>, PQ<m>[x<bits>][np], HNSW[<M>][,CODE], IVF<lists>[_HNSW[<M>]],CODE with CODE one of "
    "Flat, SQ<t>, PQ<m>[x<bits>][np]; each optionally after OPQ<m>[_<dim>], "
    "(before a PQ) and before ,RFlat; t: 4, 6, 8, fp16, bf16; e.g. Flat, HNSW32, IVF1024,PQ32, "
    "IVF4096,SQ8, IVF1024,PQ96,RFlat"
)

_HNSW = re.compile(r"HNSW([0-9]*)")
_IVF = re.compile(r"IVF([0-9]+)(?:_HNSW([0-9]*))?")
_PQ = re.compile(r"PQ([0-9]+)(?:x([0-9]+))?(np)?")
_OPQ = re.compile(r"OPQ([0-9]+)(?:_([0-9]+))?")


class _Refused(ValueError):
    """Why a factory string is not built (the clause of the one-line error)."""


def check_factory(factory: str, dimension: int) -> str:
    """``factory`` stripped, if it is one of the supported forms (module note) with its numbers in range for
    ``dimension``-d vectors.

    Raises:
        RetrievalIndexError: anything else, in one line: the string, the reason and the supported forms.
    """
    text = factory.strip() if isinstance(factory, str) else ""
    try:
        if not text:
            raise _Refused("empty")
        _check(text.split(","), int(dimension))
    except _Refused as reason:
        raise RetrievalIndexError(
            f"--faiss {factory!r} is not a faiss index_factory string usable with {dimension}-d "
            f"vectors ({reason}); supported: {SUPPORTED}"
        ) from None
    return text


def _check(parts: list[str], dimension: int) -> None:
    opq = _OPQ.fullmatch(parts[0]) if parts else None
    coded = dimension  # the dimension a PQ encodes: the vectors', or OPQ's output
    if opq:
        try:
            m = _number(opq.group(1), "OPQ's sub-quantizers", 1, dimension)
            coded = _number(opq.group(2), "OPQ's output dimension", 1, dimension) if opq.group(2) else dimension
        except _Refused as reason:
            raise _Refused(f"{parts[0]}: {reason}") from None
        if coded % m:
            raise _Refused(f"{parts[0]}: OPQ's output dimension {coded} is not a multiple of its {m} sub-quantizers")
        parts = parts[1:]
    refine = len(parts) > 1 and parts[-1] == "RFlat"
    if refine:
        parts = parts[:-1]
    if not parts or parts == [""]:
        raise _Refused("nothing to build")
    if refine and parts == ["Flat"]:
        raise _Refused("RFlat re-ranks compressed codes; Flat is already exact")
    head, hnsw, ivf = parts[0], _HNSW.fullmatch(parts[0]), _IVF.fullmatch(parts[0])
    if len(parts) == 1 and not hnsw:
        code = _code(head, coded, "")
    elif hnsw and len(parts) <= 2:
        _hnsw_m(hnsw.group(1), head)
        code = _code(parts[1], coded, "HNSW") if len(parts) == 2 else "Flat"
    elif ivf and len(parts) == 2:
        try:
            _number(ivf.group(1), "IVF's lists", 1, MAX_LISTS)
        except _Refused as reason:
            raise _Refused(f"{head}: {reason}") from None
        if ivf.group(2) is not None:
            _hnsw_m(ivf.group(2), head)
        code = _code(parts[1], coded, "IVF")
    else:
        raise _Refused("not one of the supported forms")
    if opq and not code.startswith("PQ"):
        raise _Refused("OPQ rotates vectors for a PQ code; put it before a PQ type")


def _number(digits: str, what: str, low: int, high: int) -> int:
    value = int(digits) if digits.isdigit() else None
    if value is None or not low <= value <= high:
        raise _Refused(f"{what} must be {low} to {high:,}, got {digits or 'none'}")
    return value


def _hnsw_m(digits: str, part: str) -> int:
    """HNSW's M: empty means faiss's default, 32."""
    if digits == "":
        return 32
    try:
        return _number(digits, "HNSW's M (neighbours per node)", *HNSW_M)
    except _Refused as reason:
        raise _Refused(f"{part}: {reason}") from None


def _code(part: str, coded: int, holder: str) -> str:
    """A code type (Flat, SQ<t>, PQ...) standing alone or stored by ``holder`` (HNSW, IVF)."""
    if part in ("Flat", *SQ_TYPES):
        return part
    pq = _PQ.fullmatch(part)
    if pq is None:
        if holder:
            raise _Refused(f"{part}: {holder} stores Flat, SQ<t> (t: 4, 6, 8, fp16, bf16) or PQ<m>[x<bits>][np] codes")
        raise _Refused("not one of the supported forms")
    try:
        m = _number(pq.group(1), "PQ's sub-quantizers", 1, coded)
        if pq.group(2) is not None:
            _number(pq.group(2), "PQ's bits per code", *PQ_BITS)
    except _Refused as reason:
        raise _Refused(f"{part}: {reason}") from None
    if coded % m:
        raise _Refused(f"{part}: the dimension ({coded}) must be a multiple of the number of subquantizers ({m})")
    return part
