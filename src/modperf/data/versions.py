"""Backend version order, and the one policy that picks the versions a question reads.

Version folders are backend releases (``0.5.6.post2``, ``1.3.0rc20``, ``0.1.dev19262``) and are
ordered as PEP 440 orders them (``packaging.version``): a pre-release before its release, a
post-release after it. A folder name that is not a PEP 440 version (``nightly``, ``main``)
sorts before every version, alphabetically among its kind, so that "the newest version" is
always a real release when one exists.

**The version policy.** A version is a deployment's choice: the user's wins, the corpus gives
the default, and the answer says which it used. Every question -- one table (``query``), a
model's attention tables (``estimate``), a whole engine step (``estimate --scope model``,
``predict``) -- reads its tables' versions through :func:`choose_versions`:

1. **A version named** is read where the system and backend hold it; one they do not hold at
   all is refused, naming the versions they hold. A table the named version lacks is read from
   the version nearest it in release order that holds the table and answers the question (a
   tie: the newer; where none answers, the nearest holding it), and a note says so.
2. **No version named**: the newest version holding every table and answering the question
   (``answers``: e.g. its module tables measured the model's native head count). Where none
   answers, the newest version holding every table, with a note; where no version holds every
   table, each table its newest version, with a note. A question only an answering version
   can answer (one table's query, whose other versions hold no bucket of its native) is
   refused instead, naming the versions held.
3. Tables without a version of their own in the question (a whole step's GEMM, MoE and
   communication tables beside its attention tables) are read nearest the version the
   attention tables settled on (:func:`nearest`), with a note where it differs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..base import errors as E

if TYPE_CHECKING:  # packaging on first use: a query that names its version orders none
    from packaging.version import Version


@functools.lru_cache(maxsize=1024)
def version_key(version: str | None) -> tuple[int, Version | str]:
    """Sort key: ``sorted(names, key=version_key)`` puts the newest last."""
    from packaging.version import InvalidVersion, Version

    if version is None:
        return (-1, "")
    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)


def is_version(name: str) -> bool:
    """Whether ``name`` is a PEP 440 version (and orders as one)."""
    return version_key(name)[0] == 1


def newest_first(versions: Iterable[str]) -> list[str]:
    return sorted(versions, key=version_key, reverse=True)


def nearest(order: Sequence[str], holding: Sequence[str], anchor: str) -> str:
    """Of ``holding``, the version nearest ``anchor`` in release order ``order`` (oldest first;
    a tie goes to the newer): the policy's rule for a table the anchor version lacks."""
    if anchor in holding:
        return anchor
    at = order.index(anchor)
    return min(holding, key=lambda v: (abs(order.index(v) - at), -order.index(v)))


def refuse_unknown(where: str, version: str, held: Iterable[str]) -> E.OptionValueError:
    """The refusal of a version the slot does not hold at all (step 1 of the policy)."""
    held = sorted(held, key=version_key)
    return E.OptionValueError(f"{where} has no version {E.quote(version)}", values={"version": version},
                              fix="versions: " + ", ".join(held) if held else "omit --version")


def choose_versions(where: str, by_version: Mapping[str, set[str]], tables: Sequence[str], requested: str | None,
                    answers: Callable[[str, str], bool] | None, notes: list[str], *,
                    answering: str = "answers the question",
                    refuse: Callable[[list[str]], E.ModperfError] | None = None) -> dict[str, str]:
    """The version of each of ``tables`` a question reads (the policy, steps 1 and 2), from
    ``by_version`` (version -> the tables a system and backend hold at it). ``answers(table,
    version)`` says whether a version's table answers the question (None: any does), and
    ``answering`` what a version answering every table means, for the note when none does;
    ``where`` names the system and backend in messages; ``notes`` receives what the choice says.
    ``refuse`` (the holding versions, newest first, -> an error) is for a question no other
    version can answer (one table's query, whose version holds no bucket of its native): with
    no version named and none answering, its error is raised instead of reading the newest."""
    def answer(table: str, version: str) -> bool:
        return answers is None or answers(table, version)

    if requested is not None:
        if requested not in by_version:
            raise refuse_unknown(where, requested, by_version)
        order = sorted(by_version, key=version_key)
        chosen = {}
        for t in tables:
            holding = [v for v in order if t in by_version[v]]
            if not holding:
                raise E.NotCoveredError(f"no {where} version holds a {t} table", values={"table": t},
                                        fix=f"see `modperf ls --system {where.split('/')[0]}`")
            answering_t = [v for v in holding if v == requested or answer(t, v)]
            chosen[t] = nearest(order, answering_t or holding, requested)
        borrowed = sorted(f"{t} {v}" for t, v in chosen.items() if v != requested)
        if borrowed:
            notes.append(f"version {requested} has no {', '.join(t for t in tables if chosen[t] != requested)} "
                         f"table; nearest version holding it: {', '.join(borrowed)}")
        return chosen
    newest = newest_first(by_version)
    complete = [v for v in newest if all(t in by_version[v] for t in tables)]
    for v in complete:
        if all(answer(t, v) for t in tables):
            return {t: v for t in tables}
    if complete and refuse is not None:
        raise refuse(complete)
    if complete:
        notes.append(f"no {where} version {answering}; using the newest complete version, {complete[0]}")
        return {t: complete[0] for t in tables}
    chosen = {}
    for t in tables:
        holding_t = [v for v in newest if t in by_version[v]]
        if not holding_t:
            raise E.NotCoveredError(
                f"no {where} version holds a {t} table", values={"table": t},
                fix=f"see `modperf ls --system {where.split('/')[0]} --backend {where.split('/')[-1]}`")
        chosen[t] = holding_t[0]
    notes.append("no single version holds every table; each table uses its newest version: "
                 + ", ".join(f"{t} {v}" for t, v in chosen.items()))
    return chosen


__all__ = ["choose_versions", "is_version", "nearest", "newest_first", "refuse_unknown", "version_key"]
