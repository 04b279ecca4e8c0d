"""Output files written whole or not at all, and output paths checked before a long run.

`atomic_write(path, write)` calls `write(tmp_path)` on a temporary file in the same folder and
renames it over `path` only when `write` returned: a kill or an error mid-write leaves the old
file (or none), never a truncated one. `check_output(path, kinds)` says, before any work, why a
path cannot be written (missing folder, one where a file cannot be created, unknown extension).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from lab.errors import LabError


def atomic_write(path, write: Callable[[Path], None]) -> Path:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix,
                               dir=path.parent if str(path.parent) else ".")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, _mode_for(path))   # mkstemp makes 0600: keep the old file's mode, or umask's
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_text(path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def plot_formats() -> set[str]:
    """File extensions matplotlib can save to here (png, pdf, svg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase
    return set(FigureCanvasBase.get_supported_filetypes())


def check_output(path, flag: str, kinds: set[str] | None = None) -> None:
    """Raise a LabError naming `flag` if `path` cannot be written (checked before the run)."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise LabError(f"{flag} {path}: is a folder, give a file name")
    if not folder.is_dir():
        raise LabError(f"{flag} {path}: folder {folder} does not exist")
    # try the write (a temporary file, removed at once) rather than ask os.access: for root it
    # says yes to folders no one can write, such as /proc
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".check", dir=folder)
    except OSError as exc:
        raise LabError(f"{flag} {path}: cannot create a file in folder {folder} "
                       f"({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(tmp)
    if kinds is not None and p.suffix.lstrip(".").lower() not in kinds:
        raise LabError(f"{flag} {path}: unknown file type {p.suffix or '(none)'}; use one of "
                       f"{', '.join(sorted(kinds))}")
