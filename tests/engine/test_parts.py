"""The engine's three parts, each built without a DecodeEngine (lab/engine/devices.py, graph_cache.py,
issuer.py); the lint that no part reads another's private attributes; the files one replay runs
through, as docs/architecture.md lists them."""
import ast
import contextlib
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from lab.backend import Buffer, Collective, Launch, make_devices
from lab.config import LabConfig
from lab.errors import CaptureError, CollectiveError
from lab.ledger import CaptureFailure
from lab.engine.devices import Devices
from lab.engine.graph_cache import GraphCache
from lab.engine.issuer import Issuer
from lab.engine.ranks import RankStep, shard
from lab.engine.step import Step

ROOT = Path(__file__).resolve().parents[2]
SIM = LabConfig(backend="sim")


# ---- the devices -----------------------------------------------------------------------------
class _OwnBuffer(Step):
    @classmethod
    def own_buffers(cls, dev, model, cfg, kv_init):
        dev.draft = dev.backend.alloc("mine", (3,), np.int32)


def test_devices_allocate_what_the_step_declares(model):
    one = Devices(model, SIM, make_devices(SIM), Step)
    d = one[0]
    assert d.buf.counters is not None and d.counters and d.wqkv_views and d.draft is None
    assert d.buf.x_shard is None and len(d.buf.k_cache) == model.cfg.n_layer
    mine = Devices(model, SIM, make_devices(SIM), _OwnBuffer)[0]
    assert mine.draft.name == "mine" and mine.buf.counters is None    # its own, nothing else
    two = SIM.replace(ranks=2)
    ranked = Devices(model, two, make_devices(two), RankStep, shard=shard)
    assert len(ranked) == 2 and all(d.buf.counters is None and d.buf.x_shard for d in ranked)
    ranked.upload("pos", np.array([7], np.int32))
    assert [int(d.backend.download(d.buf.pos)[0]) for d in ranked] == [7, 7]


def test_devices_close_their_group_and_grow_scratch(model):
    closed = []
    group = make_devices(SIM)
    group.close = lambda: closed.append(True)
    devs = Devices(model, SIM, group, Step)
    old = devs[0].buf.part_o
    devs.alloc_scratch(2)
    assert devs.retired == [old, devs.retired[1]] and sorted(devs[0].partials) == [1, 2]
    devs.close()
    assert closed == [True]


# ---- the graph cache -------------------------------------------------------------------------
class _Graph:
    node_count = 3

    def __init__(self, name, refuse=None):
        self.name, self.refuse, self.launched, self.released = name, refuse, 0, False

    def launch(self):
        self.launched += 1

    def update(self, source):
        return self.refuse

    def release(self):
        self.released = True


def _plan(key):
    return SimpleNamespace(key=(key,))


def _cache(fail=(), refuse=None):
    calls = []

    def capture(plan, instantiate):
        calls.append((plan.key, instantiate))
        if plan.key in fail:
            return None, CaptureFailure(f"no {plan.key[0]}", "launch 0 (k)", 0)
        return _Graph(plan.key[0], refuse), None
    be = SimpleNamespace(instantiate=lambda src: _Graph("exec of " + src.name, src.refuse))
    return GraphCache([be], None, capture), calls


def test_graph_cache_captures_on_a_miss_replays_on_a_hit_and_falls_back():
    cache, calls = _cache(fail={("b",)})
    graph, outcome, _ = cache.get(_plan("a"), ("a",))
    assert outcome == "capture" and cache.get(_plan("a"), ("a",)) == (graph, "replay", "")
    assert cache.get(_plan("b"), ("b",)) == (None, "fallback", "no b")
    assert cache.get(_plan("b"), ("b",)) == (None, "fallback", "no b")   # never captured again
    assert calls == [(("a",), True), (("b",), True)]
    log = SimpleNamespace(record_replay=lambda key, nodes: calls.append((key, nodes)))
    cache.replay(graph, [log], ("a",))
    assert graph.launched == 1 and calls[-1] == (("a",), 3)
    assert set(cache.graphs) == {("a",)} and set(cache.failures) == {("b",)}
    cache.release()
    assert graph.released and not cache.graphs
    cache.drop()
    assert not cache.failures and cache.get(_plan("b"), ("b",))[1] == "fallback"


def test_graph_cache_updates_the_live_graph_or_instantiates_when_refused():
    cache, calls = _cache()
    live, outcome, _ = cache.get(_plan("a"), ("a",), update=True)
    assert outcome == "capture" and live.name == "exec of a"
    assert cache.get(_plan("b"), ("b",), update=True) == (live, "update", "")
    assert set(cache.graphs) == {("b",)}               # the live graph runs b now
    assert calls == [(("a",), False), (("b",), False)]   # kept captures, not instantiated
    refused, _ = _cache(refuse="another topology")
    refused.get(_plan("a"), ("a",), update=True)
    graph, outcome, note = refused.get(_plan("b"), ("b",), update=True)
    assert (graph.name, outcome, note) == ("exec of b", "capture", "update-refused: another topology")


class _Capturing:
    def __init__(self):
        self.open, self.events = False, []

    def begin_capture(self):
        self.open = True

    def is_capturing(self):
        return self.open

    def end_capture(self, instantiate=True):
        self.open = False
        self.events.append("end")
        raise CaptureError("invalidated by the first offence")

    def abort_capture(self):
        self.open = False
        self.events.append("abort")


