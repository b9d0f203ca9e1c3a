"""Backend version order.

Version folders are backend releases (``0.5.6.post2``, ``1.3.0rc20``, ``0.1.dev19262``) and are
ordered as PEP 440 orders them (``packaging.version``): a pre-release before its release, a
post-release after it. A folder name that is not a PEP 440 version (``nightly``, ``main``)
sorts before every version, alphabetically among its kind, so that "the newest version" is
always a real release when one exists.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

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


def newest_first(versions: list[str]) -> list[str]:
    return sorted(versions, key=version_key, reverse=True)


__all__ = ["is_version", "newest_first", "version_key"]
