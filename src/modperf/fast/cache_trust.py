"""Who may have written the persisted cache: the ownership rule that keeps crafted files out.

The cache's files are trusted input: a query plan is a ``marshal`` value, an entry's arrays
are taken as they lie, and each file's digest is unkeyed (anyone can frame a forged value
with a digest that checks). So they are read only from where no one but the user (and root)
can write -- the rule pip's cache, OpenSSH's ``StrictModes`` and git's ``safe.directory``
apply. Checked once per process (:func:`folder_problem`), before anything in the cache is
opened:

* **the cache folder and the subfolders modperf keeps in it** (``plans``, ``grids``,
  ``catalogs``; each only where it exists): a real folder (not a symbolic link), owned by the
  user, not writable by group or others;
* **every folder the path to it passes through**, from ``/`` down, walked one name at a time
  as the kernel resolves it (so a symbolic link's target is walked too, and ``..`` is taken
  after the links before it): owned by the user or by root, and not writable by group or
  others unless it has the sticky bit (``/tmp``: others can add names there but cannot rename
  or remove the user's);
* **every symbolic link on that path**: owned by the user or by root (in a sticky folder a
  link's owner can point it elsewhere at any time).

A folder that does not exist yet is no finding: the folders above it are judged, and modperf
creates the missing ones itself, mode 0700 (:func:`make_folder`, which checks what it made or
found). Otherwise the cache is off for the process and the reason is said once on stderr:
``cache off: <folder> is writable by others (fix: chmod go-w <folder>)``.

**Each file, when opened.** A cache file is opened without following a symbolic link
(``O_NOFOLLOW``) and is read only when the opened descriptor (``fstat``, not the path: no
window between the check and the read) is a regular file owned by the user and not writable
by group or others (:func:`open_owned`, :func:`read_owned`). Anything else is a miss: the
entry is built again and the user's own file replaces it.

Writing is :mod:`modperf.base.atomic`'s (temporary files created with ``O_CREAT | O_EXCL |
O_NOFOLLOW``, mode 0600, renamed into place). Where there is no user id (not POSIX) there is
no ownership to check and the rule is not applied.

The standard library only, and no modperf module: :mod:`modperf.fast.plans` reads through it in a
process that imports neither numpy nor pathlib.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

#: Flags of every open of a cache file for reading: no symbolic link, and no blocking on a
#: FIFO planted at an entry's name (a regular file ignores O_NONBLOCK).
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
#: Mode bits that let someone other than the owner change a folder's names or a file's bytes.
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
#: Symbolic links followed on one path at most (the kernel's own limit is 40).
MAX_LINKS = 40

_said: set[str] = set()


def _uid() -> int | None:
    geteuid = getattr(os, "geteuid", None)
    return None if geteuid is None else geteuid()


def _owner_fix(path: str) -> str:
    return f"{path} is owned by another user (fix: use a folder of your own: set MODPERF_CACHE_DIR)"


def _judge(path: str, st: os.stat_result, uid: int, *, inside: bool) -> str | None:
    """What is wrong with one folder of the cache's path: ``inside`` for the cache folder and
    its subfolders (the user's own, not writable by others), else a folder above it (the
    user's or root's; writable by others only with the sticky bit)."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder (fix: remove it, or set MODPERF_CACHE_DIR to a folder)"
    if st.st_uid != uid and (inside or st.st_uid != 0):
        return _owner_fix(path)
    if st.st_mode & OTHERS_WRITE and (inside or not st.st_mode & stat.S_ISVTX):
        if inside:
            return f"{path} is writable by others (fix: chmod go-w {path})"
        return f"{path} is writable by others (fix: chmod go-w {path}, or set MODPERF_CACHE_DIR to a folder elsewhere)"
    return None


def _resolve(folder: str, uid: int) -> tuple[str | None, str | None, list[tuple[str, os.stat_result]]]:
    """(what is wrong with a link on the way, the real path of ``folder`` (None where it does
    not exist yet), every folder passed with its ``lstat``), walking the path as the kernel
    does."""
    path = folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)
    pending = path.split(os.sep)[::-1]  # names still to walk, the next one last
    current = os.sep
    passed = [(current, os.lstat(current))]
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":  # (current is a real path: its parent is the folder .. names)
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, name)
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            return None, None, passed  # the rest is made by make_folder, 0700
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (uid, 0):
                return (f"{step} is a symbolic link owned by another user (fix: use a folder of your own: "
                        f"set MODPERF_CACHE_DIR)"), None, passed
            links += 1
            if links > MAX_LINKS:
                return f"{folder} passes through more than {MAX_LINKS} symbolic links", None, passed
            target = os.readlink(step)
            if os.path.isabs(target):
                current = os.sep
            pending.extend(target.split(os.sep)[::-1])
            continue
        if not stat.S_ISDIR(st.st_mode):
            return _judge(step, st, uid, inside=False), None, passed
        passed.append((step, st))
        current = step
    return None, current, passed


