"""The hands-on exercises (lab/teach/handson): for every exercise the stub fails saying what is
missing, the reference passes, and every known wrong solution fails with a verdict naming its
mistake -- each run through the real check, in its child process, on the simulator (the GPU
variants are marked `gpu`). Bad input gets a one-line verdict and leaves the lab untouched: a
solution that does not import, raises, loops for ever, writes outside its scratch folder, or
calls the lab's own implementation. And the command line: list, show, check."""
import numpy as np
import pytest

import kernels
from lab.__main__ import main
from lab.teach import handson

EXERCISES = handson.EXERCISES
WRONG = [(n, m) for n, e in EXERCISES.items() for m in e.wrong]


def _check(name, solution, **kw):
    return handson.check(name, solution, echo=False, **kw)


def test_every_checklist_step_has_an_exercise():
    """Steps 1-10: the lecture's checklist; 11: beyond it (the case studies 003/004, `accept`)."""
    assert {e.step for e in EXERCISES.values()} == set(range(1, 12))
    assert [n for n, e in EXERCISES.items() if e.step == 11] == ["accept"]


def test_the_accept_check_s_mistake_models_start_from_the_lab_s_rule():
    """The accept check names a mistake by matching a flawed model of the rule; with no flaw the
    model must be the lab's own acceptance (kernels.draft.accept_twin) on every hand-made case,
    and each flaw must change the outcome of some case."""
    from lab.teach.handson import accept
    for case in accept.CASES:
        want = accept.expected(case, 128)
        got = accept.model_outcome(case, 128)
        assert got[0] == want[0] and all(map(np.array_equal, got[1:], want[1:])), case[0]
    for flaws, _ in accept.MISTAKES:
        assert any(accept.model_outcome(c, 128, **flaws)[0] != accept.expected(c, 128)[0]
                   for c in accept.CASES), flaws


@pytest.mark.parametrize("name", EXERCISES)
def test_the_stub_fails_saying_what_is_missing(name):
    ex = EXERCISES[name]
    res = _check(name, ex.solutions()["stub"])
    assert not res.passed
    assert ex.stub_says and ex.stub_says in res.message, res.message


@pytest.mark.parametrize("name", EXERCISES)
def test_the_reference_passes(name):
    res = _check(name, EXERCISES[name].solutions()["reference"])
    assert res.passed, res.message
    assert res.cases >= 2


@pytest.mark.parametrize("name,mistake", WRONG, ids=[f"{n}-{m}" for n, m in WRONG])
def test_each_known_wrong_solution_fails_naming_its_mistake(name, mistake):
    ex = EXERCISES[name]
    res = _check(name, ex.solutions()[mistake])
    assert not res.passed
    assert ex.wrong[mistake][1] in res.message, res.message


@pytest.mark.gpu
@pytest.mark.parametrize("name", EXERCISES)
def test_the_reference_passes_on_the_gpu(name):
    res = _check(name, EXERCISES[name].solutions()["reference"], backend="cuda")
    assert res.passed, res.message


@pytest.mark.gpu
@pytest.mark.parametrize("name", EXERCISES)
def test_the_stub_fails_on_the_gpu(name):
    assert not _check(name, EXERCISES[name].solutions()["stub"], backend="cuda").passed


