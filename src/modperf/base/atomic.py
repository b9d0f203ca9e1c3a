"""Atomic file writes: a reader sees the old file or the new one, never a partial one.

The bytes go to a temporary file in the target's own folder (a rename is only atomic within
one filesystem), are flushed and fsynced, optionally checked by a ``verify`` callback that
reads the temporary file back, and only then take the target's name: ``os.replace`` when the
target may be replaced, a hard link when it must not exist yet (``link`` fails instead of
clobbering, so two writers cannot both win). The folder is fsynced after the rename so the
new name survives a crash. On any failure the temporary file is removed and the target is
left as it was.

A temporary file is created exclusively and without following a symbolic link (``O_CREAT |
O_EXCL | O_NOFOLLOW``, mode 0600; its mode is set on the open descriptor), so that a link or a
file someone planted at its name makes the write fail instead of redirecting it.

A temporary file's name says whose it is: ``.{target}~{host}~{boot}~{pid}~{start}~{random}.modperf-tmp``
(host name, boot id, process id and the process's start time). A process killed with
``kill -9`` cannot remove its temporary file; the next write into the same folder on the same
host removes it, but only once it can prove the writer is gone (no process with that id, or one
that started at another time, or another boot). A temporary file it cannot prove stale is left
alone; ``modperf check`` reports it.

Writing parquet through this path, and the owner stamp, is :mod:`modperf.data.parquet_files`.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from . import errors as E

#: Temporary files end with this (the name before it says which process wrote it).
TMP_SUFFIX = ".modperf-tmp"
#: How every temporary file is created: a new file (never one that exists, never through a link).
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: Parquet footer key that marks a file modperf wrote (value: which command and version).
_SEP = "~"
_HOST_CHARS = re.compile(r"[^A-Za-z0-9.-]")


@functools.cache
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip().replace("-", "")[:12] or "0"
    except OSError:
        return "0"


def _host() -> str:
    import socket  # on use: a reader never writes

    return _HOST_CHARS.sub("-", socket.gethostname())[:64] or "host"


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, from /proc), or None where there is no
    such process or no /proc to ask."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count fields after the last ')'
    fields = stat_line[stat_line.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


def _temp_prefix(target: Path) -> str:
    me = os.getpid()
    return _SEP.join((f".{target.name[:80]}", _host(), _boot_id(), str(me), _start_time(me) or "0", ""))


def temp_owner(path: Path) -> tuple[str, str, int, str] | None:
    """(host, boot id, pid, start time) of a temporary file this module named, else None."""
    name = path.name
    if not name.endswith(TMP_SUFFIX):
        return None
    parts = name[: -len(TMP_SUFFIX)].rsplit(_SEP, 5)
    if len(parts) != 6 or not parts[3].isdigit():
        return None
    return parts[1], parts[2], int(parts[3]), parts[4]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return True
    return True


def is_stale_temp(path: Path) -> bool:
    """Whether ``path`` is a temporary file of a modperf process on this host that is provably
    gone: another boot, no process with its id, or a process with its id that started at
    another time. Anything else (another host, an unknown name, a live writer) is not."""
    owner = temp_owner(path)
    if owner is None:
        return False
    host, boot, pid, start = owner
    if host != _host():
        return False
    if boot != _boot_id():
        return boot != "0" and _boot_id() != "0"
    if not _pid_alive(pid):
        return True
    now = _start_time(pid)
    return now is not None and start != "0" and now != start


def is_live_temp(path: Path) -> bool:
    """Whether ``path`` is the temporary file of a write still running on this host."""
    owner = temp_owner(path)
    if owner is None or owner[0] != _host() or owner[1] != _boot_id():
        return False
    return not is_stale_temp(path) and _pid_alive(owner[2])


def temp_files(folder: Path) -> list[Path]:
    """Temporary files of this module in ``folder`` (after a completed write there are none)."""
    try:
        return sorted(p for p in folder.iterdir() if p.name.endswith(TMP_SUFFIX))
    except OSError:
        return []


def sweep(folder: Path) -> list[Path]:
    """Remove the temporary files in ``folder`` left by modperf writes that were killed (only
    those :func:`is_stale_temp` proves stale); returns what was removed."""
    removed = []
    for p in temp_files(folder):
        if is_stale_temp(p):
            with suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


def real_target(target: Path, *, follow: bool) -> Path:
    """The file a write to ``target`` replaces: a symbolic link is followed (the link stays, its
    target is rewritten) only when the caller decided to; otherwise it is refused."""
    if not target.is_symlink():
        return target
    if not follow:
        raise E.TargetExistsError("target is a symbolic link; it is not replaced", file=target,
                                  fix="write somewhere else, or replace the link by the file it points to")
    return target.resolve()


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open a folder; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _mode_for(target: Path) -> int:
    """Keep a replaced file's permission bits; a new file gets the umask's default."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@dataclass
