"""Network links: collective traffic and utilization."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["allreduce_bytes_per_rank", "allreduce_time_s", "link_utilization"]


def allreduce_bytes_per_rank(size_bytes: ArrayLike, n_ranks: ArrayLike) -> NDArray[np.float64]:
    r"""Bytes each rank sends (and receives) in one all-reduce.

    Parameters
    ----------
    size_bytes : array_like
        Size of the buffer reduced, e.g. the gradients: parameters × bytes each. [B]
    n_ranks : array_like
        Ranks taking part; 1 rank sends nothing. [1]

    Returns
    -------
    numpy.ndarray
        Bytes sent per rank. [B]

    Notes
    -----
    Ring (or any send/receive) all-reduce:

    .. math:: V = 2\,\frac{n - 1}{n}\,S

    References
    ----------
    docs/physics.md §5 (NCCL tests, ``doc/PERFORMANCE.md``: busBW = algBW · 2(n-1)/n).

    Examples
    --------
    >>> float(allreduce_bytes_per_rank(16e9, 1024)) / 1e9
    31.96875
    """
    n = np.asarray(n_ranks, dtype=float)
    return 2.0 * (n - 1.0) / n * np.asarray(size_bytes, dtype=float)


def allreduce_time_s(
    size_bytes: ArrayLike, n_ranks: ArrayLike, bandwidth_bps: ArrayLike
) -> NDArray[np.float64]:
    r"""Ideal time of one all-reduce at a per-rank bandwidth.

    Parameters
    ----------
    size_bytes : array_like
        Buffer size. [B]
    n_ranks : array_like
        Ranks. [1]
    bandwidth_bps : array_like
        Per-rank network bandwidth. [bit/s]

    Returns
    -------
    numpy.ndarray
        :math:`t = 8 V / B` with :math:`V` from :func:`allreduce_bytes_per_rank`. [s]

    References
    ----------
    docs/physics.md §5.
    """
    return (
        8.0 * allreduce_bytes_per_rank(size_bytes, n_ranks) / np.asarray(bandwidth_bps, dtype=float)
    )


def link_utilization(tx_bps: ArrayLike, capacity_bps: ArrayLike) -> NDArray[np.float64]:
    r"""Utilization of a link direction, :math:`u = r / C`.

    Parameters
    ----------
    tx_bps : array_like
        Traffic rate in one direction. [bit/s]
    capacity_bps : array_like
        Link capacity (per direction, full duplex). [bit/s]

    Returns
    -------
    numpy.ndarray
        Utilization, 0..1 for a feasible rate. [1]

    References
    ----------
    docs/physics.md §5.

    Examples
    --------
    >>> float(link_utilization(200e9, 400e9))
    0.5
    """
    return np.asarray(tx_bps, dtype=float) / np.asarray(capacity_bps, dtype=float)
