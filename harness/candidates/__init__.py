"""Candidates: the engines the harness judges (impl by default). The protocol
and the registry are in ``api``; the built-ins are declared as entry points of
the group ``attn_conformance.candidates`` in pyproject.toml, like any user's."""

from .api import (  # noqa: F401
    DEFAULT,
    DUMP_PREFIX,
    GROUP,
    PROBE_SHAPES,
    Candidate,
    CandidateCapture,
    LayerCall,
    LayerCandidate,
    NotExposed,
    get,
    names,
    registry,
)
