"""Every way `decode-lab` ends is one code of lab/exits.py's table (docs/cli.md), with one line on
stderr; a write that is cut short leaves no file behind for long (lab/files.py's journal).
In-process `main([...])` calls where they can be; three processes of their own for what only a
process shows: a closed output pipe, SIGTERM, and SIGKILL's leftovers."""
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import lab.__main__ as cli
from lab import exits, files
from lab.__main__ import main
from lab.errors import LabError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    """A state folder of this test's own, and a fresh journal of this process's writes."""
    folder = tmp_path / "state"
    monkeypatch.setenv("DECODE_LAB_STATE", str(folder))
    monkeypatch.setattr(files, "_JOURNAL", files._Journal())
    return folder


def _command(monkeypatch, effect):
    """`decode-lab demo` made to do `effect()` (return a code, or raise)."""
    monkeypatch.setattr(cli, "cmd_demo", lambda args: effect())
    return ["demo", "--backend", "sim"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _child(code: str, **kw) -> subprocess.Popen:
    """`python -c code` in this checkout; stdout buffered, as a user's is (no PYTHONUNBUFFERED)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update({"PYTHONPATH": str(ROOT), "DECODE_LAB_STUDENT": "exits", **kw.pop("env", {})})
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True, **kw)


def test_the_page_shows_the_table():
    """docs/cli.md has one row per code of lab/exits.py, and one line per code below it."""
    page = (ROOT / "docs" / "cli.md").read_text()
    assert [c for c, _, _ in exits.TABLE] == [0, 1, 2, 70, 130, 141, 143]
    for code, name, meaning in exits.TABLE:
        assert f"| {code} | {name} | {meaning} |" in page
        assert f"- **{code} {name}**:" in page


def test_done_is_0(monkeypatch, capsys):
    assert main(_command(monkeypatch, lambda: 0)) == exits.DONE
    assert capsys.readouterr().err == ""


def test_a_failing_selfcheck_is_a_finding(tmp_path, capsys):
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"q1": "a"}))
    assert main(["selfcheck", "--answers", str(answers), "--student", "exits",
                 "--attempts", str(tmp_path / "attempts.json")]) == exits.FINDING
    assert "score: " in capsys.readouterr().out


def test_a_kernel_fault_on_the_device_is_a_finding_in_one_line(capsys):
    """LAB_BUG_FLOAT_IDS=1 faults (an illegal address): a finding about the run, not bad input."""
    assert main(["compare", "--a", "LAB_BUG_FLOAT_IDS=1", "--b", "reference", "--tokens", "4",
                 "--backend", "sim"]) == exits.FINDING
    line = _one_line(capsys)
    assert line.startswith("decode-lab: device fault: an illegal memory access"), line


def test_bad_input_is_2_and_names_the_argument(capsys):
    assert main(["generate", "--prompt", "R", "--tokens", "0"]) == exits.BAD_INPUT
    assert _one_line(capsys) == "decode-lab: error: --tokens 0: give at least 1 token to generate"


def test_an_internal_error_is_70_naming_it_and_its_saved_traceback(monkeypatch, capsys, state):
    def bug():
        raise ZeroDivisionError("division by zero\nsecond line")
    assert main(_command(monkeypatch, bug)) == exits.INTERNAL
    line = _one_line(capsys)
    assert line.startswith("decode-lab: internal error: ZeroDivisionError: division by zero "
                           "(traceback saved in "), line
    saved = Path(line.split("traceback saved in ")[1].rstrip(")"))
    assert saved.parent == state / "crashes"
    text = saved.read_text()
    assert text.startswith("decode-lab demo --backend sim\n") and "in bug" in text


def test_a_lab_error_subclass_is_bad_input_and_nothing_else_is(monkeypatch, capsys):
    """No blanket handler: a KeyError deep in a command is the lab's fault (70), never exit 2."""
    def lookup():
        return {}["missing"]
    assert main(_command(monkeypatch, lookup)) == exits.INTERNAL
    assert "internal error: KeyError: 'missing'" in _one_line(capsys)


def test_ctrl_c_is_130(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt
    assert main(_command(monkeypatch, interrupted)) == exits.INTERRUPTED
    assert _one_line(capsys) == "decode-lab: interrupted"


def test_a_closed_output_pipe_is_141_in_one_line(state):
    """The reader of stdout went away before the output was flushed (as `selfcheck --help |
    head -1` when head is done first; the output is shorter than stdout's buffer, so the pipe
    breaks at the last flush): one line, no BrokenPipeError traceback."""
    read, write = os.pipe()
    os.close(read)
    child = _child("import sys; from lab.__main__ import main; "
                   "sys.exit(main(['selfcheck', '--help']))",
                   stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    _, err = child.communicate(timeout=60)
    assert child.returncode == exits.BROKEN_PIPE, err
    assert err == "decode-lab: output closed before the end (broken pipe)\n"


def test_sigterm_mid_write_is_143_and_leaves_the_old_file_and_no_temporary(tmp_path, state):
    """SIGTERM while a file is half written: the old file is intact, the temporary file and
    the journal are gone, one line says so."""
    target = tmp_path / "out.json"
    target.write_text("old")
    code = f"""
import sys, time
import lab.__main__ as cli
from lab.files import atomic_write

def slow(tmp):
    tmp.write_text("half")
    print("writing", flush=True)
    time.sleep(60)

cli.cmd_demo = lambda args: atomic_write({str(target)!r}, slow)
sys.exit(cli.main(["demo"]))
"""
    child = _child(code, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   env={"DECODE_LAB_STATE": str(state)})
    assert child.stdout.readline() == "writing\n"
    assert [p.name for p in (state / "journal").iterdir()] == [str(child.pid)]
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == exits.TERMINATED, err
    assert err == "decode-lab: terminated (SIGTERM)\n"
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.json", "state"]
    assert os.listdir(state / "journal") == []


def test_sigkill_leftovers_are_swept_by_the_next_run_and_a_live_ones_kept(tmp_path, state,
                                                                         monkeypatch):
    """A process killed mid-write leaves its temporary file; the next command removes it (its
    process is dead), not a running process's, and never a file that is not a temporary one."""
    target = tmp_path / "out.json"
    code = f"""
import time
from lab.files import atomic_write

def slow(tmp):
    tmp.write_text("half")
    print(tmp, flush=True)
    time.sleep(60)

atomic_write({str(target)!r}, slow)
"""
    child = _child(code, stdout=subprocess.PIPE, env={"DECODE_LAB_STATE": str(state)})
    tmp = Path(child.stdout.readline().strip())
    child.kill()
    child.wait(timeout=60)
    assert tmp.exists() and tmp.name.startswith(".out.json.")

    journal = state / "journal"
    alive = tmp_path / f".x.json.{os.getppid()}.0.tmp.json"      # a running process's write
    user = tmp_path / "notes.txt"                                 # named by a damaged journal
    for path in (alive, user):
        path.write_text("keep")
    (journal / str(os.getppid())).write_text(f"+ {alive}\n")
    with open(journal / str(child.pid), "a") as f:
        f.write(f"+ {user}\n")

    assert main(_command(monkeypatch, lambda: 0)) == exits.DONE
    assert not tmp.exists() and alive.exists() and user.exists()
    assert sorted(os.listdir(journal)) == [str(os.getppid())]


def test_a_full_disk_mid_write_leaves_the_old_file_and_names_it(tmp_path, state):
    path = tmp_path / "result.json"
    path.write_text("old")

    def full(tmp):
        tmp.write_text("ha")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(LabError, match=rf"^{path}: writing failed \(No space left on device\); "
                                       r"the file there is left as it was$") as info:
        files.atomic_write(path, full)
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC  # a cache skips it
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["result.json", "state"]
    assert files._outstanding(state / "journal" / str(os.getpid())) == set()


def test_a_write_is_journalled_while_it_lasts(tmp_path, state):
    seen = []

    def write(tmp):
        seen.append(files._outstanding(state / "journal" / str(os.getpid())))
        tmp.write_text("new")

    files.atomic_write_text(tmp_path / "a.txt", "x")
    files.atomic_write(tmp_path / "b.txt", write)
    assert [p.parent for p in seen[0]] == [tmp_path] and len(seen[0]) == 1
    assert files._outstanding(state / "journal" / str(os.getpid())) == set()


def test_a_journal_that_cannot_be_written_is_skipped(tmp_path, state):
    state.write_text("a file where the state folder should be")
    assert files.atomic_write_text(tmp_path / "out.txt", "ok").read_text() == "ok"
    assert files.sweep_leftovers() == []


def test_a_broken_pipe_that_is_not_the_output_is_an_internal_error(monkeypatch, capsys):
    """A pipe to a child process breaking is the lab's fault, not the reader going away."""
    def child_gone():
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
    assert main(_command(monkeypatch, child_gone)) == exits.INTERNAL
    assert "internal error: BrokenPipeError: [Errno 32] Broken pipe (traceback saved in " in \
        _one_line(capsys)


def test_a_traceback_goes_to_the_temporary_folder_when_the_state_folder_takes_none(
        tmp_path, monkeypatch, capsys, state):
    import tempfile
    state.write_text("a file where the state folder should be")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def bug():
        raise RuntimeError("boom")
    assert main(_command(monkeypatch, bug)) == exits.INTERNAL
    saved = Path(_one_line(capsys).split("traceback saved in ")[1].rstrip(")"))
    assert saved.parent == tmp_path and "RuntimeError: boom" in saved.read_text()


def test_a_forked_child_keeps_a_journal_of_its_own(tmp_path, state):
    """A child forked mid-run writes its own journal, and its exit leaves its parent's."""
    files._JOURNAL.add(tmp_path / ".a.json.1.0.tmp.json")
    pid = os.fork()
    if pid == 0:                                                   # the child
        ok = False
        try:
            files.atomic_write_text(tmp_path / "b.txt", "child")
            ok = (state / "journal" / str(os.getpid())).exists()
            files._JOURNAL.close()
        finally:
            os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert (tmp_path / "b.txt").read_text() == "child"
    assert os.listdir(state / "journal") == [str(os.getpid())]
    files._JOURNAL.close()                                         # the parent's own exit
    assert os.listdir(state / "journal") == []


def test_no_home_folder_fails_no_write(tmp_path, monkeypatch):
    """Without a home folder (HOME unset, no password entry) nothing is journalled: the write
    and the command go on."""
    monkeypatch.delenv("DECODE_LAB_STATE")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(
        RuntimeError("Could not determine home directory."))))
    assert files.atomic_write_text(tmp_path / "out.txt", "ok").read_text() == "ok"
    assert main(_command(monkeypatch, lambda: 0)) == exits.DONE
