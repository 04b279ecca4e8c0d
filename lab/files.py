"""Output files written whole or not at all, and output paths checked before a long run.

`atomic_write(path, write)` calls `write(tmp_path)` on a temporary file in the same folder and
renames it over `path` only when `write` returned: a kill or an error mid-write leaves the old
file (or none), never a truncated one. An OSError mid-write (a full disk, ENOSPC) is a
WriteFailed (a LabError, and an OSError) naming the file and saying the old one is left as it
was. `check_output(path, kinds)` says, before any work, why a path cannot be written (missing
folder, one where a file cannot be created, unknown extension).

The journal: each temporary file is recorded, before it is created, in a per-process file
`<state folder>/journal/<pid>` (lab.config.state_folder()), as a `+ path` line, and a `- path`
line once it is renamed or removed. Temporary files still open when the process exits normally
(or on SIGTERM, through lab/exits.py) are removed then; `sweep_leftovers()`, called at the start
of each command, removes those of processes that died without that (SIGKILL), never a live
process's. A journal that cannot be written is skipped: it never makes a write fail.
"""
from __future__ import annotations

import atexit
import os
import secrets
import tempfile
from pathlib import Path
from typing import Callable

from lab.config import state_folder
from lab.errors import LabError, WriteFailed

_TMP_MARK = ".tmp"          # every temporary file is `.<name>.<pid>.<random>.tmp<suffix>`


def atomic_write(path, write: Callable[[Path], None]) -> Path:
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    tmp = folder / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_MARK}{path.suffix}"
    _JOURNAL.add(tmp)                      # recorded before it exists: no window without a record
    try:
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            write(tmp)
            os.chmod(tmp, _mode_for(path))   # created 0600: keep the old file's mode, or umask's
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except WriteFailed:
        raise
    except OSError as exc:
        left = "the file there is left as it was" if path.exists() else "no file was written"
        raise WriteFailed(f"{path}: writing failed ({exc.strerror or exc}); {left}", exc.errno,
                          exc.strerror) from exc
    finally:
        _JOURNAL.done(tmp)
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


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user's counts: it is not ours to judge)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _outstanding(journal: Path) -> set[Path]:
    """The temporary files a journal lists as created and not yet renamed or removed."""
    live = set()
    for line in journal.read_text(errors="replace").splitlines():
        sign, _, name = line.partition(" ")
        if sign == "+":
            live.add(Path(name))
        elif sign == "-":
            live.discard(Path(name))
    return live


def _is_temporary(path: Path) -> bool:
    """Only a name atomic_write makes is ever removed (a damaged journal names no user file)."""
    return path.is_absolute() and path.name.startswith(".") and _TMP_MARK in path.name


class _Journal:
    """This process's record of its temporary files (see the module's docstring)."""

    def __init__(self):
        self.pid = os.getpid()
        self.open: set[Path] = set()
        self.file: Path | None = None
        self.broken = False

    def _log(self, line: str) -> None:
        if self.pid != os.getpid():        # a forked child: a journal of its own
            self.__init__()
        if self.broken:
            return
        try:
            if self.file is None:
                folder = state_folder() / "journal"
                folder.mkdir(parents=True, exist_ok=True)
                self.file = folder / str(os.getpid())
                atexit.register(self.close)
            with open(self.file, "a") as f:
                f.write(line + "\n")
        except (OSError, RuntimeError):    # RuntimeError: no home folder to be found
            self.broken = True             # skipped: the journal never makes a write fail

    def add(self, tmp: Path) -> None:
        tmp = Path(os.path.abspath(tmp))
        self._log(f"+ {tmp}")
        self.open.add(tmp)

    def done(self, tmp: Path) -> None:
        tmp = Path(os.path.abspath(tmp))
        self._log(f"- {tmp}")
        self.open.discard(tmp)

    def close(self) -> None:
        """At exit: remove the temporary files still open (and any the journal file lists: a
        dead process with this pid may have started it), then the journal; a forked child that
        exits leaves its parent's alone."""
        if self.pid != os.getpid():
            return
        leftovers = set(self.open)
        if self.file is not None:
            try:
                leftovers |= {p for p in _outstanding(self.file) if _is_temporary(p)}
            except OSError:
                pass
        for tmp in leftovers:
            _remove(tmp)
        self.open.clear()
        if self.file is not None:
            _remove(self.file)
            self.file = None


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


_JOURNAL = _Journal()


def sweep_leftovers() -> list[Path]:
    """Remove the temporary files of processes that died mid-write (their journals say which),
    and those journals; a live process's are left alone. Returns the files removed."""
    removed = []
    try:
        journals = [p for p in (state_folder() / "journal").iterdir() if p.name.isdigit()]
    except (OSError, RuntimeError):
        return removed
    for journal in journals:
        pid = int(journal.name)
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            leftovers = _outstanding(journal)
        except OSError:
            continue
        for tmp in sorted(leftovers):
            if _is_temporary(tmp) and tmp.exists():
                _remove(tmp)
                removed.append(tmp)
        _remove(journal)
    return removed


