"""Output files are written whole or not at all, and output paths are checked before a run."""
import json
from pathlib import Path

import pytest

from lab.errors import LabError
from lab.files import atomic_write, atomic_write_text, check_output, plot_formats


def test_a_failure_mid_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "out.json"
    path.write_text(json.dumps({"old": True}))

    def half(tmp):
        tmp.write_text('{"new": tr')          # a partial write, then the process "dies"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half)
    assert json.loads(path.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_complete_write_replaces_the_file(tmp_path):
    path = atomic_write_text(tmp_path / "x.dot", "digraph {}")
    assert path.read_text() == "digraph {}"


@pytest.mark.parametrize("name,flag,kinds,needle", [
    ("missing/x.json", "--json", None, "does not exist"),
    ("x.xyz", "--plot", "plots", "unknown file type .xyz"),
    (".", "--json", None, "is a folder"),
])
def test_bad_output_paths(tmp_path, monkeypatch, name, flag, kinds, needle):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LabError, match=needle):
        check_output(name, flag, plot_formats() if kinds else None)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc")
def test_a_folder_that_takes_no_files_is_refused_even_for_root(tmp_path):
    """/proc: os.access says root may write there; creating a file says otherwise. The check
    tries it, and leaves nothing behind where it can write."""
    with pytest.raises(LabError, match=r"--json /proc/x.json: cannot create a file in folder"):
        check_output("/proc/x.json", "--json")
    check_output(tmp_path / "x.json", "--json")
    assert list(tmp_path.iterdir()) == []


def test_png_is_a_plot_format():
    assert {"png", "pdf", "svg"} <= plot_formats()


def test_a_written_file_keeps_the_mode_it_had_or_gets_the_umask_one(tmp_path):
    """A new file gets 0666 less the umask, as open() would give it; an overwritten one keeps
    its mode (the temporary file mkstemp makes is 0600)."""
    import os
    umask = os.umask(0o022)
    try:
        new = atomic_write_text(tmp_path / "new.json", "{}")
        assert new.stat().st_mode & 0o777 == 0o644
        new.chmod(0o640)
        atomic_write_text(new, "[]")
        assert new.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(umask)