def test_graph_cache_record_ends_a_failed_capture_and_lets_other_errors_through():
    be = _Capturing()
    cache = GraphCache([be], None, None)

    def fails(where):
        where[0], where[1] = "launch 2 (rmsnorm)", 2
        raise CaptureError("host-to-device copy")
    graph, failure = cache.record(fails)
    assert graph is None and not be.open and be.events == ["end"]
    assert (failure.reason, failure.shown_at, failure.launch_index) == (
        "invalidated by the first offence", "launch 2 (rmsnorm)", 2)

    def breaks(where):
        raise RuntimeError("a bug in the step")
    with pytest.raises(RuntimeError):
        cache.record(breaks)
    assert not be.open and be.events[-1] == "abort"


# ---- the issuer ------------------------------------------------------------------------------
def _buf(name):
    return Buffer(name, 0, (4,), np.dtype(np.float32))


class _Backend:
    def __init__(self, rank, events):
        self.rank, self.events = rank, events

    def issue(self, item):
        self.events.append((self.rank, item.name))

    def collective(self, coll):
        self.events.append((self.rank, "coll " + coll.op))


class _Pieces:
    rebuilt_each_step = False

    def __init__(self, items):
        self.built, self.list = 0, items

    def items(self, plan):
        self.built += 1
        yield from self.list


def _group(events, simulated=True):
    @contextlib.contextmanager
    def collectives():
        events.append("group")
        yield
        events.append("/group")
    return SimpleNamespace(collectives=collectives, simulated=simulated)


def _launch(name):
    return Launch(SimpleNamespace(name=name), (1,), (1,), ())


def test_issuer_issues_ranks_in_lockstep_with_the_collectives_grouped():
    events = []
    x = _buf("x")
    pieces = [_Pieces([_launch(f"k{r}"), Collective("all_reduce", x, x), _launch(f"m{r}")])
              for r in range(2)]
    issuer = Issuer([_Backend(r, events) for r in range(2)], _group(events), pieces)
    plan = SimpleNamespace(key=("p",), position=0)
    issuer.issue_step(plan)
    issuer.issue_step(plan)
    assert events[:7] == [(0, "k0"), (1, "k1"), "group", (0, "coll all_reduce"),
                          (1, "coll all_reduce"), "/group", (0, "m0")]
    assert events[7] == (1, "m1") and len(events) == 16 and issuer.collectives_issued == 4
    assert [p.built for p in pieces] == [1, 1]           # built once per plan key


def test_issuer_refuses_mismatched_collectives_on_a_gpu_group_before_issuing():
    events = []
    x = _buf("x")
    pieces = [_Pieces([_launch("k"), Collective("all_reduce", x, x)]), _Pieces([_launch("k")])]
    issuer = Issuer([_Backend(r, events) for r in range(2)], _group(events, False), pieces)
    plan = SimpleNamespace(key=("p",), position=5)
    with pytest.raises(CollectiveError, match="collective #0 differs across ranks at position 5"):
        issuer.issue_step(plan)
    assert events == []


# ---- no part reads another's private attributes ----------------------------------------------
def private_reads(folder: Path, root: Path = ROOT) -> list[str]:
    """file:line of every `x._name` (not a dunder) where x is not `self` or `cls`."""
    hits = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                hits.append(f"{path.relative_to(root)}:{node.lineno} .{node.attr}")
    return hits


def test_no_engine_part_reads_another_parts_private_attributes(tmp_path):
    assert private_reads(ROOT / "lab" / "engine") == []
    (tmp_path / "bad.py").write_text("def f(eng, self):\n    return eng.issuer._built, self._ok\n")
    assert private_reads(tmp_path, tmp_path) == ["bad.py:2 ._built"]


# ---- the files one replay runs through -------------------------------------------------------
def replay_files(eng) -> list[str]:
    """The repository's lab/ files one replayed step of `eng` runs through, in first-call order."""
    eng.reset(eng.encode("ROMEO.\n"), 4)
    eng.step()                                 # the capture
    seen: dict[str, None] = {}

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if ROOT / "lab" in path.parents:
                seen.setdefault(str(path.relative_to(ROOT)), None)
    sys.setprofile(profile)
    try:
        entry = eng.step()
    finally:
        sys.setprofile(None)
    assert entry.outcome == "replay"
    return list(seen)


def documented_files(backend: str) -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(rf"<!-- replay-files:{backend} -->\n(.*?)<!-- /replay-files -->", text, re.S)
    assert block, f"docs/architecture.md has no replay-files:{backend} block"
    return [line[2:].strip() for line in block.group(1).splitlines() if line.startswith("- ")]


def _check_replay(eng, backend):
    files = replay_files(eng)
    engine = [f for f in files if f.startswith("lab/engine/")]
    assert len(engine) <= 5, engine
    assert sorted(files) == sorted(documented_files(backend)), files


def test_one_replay_on_the_simulator_runs_through_the_documented_files(model):
    from lab import DecodeEngine
    _check_replay(DecodeEngine(model, SIM), "sim")


@pytest.mark.gpu
def test_one_replay_on_a_gpu_runs_through_the_documented_files(model, cuda_cfg):
    from lab import DecodeEngine
    _check_replay(DecodeEngine(model, cuda_cfg), "cuda")