# ---- bad input: one line, the lab untouched ------------------------------------------------------
def _file(tmp_path, text, name="solution.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_file_that_does_not_import(tmp_path):
    res = _check("prewarm", _file(tmp_path, "def pre_warm(engine):\n    return (\n"))
    assert not res.passed and "does not import: SyntaxError" in res.message
    assert "\n" not in res.line()


def test_a_solution_that_raises(tmp_path):
    res = _check("prewarm", _file(tmp_path, "def pre_warm(engine):\n    raise KeyError('oops')\n"))
    assert not res.passed and "pre_warm raised KeyError" in res.message


def test_a_solution_that_loops_for_ever_meets_the_time_limit(tmp_path):
    text = "def pre_warm(engine):\n    while True:\n        pass\n"
    res = _check("prewarm", _file(tmp_path, text), timeout_s=3)
    assert not res.passed and "did not finish within 3 s" in res.message


def test_a_write_outside_the_scratch_folder_is_refused(tmp_path):
    target = tmp_path / "outside" / "note.txt"
    target.parent.mkdir()
    text = f"def pre_warm(engine):\n    open({str(target)!r}, 'w').write('x')\n"
    res = _check("prewarm", _file(tmp_path, text))
    assert not res.passed and f"tried writing {target}" in res.message
    assert not target.exists()


def test_a_process_started_by_the_solution_is_refused(tmp_path):
    text = "import subprocess\ndef pre_warm(engine):\n    subprocess.run(['true'])\n"
    res = _check("prewarm", _file(tmp_path, text))
    assert not res.passed and "starting a process" in res.message


def test_the_lab_state_is_untouched(tmp_path):
    """A solution that defines kernels, mutates the lab's modules and exits: the parent's
    registry and modules are as they were."""
    import lab.plan
    before = (dict(kernels.REGISTRY), lab.plan.MAX_SPLITS)
    text = ("import kernels, lab.plan\nkernels.REGISTRY.clear()\nlab.plan.MAX_SPLITS = 1\n"
            + EXERCISES["advance"].reference)
    _check("advance", _file(tmp_path, text))      # whatever its verdict: the child's business
    res = _check("advance", _file(tmp_path, "import os\nos._exit(3)\n", "exits.py"))
    assert not res.passed and "exit code 3" in res.message
    assert (dict(kernels.REGISTRY), lab.plan.MAX_SPLITS) == before


def test_calling_the_lab_s_own_kernel_is_noticed(tmp_path):
    text = EXERCISES["advance"].reference.replace(
        "pos[0] += 1\n\n\n@kernel", "position.advance_twin(grid, block, pos)\n\n\n@kernel")
    text = "from kernels import position\n" + text
    res = _check("advance", _file(tmp_path, text))
    assert not res.passed and "kernels.position.advance_twin" in res.message


def test_a_notebook_namespace_is_a_solution():
    ns = {}
    exec(EXERCISES["prewarm"].reference, ns)
    assert _check("prewarm", ns).passed


# ---- the command line ----------------------------------------------------------------------------
def test_cli_list_names_every_step(capsys):
    assert main(["exercise", "list"]) == 0
    out = capsys.readouterr().out
    for e in EXERCISES.values():
        assert f"step {e.step:>2}  {e.name}" in out


def test_cli_show_and_check(tmp_path, capsys):
    assert main(["exercise", "show", "prewarm"]) == 0
    assert "def pre_warm(engine):" in capsys.readouterr().out
    assert main(["exercise", "show", "prewarm", "--stub"]) == 0
    assert capsys.readouterr().out.strip() == EXERCISES["prewarm"].stub.strip()
    path = _file(tmp_path, EXERCISES["prewarm"].reference)
    assert main(["exercise", "check", "prewarm", "--solution", path, "--backend", "sim"]) == 0
    assert "prewarm: PASS" in capsys.readouterr().out
    stub = _file(tmp_path, EXERCISES["prewarm"].stub, "stub.py")
    assert main(["exercise", "check", "prewarm", "--solution", stub, "--backend", "sim"]) == 1
    assert "prewarm: not yet" in capsys.readouterr().out


def test_cli_check_takes_a_path_relative_to_where_it_is_typed(tmp_path, capsys, monkeypatch):
    """The check's child runs in a scratch folder of its own: the solution's path is the
    student's, relative to where they typed it."""
    _file(tmp_path, EXERCISES["prewarm"].reference, "mine.py")
    monkeypatch.chdir(tmp_path)
    assert main(["exercise", "check", "prewarm", "--solution", "mine.py", "--backend", "sim"]) == 0
    assert "prewarm: PASS" in capsys.readouterr().out


def test_cli_bad_input_is_one_line(capsys):
    assert main(["exercise", "show", "nope"]) == 2
    assert "no exercise 'nope'" in capsys.readouterr().err
    assert main(["exercise", "check", "prewarm"]) == 2
    assert "give --solution FILE" in capsys.readouterr().err
    missing = ["exercise", "check", "prewarm", "--solution", "/no/such.py", "--backend", "sim"]
    assert main(missing) == 1
    assert "no such file" in capsys.readouterr().out


NOTEBOOK_OF = {"accept": "14_speculative_decoding.py"}   # beyond the checklist: its own notebook


def test_the_notebook_holds_every_stub_and_check():
    """notebooks/13_hands_on.py (or, for an exercise beyond the checklist, the notebook that
    teaches it): a stub cell per exercise, verbatim, and its check."""
    from scripts.build_notebooks import NB_DIR
    for name, ex in EXERCISES.items():
        text = (NB_DIR / NOTEBOOK_OF.get(name, "13_hands_on.py")).read_text()
        assert f'# %%\n{ex.stub.strip()}\n\n# %%\nresult = check("{name}", globals())' in text, name


def test_a_thread_left_running_does_not_hold_the_check(tmp_path):
    text = ("import threading, time\n"
            "def pre_warm(engine):\n"
            "    threading.Thread(target=lambda: time.sleep(3600)).start()\n")
    res = _check("prewarm", _file(tmp_path, text), timeout_s=30)
    assert not res.passed and "fell back to eager" in res.message


def test_aa_control_names_the_ids_only_mistake_whatever_the_skipped_rows_held(monkeypatch):
    """The uninitialised-cache fixture's two runs of A differ by what memory held: some memory
    flips a token id, some only the logits. When only the logits differ, comparing ids alone
    says A matches itself; the check must still name that mistake, not a generic one."""
    from lab.teach.handson import aa_control as ac
    from lab.teach.exercise import Fail

    ids = np.arange(4, dtype=np.int32)
    draws = iter(range(1000))

    def fake_run(backend, kv_init, graph, bugs=frozenset(), calls=None):
        def run():
            # the uninitialised cache: the same ids every run, logits that differ run to run
            logits = np.full(3, float(next(draws)) if kv_init == "empty" else 0.0, np.float32)
            out = (ids.copy(), logits)
            if calls is not None:
                calls.append(out)
            return out
        return run
    monkeypatch.setattr(ac, "_run", fake_run)
    monkeypatch.setattr(ac, "_truth", lambda backend, kv_init, bugs:
                        "broken" if kv_init == "empty" else "same")
    import types

    def module(src):
        mod = types.ModuleType("solution")
        exec(src, mod.__dict__)
        return mod
    with pytest.raises(Fail, match="compare the logits too"):
        list(ac.cases(module(ac.TOKENS_ONLY), "sim"))
    assert len(list(ac.cases(module(ac.REFERENCE), "sim"))) == \
        len(ac._FIXTURES) + len(list(ac._made_up("sim")))
    assert not ac._ids_only_differ_in_logits([(ids, np.zeros(2)), (ids, np.zeros(2))])
    assert not ac._ids_only_differ_in_logits([(ids, np.zeros(2))])


@pytest.mark.parametrize("name", EXERCISES)
def test_the_statement_and_stub_fit_a_notebook_page(name):
    """`exercise show` prints them as they are, and notebooks 13 and 14 show them: 100 columns."""
    ex = EXERCISES[name]
    wide = [line for line in (ex.statement + ex.stub).splitlines() if len(line) > 100]
    assert not wide, f"{name}: lines over 100 columns: {wide}"
