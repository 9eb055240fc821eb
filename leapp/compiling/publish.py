"""Building a bundle beside the old one and committing it in one step.

compile_graph() writes the new bundle into a staging directory next to the
bundle (same parent, so the same filesystem): `.leapp-<pid>-<random>-new.<graph>`.
Nothing in the bundle changes until commit(), which swaps the two directories
with one atomic rename (Linux renameat2(RENAME_EXCHANGE), macOS
renamex_np(RENAME_SWAP)); the old bundle, now at the staging path, is then
removed.  The bundle path stays the same; readers see the old bundle or the new
one, never a mix.  Where no swap exists (other systems, filesystems without
it) the old bundle is renamed aside and the new one renamed in; a crash
between the two renames leaves the old bundle in `.leapp-...-old.<graph>`,
and the next compile puts it back before anything else.

The staging directory's name carries the compiling process's id: the next
compile of the same graph removes leftovers of processes that no longer run
(a compile killed with SIGKILL).

Entries of the old bundle that no compile wrote (a user's notes, a nested
bundle, a model file a node references in place) are carried into the new
one as hard links (copies where links are refused); the old bundle's own files
(its YAML, PNG, view, analytics, initial values, log.txt and the models its YAML
names) are
not, so the bundle holds exactly the files of its latest compile.  Neither is
the old manifest of content keys (leapp/compiling/incremental.py): a compile writes its
own, and files it reuses from the old bundle it links in itself.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import re
import shutil
import stat
import sys
import tempfile
from typing import Any, Iterable


from .incremental import MANIFEST
from ..bundle.analytics import file_name as analytics_file
from ..bundle.log import logger
from ..bundle.modes import directory_mode, file_mode
from ..bundle.safe_load import load_yaml

STAGING_PREFIX = ".leapp-"
_STAGING_RE = re.compile(r"^\.leapp-(\d+)-[A-Za-z0-9_]+-(new|old)\.(.*)$", re.DOTALL)
# Graph names are cut to this many characters in staging names (NAME_MAX).
_NAME_KEEP = 64
# errno values that mean the disk (or the user's quota) is full.
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_FULL_TEXT = ("no space left on device", "disk quota exceeded", "file too large",
              "file write failed", "os error 28")


class BundleWriteError(OSError):
    """The new bundle could not be written (a full disk); the old one is unchanged."""


def bundle_owned(graph: str) -> set[str]:
    """Names a compile of graph writes into its bundle, whatever its nodes."""
    return {f"{graph}.yaml", f"{graph}.png", f"{graph}.html", analytics_file(graph),
            f"{graph}_initial_values.safetensors", "log.txt", MANIFEST}


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would terminate it on Windows
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _staged_for(parent: str, graph: str) -> list[tuple[str, int, str]]:
    """(path, pid, kind) of the staging directories of graph in parent."""
    found = []
    try:
        names = os.listdir(parent)
    except OSError:
        return found
    for name in names:
        match = _STAGING_RE.match(name)
        if match and match.group(3) == graph[:_NAME_KEEP]:
            found.append((os.path.join(parent, name), int(match.group(1)), match.group(2)))
    return found


def clean_stale(bundle: str, graph: str, live: Iterable[str] = ()) -> None:
    """Remove what compiles of graph that no longer run left beside the bundle.

    A crash between the two renames of the fallback commit left no bundle and
    the old one aside: it is put back first.
    """
    parent = os.path.dirname(bundle)
    live = set(live)
    stale = [(path, kind) for path, pid, kind in _staged_for(parent, graph)
             if path not in live and (pid == os.getpid() or not _pid_alive(pid))]
    if not os.path.lexists(bundle):
        backups = [path for path, kind in stale if kind == "old"]
        if backups:
            os.rename(backups[0], bundle)
            logger.warning("Restored the bundle %s from an interrupted compile", bundle)
            stale = [(p, k) for p, k in stale if p != backups[0]]
    for path, _ in stale:
        logger.info("Removing %s, left by an interrupted compile", path)
        shutil.rmtree(path, ignore_errors=True)


def check_same_filesystem(bundle: str) -> None:
    """Refuse a bundle directory that is a mount point: it cannot be swapped by rename."""
    try:
        own, parent = os.stat(bundle).st_dev, os.stat(os.path.dirname(bundle)).st_dev
    except OSError:
        return
    if own != parent:
        raise OSError(
            errno.EXDEV,
            f"The bundle directory {bundle} is a mount point (a different filesystem from "
            f"its parent). leapp builds a new bundle beside the old one and swaps them with "
            f"one rename, which cannot cross filesystems: mount the parent directory instead, "
            f"or pass a save_path inside the mount.")


def make_staging(bundle: str, graph: str, kind: str = "new") -> str:
    """A new empty directory beside bundle for graph's next bundle."""
    return tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-",
                            suffix=f"-{kind}.{graph[:_NAME_KEEP]}",
                            dir=os.path.dirname(bundle))