def _verdict(folder: str, subfolders: Sequence[str], uid: int) -> str | None:
    try:
        found, real, passed = _resolve(folder, uid)
    except OSError as exc:
        return f"cannot inspect {exc.filename or folder}: {exc.strerror or exc}"
    for path, st in passed:  # (the folder itself is judged by the stricter rule below)
        found = found or (None if path == real else _judge(path, st, uid, inside=False))
    if found or real is None:
        return found
    found = _judge(real, dict(passed)[real], uid, inside=True)
    for name in subfolders:
        if found:
            break
        sub = os.path.join(real, name)
        try:
            st = os.lstat(sub)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"cannot inspect {sub}: {exc.strerror or exc}"
        if stat.S_ISLNK(st.st_mode):
            return f"{sub} is a symbolic link (fix: remove it; modperf makes the folder)"
        found = _judge(sub, st, uid, inside=True)
    return found


#: Each cache folder's verdict, once per process (by the folder as named, the working folder
#: where it is relative, and the subfolders judged).
_verdicts: dict[tuple[str, str, tuple[str, ...]], str | None] = {}


def folder_problem(folder: str, subfolders: Sequence[str] = ()) -> str | None:
    """What keeps the cache in ``folder`` from being trusted (module doc), or None where it
    can be: a few ``lstat`` calls, once per process."""
    uid = _uid()
    if uid is None:
        return None
    key = (folder, "" if os.path.isabs(folder) else os.getcwd(), tuple(subfolders))
    try:
        return _verdicts[key]
    except KeyError:
        found = _verdicts[key] = _verdict(folder, subfolders, uid)
        return found


def forget() -> None:
    """Judge every cache folder again (a test that changes a folder's mode within one process)."""
    _verdicts.clear()
    _said.clear()


def say_off(problem: str) -> None:
    """``cache off: PROBLEM`` on stderr, once per process and problem."""
    if problem in _said:
        return
    _said.add(problem)
    try:
        sys.stderr.write(f"cache off: {problem}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # (no stderr: the cache stays off all the same)
        pass


def file_problem(st: os.stat_result) -> str | None:
    """What keeps an opened cache file from being read (module doc), or None."""
    uid = _uid()
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if uid is not None and st.st_uid != uid:
        return "owned by another user"
    if uid is not None and st.st_mode & OTHERS_WRITE:
        return "writable by others"
    return None


def open_owned(path: str | os.PathLike[str]) -> int | None:
    """A descriptor of the cache file ``path`` opened for reading without following a link,
    where the opened file passes :func:`file_problem`; None otherwise (no such file, a link,
    another user's file, one others can write, or one that cannot be opened)."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError:
        return None
    try:
        if file_problem(os.fstat(fd)) is None:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_owned(path: str | os.PathLike[str]) -> bytearray | None:
    """The bytes of the cache file ``path`` (:func:`open_owned`'s rule), or None."""
    fd = open_owned(path)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        with open(fd, "rb", buffering=0, closefd=False) as f:
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
        view.release()
    except OSError:
        return None
    finally:
        os.close(fd)
    return buf if got == size else None


def make_folder(path: str | os.PathLike[str]) -> None:
    """Create the cache folder ``path`` (and any missing folder above it) with mode 0700, and
    check it; OSError (with what is wrong) where it is not a folder of the user's own that
    others cannot write."""
    path = os.fspath(path)
    missing = []
    probe = path
    while probe and not os.path.lexists(probe):
        missing.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # (made meanwhile: judged below like any folder found)
            os.mkdir(folder, 0o700)
    uid = _uid()
    if uid is None:
        return
    st = os.lstat(path)
    found = None
    if stat.S_ISLNK(st.st_mode):  # (a cache folder the user links elsewhere: judged where it leads)
        found = None if st.st_uid in (uid, 0) else f"{path} is a symbolic link owned by another user"
        st = os.stat(path)
    found = found or _judge(path, st, uid, inside=True)
    if found:
        raise PermissionError(f"not used: {found}")


__all__ = ["MAX_LINKS", "OTHERS_WRITE", "READ_FLAGS", "file_problem", "folder_problem", "forget", "make_folder",
           "open_owned", "read_owned", "say_off"]