# ---- outputs that would overwrite inputs ---------------------------------------------------------
LAB_DATA = Path(__file__).resolve().parent.parent / "data"   # every file under it, the lab reads


def _identity(path) -> tuple[Path, tuple[int, int] | None]:
    """A path's resolved form (symlinks and `..` followed) and, when it exists, its device and
    inode (a hard link is another name of the same inode)."""
    p = Path(path)
    try:
        st = p.stat()
        inode = (st.st_dev, st.st_ino)
    except OSError:
        inode = None
    return p.resolve(), inode


def _same(a, b) -> bool:
    ra, ia = a
    rb, ib = b
    return ra == rb or (ia is not None and ia == ib)


def lab_files() -> list[Path]:
    """The files the lab reads: everything under data/ (weights and their description, the
    corpus, the cost files, the GPU recordings conformance reads)."""
    return sorted(p for p in LAB_DATA.rglob("*") if p.is_file())


NAME_MAX, PATH_MAX = 255, 4095      # the limits of Linux's file systems (a longer one: ENAMETOOLONG)


def refuse_empty(paths: dict[str, object]) -> None:
    """A LabError naming the first flag given an empty path (`--weights ""`: never read as the
    default, never skipped), or one no file system takes (a NUL, a name past NAME_MAX bytes)."""
    for flag, path in paths.items():
        if path is None:
            continue
        text = str(path)
        if not text.strip():
            raise LabError(f"{flag} {text!r}: an empty path; give a file name, or leave "
                           f"{flag} out")
        if "\0" in text:
            raise LabError(f"{flag} {text!r}: a path cannot hold a NUL character")
        longest = max((len(part.encode(errors="surrogateescape")) for part in Path(text).parts),
                      default=0)
        if longest > NAME_MAX or len(text.encode(errors="surrogateescape")) > PATH_MAX:
            raise LabError(f"{flag} {text[:40]!r}...: a path past what file systems take "
                           f"({NAME_MAX} bytes a name, {PATH_MAX} in all)")


def refuse_overlap(outputs: dict[str, object], inputs: dict[str, object] | None = None) -> None:
    """Before any work: a LabError (one line naming both) when an output path (flag -> path;
    None: not given) is one of `inputs` (flag -> path), a file the lab reads (lab_files), or
    another of `outputs`. Paths are compared resolved (symlinks, `data/../data/x`) and by inode
    (hard links). An empty path, output or input, is refused too."""
    outputs = {f: p for f, p in outputs.items() if p is not None}
    inputs = {f: p for f, p in (inputs or {}).items() if p is not None}
    refuse_empty({**inputs, **outputs})
    outs = [(flag, path, _identity(path)) for flag, path in outputs.items()]
    read = [(p, _identity(p)) for p in lab_files()]
    for i, (flag, path, ident) in enumerate(outs):
        for flag2, path2, ident2 in outs[:i]:
            if _same(ident, ident2):
                raise LabError(f"{flag} {path} and {flag2} {path2} name one file: give each "
                               f"output a path of its own")
        for flag2, path2 in inputs.items():
            if _same(ident, _identity(path2)):
                raise LabError(f"{flag} {path} is {flag2} {_shown(path2)}, which this command "
                               f"reads: write the output elsewhere")
        for lab_file, lab_ident in read:
            if _same(ident, lab_ident):
                raise LabError(f"{flag} {path} is {_shown(lab_file)}, a file the lab reads: "
                               f"write the output elsewhere")


def refuse_folder_over(flag: str, folder, inputs: dict[str, object] | None = None) -> None:
    """A LabError when output folder `folder` is, or holds, a file the lab reads or one of
    `inputs` (flag -> path): replacing the folder would delete it."""
    refuse_empty({flag: folder})
    top = Path(folder).resolve()
    named = [(f, Path(p)) for f, p in (inputs or {}).items() if p is not None]
    for what, path in named + [(None, p) for p in lab_files()]:
        if path.exists() and (path.resolve() == top or top in path.resolve().parents):
            whose = f"{what} {_shown(path)}" if what else f"{_shown(path)}, a file the lab reads,"
            raise LabError(f"{flag} {folder} holds {whose} and would be replaced: give a "
                           f"folder of its own")


def _shown(path: Path) -> str:
    """`path` as data/..., relative to the repository, when it is under data/."""
    try:
        return str(Path("data") / Path(path).resolve().relative_to(LAB_DATA))
    except ValueError:
        return str(path)
