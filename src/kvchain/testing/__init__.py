"""Proof tools for the chain: corner states, operation streams, an exhaustive oracle,
planner/oracle agreement, and replay of recorded streams.

- :mod:`~kvchain.testing.geometry`: :class:`ChainGeometry` (classes by bytes, buffer bytes,
  page size, null pages), :func:`shape_geometry`, :func:`tiny_geometries`, ``SHAPES``.
- :mod:`~kvchain.testing.streams`: typed operations, :class:`ChainRecorder` (price ==
  outcome on every take, audit after every operation), :func:`generate_stream`.
- :mod:`~kvchain.testing.corners`: :func:`build_corner`, :func:`corner_states`.
- :mod:`~kvchain.testing.oracle`: :func:`oracle_fits` over explicit page positions.
- :mod:`~kvchain.testing.agreement`: :func:`check_agreement`, :func:`check_demand_sweep`.
- :mod:`~kvchain.testing.replay`: the JSON-lines stream format, :func:`replay_stream`,
  :func:`generate_section` (used by ``kvchain replay``).
"""

from kvchain.testing.agreement import check_agreement, check_demand_sweep
from kvchain.testing.corners import CornerState, build_corner, corner_states
from kvchain.testing.geometry import (
    SHAPES,
    ChainGeometry,
    ClassBytes,
    shape_geometry,
    tiny_geometries,
)
from kvchain.testing.oracle import OracleProblem, OracleVerdict, oracle_fits
from kvchain.testing.replay import generate_section, read_stream, replay_stream, write_stream
from kvchain.testing.streams import ChainRecorder, generate_stream

__all__ = [
    "SHAPES", "ChainGeometry", "ChainRecorder", "ClassBytes", "CornerState", "OracleProblem",
    "OracleVerdict", "build_corner", "check_agreement", "check_demand_sweep", "corner_states",
    "generate_section", "generate_stream", "oracle_fits", "read_stream", "replay_stream",
    "shape_geometry", "tiny_geometries", "write_stream",
]
