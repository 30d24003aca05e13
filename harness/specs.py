"""The default matrix spec, and the ``-k`` selection of a spec's cases by id (pytest's
grammar): plain functions over case ids, importing nothing heavy -- `conformance --help`
loads every command module, and this is all the matrix command needs to name at import."""

from __future__ import annotations

import re
import dataclasses

from .errors import UsageError
from .versions import ROOT

DEFAULT_SPEC = ROOT / "fixtures" / "matrix" / "default.toml"


def keyword_matcher(expr: str):
    """pytest's ``-k`` grammar over a case id: ``expr := and ('or' and)*``, ``and :=
    not ('and' not)*``, ``not := 'not' not | '(' expr ')' | word``; a word matches
    where it is a case-insensitive substring of the id. UsageError for a malformed one."""

    toks = re.findall(r"\(|\)|[^\s()]+", expr)
    if not toks:
        raise UsageError(f"-k {expr!r} is empty; give words joined by and / or / not, e.g. -k 'llama and paged'")
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else None

    def take(want=None):
        nonlocal pos
        t = peek()
        if t is None or (want is not None and t != want):
            raise UsageError(f"-k {expr!r}: expected {want or 'a word'} at {'the end' if t is None else repr(t)}; "
                             "the form is pytest's: words, and / or / not, parentheses")
        pos += 1
        return t

    def chain(op: str, operand, combine):
        """``operand (op operand)*``, its parts combined by ``combine`` (any / all)."""
        parts = [operand()]
        while peek() == op:
            take()
            parts.append(operand())
        return lambda s: combine(f(s) for f in parts)

    def p_or():
        return chain("or", p_and, any)

    def p_and():
        return chain("and", p_not, all)

    def p_not():
        t = peek()
        if t == "not":
            take()
            f = p_not()
            return lambda s: not f(s)
        if t == "(":
            take()
            f = p_or()
            take(")")
            return f
        if t in ("and", "or", ")", None):
            take("a word")  # raises: an operator where a word must be
        w = take().lower()
        return lambda s: w in s.lower()

    f = p_or()
    if peek() is not None:
        raise UsageError(f"-k {expr!r}: unexpected {peek()!r}; join words with and / or")
    return f


def select(spec, expr: str):
    """The spec with only the cases ``-k EXPR`` selects; none is bad input."""
    match = keyword_matcher(expr)
    cases = [c for c in spec.cases if match(c.case_id())]
    if not cases:
        raise UsageError(f"-k {expr!r} selects none of the {len(spec.cases)} cases of {spec.path} "
                         f"(see conformance matrix {spec.path} --list)")
    return dataclasses.replace(spec, cases=cases)
