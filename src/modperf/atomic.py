"""Atomic file writes: a reader sees the old file or the new one, never a partial one.

The bytes go to a temporary file in the target's own folder (a rename is only atomic within
one filesystem), are flushed and fsynced, optionally checked by a ``verify`` callback that
reads the temporary file back, and only then take the target's name: ``os.replace`` when the
target may be replaced, a hard link when it must not exist yet (``link`` fails instead of
clobbering, so two writers cannot both win). The folder is fsynced after the rename so the
new name survives a crash. On any failure the temporary file is removed and the target is
left as it was.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from . import errors as E

#: Temporary files are named ``.{target name}.{random}.modperf-tmp`` beside the target.
TMP_SUFFIX = ".modperf-tmp"


def temp_files(folder: Path) -> list[Path]:
    """Leftover temporary files of this module in ``folder`` (there should be none)."""
    return sorted(p for p in folder.iterdir() if p.name.endswith(TMP_SUFFIX))


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


def stage(
    target: Path,
    write: Callable[[BinaryIO], None],
    *,
    overwrite: bool,
    verify: Callable[[Path], None] | None = None,
) -> StagedFile:
    """Write ``target``'s future content to a temporary file beside it and verify it.

    ``write`` receives the open temporary file. ``verify`` receives its path once it is
    complete and fsynced; raising there (or anywhere) removes the temporary file. Nothing
    is visible under ``target`` until :meth:`StagedFile.commit`.
    """
    target = Path(target)
    if not overwrite and target.exists():
        raise E.TargetExistsError("target already exists", file=target, fix="remove it, or write somewhere else")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TMP_SUFFIX, dir=target.parent)
    except OSError as exc:
        raise E.WriteFailedError(f"cannot create a file in {target.parent}: {exc}", file=target,
                                 fix="check that the folder is writable") from exc
    temp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, _mode_for(target))
        if verify is not None:
            verify(temp)
    except BaseException as exc:
        with suppress(FileNotFoundError):
            temp.unlink()
        if isinstance(exc, OSError):
            raise E.WriteFailedError(
                f"writing failed: {exc}", file=target,
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
) -> None:
    """Stage, verify and commit one file."""
    staged = stage(target, write, overwrite=overwrite, verify=verify)
    try:
        staged.commit()
    finally:
        staged.discard()  # no-op after a successful replace; removes the temp if commit failed


@contextmanager
def staged_files() -> Iterator[list[StagedFile]]:
    """Collect several staged files; on an exception before commit, every one is discarded."""
    staged: list[StagedFile] = []
    try:
        yield staged
    finally:
        for s in staged:
            s.discard()


def parquet_writer(table: pa.Table, *, compression: str = "zstd", row_group_size: int | None = None
                   ) -> Callable[[BinaryIO], None]:
    """A ``write`` callback that stores ``table`` as parquet (the corpus uses zstd)."""

    def write(handle: BinaryIO) -> None:
        pq.write_table(table, handle, compression=compression, row_group_size=row_group_size)

    return write


def text_writer(text: str) -> Callable[[BinaryIO], None]:
    def write(handle: BinaryIO) -> None:
        handle.write(text.encode("utf-8"))

    return write
