"""Runs of local seqs: which rows of the txlog a publisher's ack, an upstream's ack or a link waits on."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Runs of local seqs as two arrays: ``(firsts, lasts)``, ascending, each run ``[first, last]``.
Runs = tuple[np.ndarray, np.ndarray]


def run_bounds(seqs) -> Runs:
    """Consecutive runs of an ascending sequence of ints, as ``(firsts, lasts)`` arrays."""
    values = np.asarray(seqs, dtype=np.int64)
    if values.size == 0:
        return values, values
    breaks = np.flatnonzero(np.diff(values) != 1)
    return values[np.concatenate(([0], breaks + 1))], values[np.concatenate((breaks, [values.size - 1]))]


def runs_of(seqs) -> list[tuple[int, int]]:
    """Consecutive runs [first, last] of an ascending sequence of ints."""
    firsts, lasts = run_bounds(seqs)
    return list(zip(firsts.tolist(), lasts.tolist()))


def stable_order(codes: np.ndarray) -> np.ndarray:
    """``np.argsort(codes, kind="stable")``: grouped by code, in arrival order within each. Codes that fit 16
    bits (publishers or keys of one batch, nearly always) are sorted as such, which numpy does by radix sort:
    ~5x faster on 200k rows than the merge sort of int64."""
    if codes.size and -(1 << 15) <= codes.min() and codes.max() < 1 << 15:
        return np.argsort(codes.astype(np.int16), kind="stable")
    return np.argsort(codes, kind="stable")


def runs_by_code(codes: np.ndarray, seqs: np.ndarray) -> dict[int, Runs]:
    """Runs of ``seqs`` (ascending) per key code, codes < 0 left out: which rows belong to each key."""
    if codes.size == 0:
        return {}
    if (codes == codes[0]).all():  # one key: no grouping
        return {int(codes[0]): run_bounds(seqs)} if codes[0] >= 0 else {}
    order = stable_order(codes)
    sorted_codes = codes[order]
    bounds: np.ndarray = np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1
    return {int(sorted_codes[segment[0]]): run_bounds(seqs[order[segment]])
            for segment in np.split(np.arange(codes.size), bounds) if sorted_codes[segment[0]] >= 0}


def runs_by_value(values, seqs: np.ndarray) -> dict[str, Runs]:
    """Runs of ``seqs`` (ascending) per distinct value of the Arrow string column ``values`` (nulls left out)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.dictionary_encode(values)
    labels = encoded.dictionary.to_pylist()
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return {labels[code]: runs for code, runs in runs_by_code(codes, seqs).items()}