class StagedFile:
    """A fully written, fsynced temporary file waiting to take its target's name."""

    target: Path
    temp: Path
    overwrite: bool

    def commit(self) -> None:
        """Give the temporary file the target's name (atomically), then fsync the folder."""
        try:
            if self.overwrite:
                os.replace(self.temp, self.target)
            else:
                _link_new(self.temp, self.target)
        except E.ModperfError:
            raise
        except OSError as exc:
            raise E.WriteFailedError(
                f"cannot rename the written file into place: {exc}", file=self.target,
                fix="check permissions and free space in the folder; the target was not changed",
            ) from exc
        _fsync_dir(self.target.parent)

    def discard(self) -> None:
        with suppress(FileNotFoundError):
            self.temp.unlink()


def _link_new(temp: Path, target: Path) -> None:
    try:
        os.link(temp, target)
    except FileExistsError:
        raise E.TargetExistsError(
            "target already exists (created while this write was running)", file=target,
            fix="remove it, or write somewhere else",
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # a filesystem without hard links: check, then replace (a narrow race, reported honestly)
        if target.exists():
            raise E.TargetExistsError("target already exists", file=target,
                                      fix="remove it, or write elsewhere") from None
        os.replace(temp, target)
        return
    temp.unlink()


def _set_mode(fd: int, path: Path, mode: int) -> None:
    """A new file's mode, set on its open descriptor (never through its name, which someone
    could have swapped for a link meanwhile); by name only where there is no ``fchmod``."""
    fchmod = getattr(os, "fchmod", None)
    if fchmod is not None:
        fchmod(fd, mode)
    else:  # pragma: no cover  (no fchmod: not POSIX)
        os.chmod(path, mode)


def stage(
    target: Path,
    write: Callable[[BinaryIO], None],
    *,
    overwrite: bool,
    verify: Callable[[Path], None] | None = None,
    follow_symlink: bool = False,
    mode: int | None = None,
) -> StagedFile:
    """Write ``target``'s future content to a temporary file beside it and verify it.

    ``write`` receives the open temporary file. ``verify`` receives its path once it is
    complete and fsynced; raising there (or anywhere) removes the temporary file. Nothing
    is visible under ``target`` until :meth:`StagedFile.commit`. A ``target`` that is a
    symbolic link is refused unless ``follow_symlink`` (then the file it points to is replaced
    and the link stays). Stale temporary files of killed writes in the folder are removed first.
    The file gets ``mode`` (default: a replaced file's bits, else the umask's default).
    """
    target = real_target(Path(target), follow=follow_symlink)
    if not overwrite and (target.exists() or target.is_symlink()):
        raise E.TargetExistsError("target already exists", file=target, fix="remove it, or write somewhere else")
    if target.is_dir():
        raise E.TargetExistsError("target is a folder", file=target, fix="write somewhere else")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep(target.parent)
        temp = target.parent / f"{_temp_prefix(target)}{os.urandom(4).hex()}{TMP_SUFFIX}"
        fd = os.open(temp, NEW_FILE_FLAGS, 0o600)
    except OSError as exc:
        raise E.WriteFailedError(f"cannot create a file in {target.parent}: {exc.strerror or exc}", file=target,
                                 fix="check that the folder exists, is a folder and is writable") from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            _set_mode(handle.fileno(), temp, _mode_for(target) if mode is None else mode)
        if verify is not None:
            verify(temp)
    except BaseException as exc:
        with suppress(FileNotFoundError):
            temp.unlink()
        if isinstance(exc, OSError):
            raise E.WriteFailedError(
                f"writing failed: {exc.strerror or exc}", file=target,
                fix="free space or fix permissions, then run again; the target was not changed and the "
                    "temporary file was removed",
            ) from exc
        raise
    return StagedFile(target, temp, overwrite)


def write_atomically(
    target: Path,
    write: Callable[[BinaryIO], None],
    *,
    overwrite: bool,
    verify: Callable[[Path], None] | None = None,
    follow_symlink: bool = False,
    mode: int | None = None,
) -> None:
    """Stage, verify and commit one file."""
    staged = stage(target, write, overwrite=overwrite, verify=verify, follow_symlink=follow_symlink, mode=mode)
    try:
        staged.commit()
    finally:
        staged.discard()  # no-op after a successful replace; removes the temp if commit failed


def replace_unsynced(target: str | os.PathLike[str], pieces: Iterable[bytes | memoryview]) -> None:
    """Write ``pieces`` to a temporary file beside ``target`` (created as every temporary file
    is: exclusive, no link followed, mode 0600) and rename it onto ``target``, without fsync:
    for cache files, whose digest refuses a copy a crash tore. The temporary file is removed
    on any failure (which raises)."""
    target = os.fspath(target)
    folder, name = os.path.split(target)
    temp = os.path.join(folder, _temp_prefix(Path(name)) + os.urandom(6).hex() + TMP_SUFFIX)
    fd = os.open(temp, NEW_FILE_FLAGS, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            for piece in pieces:
                handle.write(piece)
        os.replace(temp, target)
    except BaseException:
        with suppress(OSError):
            os.unlink(temp)
        raise


@contextmanager
def staged_files() -> Iterator[list[StagedFile]]:
    """Collect several staged files; on an exception before commit, every one is discarded."""
    staged: list[StagedFile] = []
    try:
        yield staged
    finally:
        for s in staged:
            s.discard()


def text_writer(text: str) -> Callable[[BinaryIO], None]:
    def write(handle: BinaryIO) -> None:
        handle.write(text.encode("utf-8"))

    return write