def finish_modes(staging: str, bundle: str, written: Iterable[str]) -> None:
    """Files the compile wrote get the umask's mode; the directory keeps the bundle's."""
    mode = file_mode()
    for name in written:
        path = os.path.join(staging, name)
        if os.path.isfile(path) and not os.path.islink(path):
            os.chmod(path, mode)
    try:
        mode = stat.S_IMODE(os.stat(bundle).st_mode)
    except OSError:
        mode = directory_mode()
    os.chmod(staging, mode)


def _referenced(bundle: str, graph: str) -> set[str]:
    """Top-level names the bundle's YAML refers to (models, their data, initial values)."""
    path = os.path.join(bundle, f"{graph}.yaml")
    if not os.path.isfile(path):  # the first compile into this bundle
        return set()
    try:  # the bounded safe reader (libyaml's safe loader where PyYAML has it)
        description = load_yaml(path)
    except (OSError, ValueError):  # missing, unreadable or refused: it names nothing
        return set()
    if not isinstance(description, dict):
        return set()
    names: set[str] = set()
    models = description.get("models")
    for entry in (models.values() if isinstance(models, dict) else ()):
        params = entry.get("parameters") if isinstance(entry, dict) else None
        if isinstance(params, dict):
            names |= inside(params.get("model_path"))
    pipeline = description.get("pipeline")
    if isinstance(pipeline, dict):
        names |= inside(pipeline.get("initial_values"))
    fused = description.get("fused")  # leapp.fuse's models (compile_graph(fuse=True))
    for entry in (fused.values() if isinstance(fused, dict) else ()):
        if isinstance(entry, dict):
            names |= inside(entry.get("model_path"))
    return names


def inside(path: Any) -> set[str]:
    """{name, name.data} when path is a plain file name, relative to the bundle, else {}."""
    if not isinstance(path, str) or not path or os.path.isabs(path):
        return set()
    normal = os.path.normpath(path)
    if normal.startswith(os.pardir) or os.sep in normal or normal == os.curdir:
        return set()
    return {normal, normal + ".data"}


def carry_foreign(bundle: str, staging: str, graph: str, keep: Iterable[str] = ()) -> None:
    """Link into staging what the old bundle holds that no compile of graph wrote.

    keep: top-level names the new YAML refers to in place (kept even when the old
    YAML referred to them too).
    """
    try:
        names = os.listdir(bundle)
    except FileNotFoundError:
        return
    keep = set(keep)
    owned = (bundle_owned(graph) | _referenced(bundle, graph)) - keep
    for name in names:
        if name in owned or name.startswith(STAGING_PREFIX):
            continue
        target = os.path.join(staging, name)
        if os.path.lexists(target):
            continue  # written by this compile
        source = os.path.join(bundle, name)
        if os.path.isdir(source) and not os.path.islink(source):
            shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(source, target)


def _link_or_copy(source: str, target: str) -> None:
    if os.path.islink(source):
        os.symlink(os.readlink(source), target)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


@functools.cache  # find_library runs ldconfig in a subprocess: once per process
def _swap_function() -> Any:
    """The libc call that swaps two paths atomically, with its flag; None if none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    if sys.platform.startswith("linux"):
        function = getattr(libc, "renameat2", None)
        if function is None:
            return None
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                             ctypes.c_uint]
        function.restype = ctypes.c_int
        at_fdcwd, rename_exchange = -100, 2
        return lambda a, b: function(at_fdcwd, a, at_fdcwd, b, rename_exchange)
    if sys.platform == "darwin":
        function = getattr(libc, "renamex_np", None)
        if function is None:
            return None
        function.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
        function.restype = ctypes.c_int
        rename_swap = 2
        return lambda a, b: function(a, b, rename_swap)
    return None


def exchange(first: str, second: str) -> bool:
    """Swap two directories in one atomic rename; False where the system cannot."""
    function = _swap_function()
    if function is None:
        return False
    if function(os.fsencode(first), os.fsencode(second)) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), first, None, second)


def commit(staging: str, bundle: str, graph: str) -> None:
    """Make staging the bundle in one step; the caller removes what is left at staging.

    After a swap the old bundle is at staging; after the fallback it is removed here.
    """
    if not os.path.lexists(bundle):
        os.rename(staging, bundle)
        return
    if exchange(staging, bundle):
        return
    # Fallback: two renames; a crash between them is repaired by clean_stale().
    aside = make_staging(bundle, graph, "old")
    os.rmdir(aside)
    os.rename(bundle, aside)
    try:
        os.rename(staging, bundle)
    except BaseException:
        os.rename(aside, bundle)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def disk_full(exc: BaseException) -> bool:
    """Whether exc (or what caused it) says the disk or quota is full."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL:
            return True
        text = str(current).lower()
        if any(marker in text for marker in _FULL_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


def full_disk_error(bundle: str, exc: BaseException) -> BundleWriteError:
    """The error compile_graph raises when the new bundle did not fit."""
    try:
        free = f"{shutil.disk_usage(os.path.dirname(bundle)).free} bytes free"
    except OSError:
        free = "free space unknown"
    error = BundleWriteError(
        errno.ENOSPC,
        f"Could not write the bundle {bundle}: no space left on device ({free}; the new "
        f"bundle is built beside the old one, so both must fit). The previous bundle is "
        f"unchanged. Cause: {type(exc).__name__}: {exc}")
    error.filename = bundle
    return error
