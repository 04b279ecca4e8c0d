"""The megakernel's counter protocol (kernels/persistent.py), device-free and fast: a Python model
of a launch whose blocks are `block_program` generators (the kernel's items, waits and bumps, in
its loops' order), run under adversarial block orders.

The model's memory holds, per cell, a value and a version. An item checks the version of every
cell it reads (the version its phase and layer must see: an older one is data not yet written, a
newer one data already overwritten) and writes a value mixed from what it read, so the launch's
outputs are a digest of every read. The counts are int32 (they
wrap) and, as in the kernel's epoch exit (a variant, modelled first here; the default kernel's
arrive exit is run by test_the_arrive_variant_gives_the_same_outputs and the starved-block
cases), never reset: a block reads the launch count
E when it first runs and waits for E launches' adds plus its target; the grid's last block picks
the token once every logit is counted and advances pos and E. It holds that:
  - under fair orders (forward, reversed, random seeds, bursts) every read sees completed data,
    no wait gives up, and the outputs are the same bits for every order and every grid size >= 1
    (up to more blocks than items);
  - after each launch the counts are E launches' adds (`settled`), so launches replay back to
    back with no reset, across the int32 wraparound too; no block with an item reads a pos or
    an E already advanced;
  - a block starved until the others spin out ends the launch anyway (no deadlock), with the
    error word naming a wait; a read of incomplete data happens only when the error word is
    set; the host's reset (the counter zeroed) makes the next launch clean;
  - a protocol with one wait's target lowered is caught (the model has teeth);
  - the arrive exit (a variant: arrive_last elects the picker, which zeroes the counts) holds
    the same under fair orders;
  - the tails variants (the slice that completes its head's count merges the head; the output
    projection waits for every merged head) read complete data in every order, write the same
    bits for every grid and zero the counts; a lowered wait there is caught too.
Marked `gpu` (skipped without one): the real kernel on the device, bits stable over replays and
grid sizes, the error word set when a wait is made impossible (kernels.check's op persistent).
"""
import itertools
import random

import numpy as np
import pytest

from kernels import persistent as P

TINY = dict(n_layer=2, D=8, F=12, V=5, n_head=2, head_dim=4, splits=3)
MODEL = dict(n_layer=4, D=256, F=512, V=77, n_head=4, head_dim=64, splits=2)
MASK = (1 << 61) - 1


def _mix(*parts) -> int:
    h = 0x2545F4914F6CDD1D
    for v in parts:
        h = ((h ^ (int(v) & MASK)) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & MASK
    return h


class Memory:
    """The step's buffers as cells: values and versions; `bad` lists the reads that saw a wrong
    version (phase, layer, item, buffer)."""

    def __init__(self, c, pos, tails=False):
        D, H, half = c["D"], c["n_head"], c["head_dim"] // 2
        self.c, self.pos, self.tails = c, pos, tails
        self.coef = np.array([_mix(i) for i in range(max(D, c["F"], 3 * D, 64))], np.uint64)
        self.val = {"emb": np.array([_mix(pos, i) for i in range(D)], np.uint64)}
        self.ver = {}
        for name, n in (("x", D), ("qkv", 3 * (D // 2)), ("part", H * c["splits"]),
                        ("o", H), ("act", c["F"]), ("logits", c["V"])):
            self.val[name] = np.zeros(n, np.uint64)
            self.ver[name] = np.zeros(n, np.int64)
        self.head_of = (np.arange(3 * (D // 2)) % (D // 2)) // half
        self.bad = []
        self.token = None

    def read(self, name, want, where, idx=None):
        ver = self.ver.get(name)
        if ver is not None:
            seen = ver if idx is None else ver[idx]
            if np.any(seen != want):
                self.bad.append((*where, name))
        v = self.val[name] if idx is None else self.val[name][idx]
        return int(np.dot(np.atleast_1d(v), self.coef[:np.size(v)]) & np.uint64(MASK))

    def write(self, name, i, value, version):
        self.val[name][i] = np.uint64(value & MASK)
        self.ver[name][i] = version

    def item(self, phase, layer, i):
        """Item i of `phase` at `layer`: its reads (with the versions it must see), its write."""
        where = (phase, layer, i)
        L = self.c["n_layer"]
        xin = ("emb", 0) if layer == 0 else ("x", 2 * layer)
        if phase == 0:                    # a qkv pair: all of x
            d = self.read(*xin, where)
            self.write("qkv", i, _mix(0, layer, i, d), layer + 1)
        elif phase == 1:                  # attention (h, s): head h's q, k and v pairs
            h = i // self.c["splits"]
            d = self.read("qkv", layer + 1, where, np.flatnonzero(self.head_of == h))
            self.write("part", i, _mix(1, layer, i, d), layer + 1)
        elif phase == 2:                  # out proj row i: every partial (every merged head
            d = self.read("o" if self.tails else "part", layer + 1, where)   # in tails), x[i]
            r = self.read(xin[0], xin[1], where, [i])
            self.write("x", i, _mix(2, layer, i, d, r), 2 * layer + 1)
        elif phase == 3:                  # mlp row i: all of x
            d = self.read("x", 2 * layer + 1, where)
            self.write("act", i, _mix(3, layer, i, d), layer + 1)
        elif phase == 4:                  # down row i: all of act, x[i]
            d = self.read("act", layer + 1, where)
            r = self.read("x", 2 * layer + 1, where, [i])
            self.write("x", i, _mix(4, layer, i, d, r), 2 * layer + 2)
        else:                             # LM head row i: all of x after the last layer
            d = self.read("x", 2 * L, where)
            self.write("logits", i, _mix(5, i, d), 1)

    def merge(self, layer, h):
        """The tails variants' merge of head h: every slice of the head, its merged output."""
        S = self.c["splits"]
        d = self.read("part", layer + 1, ("merge", layer, h), np.arange(h * S, (h + 1) * S))
        self.write("o", h, _mix(6, layer, h, d), layer + 1)

    def outputs(self):
        return (self.val["x"].tobytes(), self.val["logits"].tobytes(), self.token)


def wrap(v):
    return P.wrap32(int(v))


def give_up(counter, code, rule="smallest"):
    """A wait stops waiting: the kernel's record_give_up (the word keeps the smallest code), or
    rule "first" (the word keeps the first code written: the kernel's rule before it)."""
    word = counter[P.SLOT_ERR]
    if word == 0 or (rule == "smallest" and code < word):
        counter[P.SLOT_ERR] = code


def block(mem, counter, b, G, read_pos, program, spin_limit, give_up_every, adds,
          rule="smallest"):
    """Block b as a generator: one yield per poll, item, bump or exit (a point where another
    block may run)."""
    read_pos[b] = True                   # every block reads pos and E first
    seen_pos, epoch = mem.pos, int(counter[P.SLOT_EPOCH])
    yield
    for op in program(b, G):
        if op[0] == "wait":
            _, slot, target, code = op
            base = epoch * int(adds[slot])
            polls = 0
            while wrap(counter[slot] - base) < target:
                polls += 1
                if polls >= spin_limit or (polls % give_up_every == 0
                                           and counter[P.SLOT_ERR] != 0):
                    give_up(counter, code, rule)
                    break
                yield
        elif op[0] == "item":
            if seen_pos != mem.pos:          # this block read pos after the pick advanced it
                mem.bad.append((*op[1:], "pos"))
            mem.item(*op[1:])
            yield
        elif op[0] == "bump":
            counter[op[1]] = wrap(counter[op[1]] + op[2])
            yield
        elif op[0] == "arrive":          # tails: count in; the one that completes it merges
            _, slot, whole, (_, layer, h) = op
            old = counter[slot]
            counter[slot] = wrap(old + 1)
            yield
            if wrap(old) == wrap(whole - 1):
                mem.merge(layer, h)
                yield
                counter[P.SLOT_PART] = wrap(counter[P.SLOT_PART] + 1)
                yield
        elif op[0] == "pick":            # the epoch exit: every logit counted (or given up)
            mem.token = mem.read("logits", 1, ("pick", 0, 0))
            mem.pos += 1
            counter[P.SLOT_EPOCH] = wrap(epoch + 1)
            yield
        else:                            # exit: arrive_last; the last picks, advances, resets
            arrived = counter[P.SLOT_EXIT]
            counter[P.SLOT_EXIT] += 1
            if arrived == G - 1:
                counter[P.SLOT_EXIT] = 0
                assert all(read_pos), "pos advanced before every block read it"
                mem.token = mem.read("logits", 1, ("exit", 0, 0))
                mem.pos += 1
                counter[P.SLOT_EXIT + 1:] = 0
            yield


def launch(c, G, order, counter, pos=0, seed=0, victim=None, spin_limit=100_000,
           give_up_every=P.GIVE_UP_EVERY, program=None, epochs=True, rule="smallest",
           tails=False):
    """One launch of G blocks in `order`; returns its Memory (counter is updated in place)."""
    mem = Memory(c, pos, tails)
    read_pos = [False] * G
    prog = program or (lambda b, g: P.block_program(b, g, **c, epochs=epochs, tails=tails))
    adds = adds_of(c) if epochs else np.zeros(P.counter_slots(c["n_head"]), np.int64)
    gens = {b: block(mem, counter, b, G, read_pos, prog, spin_limit, give_up_every, adds, rule)
            for b in range(G)}
    rng = random.Random(seed)

    def step(b):
        try:
            next(gens[b])
        except StopIteration:
            del gens[b]

    while gens:
        alive = sorted(gens)
        if victim is not None and len(alive) > 1 and victim in alive:
            alive.remove(victim)         # starved until every other block is done
        if order == "forward":
            for b in alive:
                step(b)
        elif order == "reversed":
            for b in reversed(alive):
                step(b)
        elif order == "random":
            step(rng.choice(alive))
        elif order == "bursts":          # a block runs several operations at once
            b = rng.choice(alive)
            for _ in range(rng.randint(1, 40)):
                if b in gens:
                    step(b)
        else:
            raise ValueError(order)
    return mem


def clean_counter(c):
    return np.zeros(P.counter_slots(c["n_head"]), np.int64)


def adds_of(c):
    return P.launch_adds(c["n_layer"], c["D"], c["F"], c["V"], c["n_head"], c["head_dim"])


def settled(counter, c):
    return P.settled(counter, adds_of(c))


@pytest.fixture(scope="module")
def reference():
    """Two launches back to back of one block in order (numba's simulator's run)."""
    counter = clean_counter(TINY)
    first = launch(TINY, 1, "forward", counter)
    second = launch(TINY, 1, "forward", counter, pos=1)
    assert not first.bad and not second.bad and settled(counter, TINY)
    assert counter[P.SLOT_EPOCH] == 2
    return first.outputs(), second.outputs()


GRIDS = [1, 2, 3, 4, 5, 7, 8, 13, 25, 64]        # up to more blocks than any phase has items
ORDERS = [("forward", 0), ("reversed", 0), ("random", 1), ("random", 2), ("bursts", 3)]


@pytest.mark.parametrize("G", GRIDS)
def test_every_order_reads_complete_data_and_writes_the_same_bits(reference, G):
    for order, seed in ORDERS:
        counter = clean_counter(TINY)
        for pos in (0, 1):               # a replay: the counts the first launch left, unreset
            mem = launch(TINY, G, order, counter, pos=pos, seed=seed + G)
            assert counter[P.SLOT_ERR] == 0, (order, G, P.describe_wait(int(counter[0])))
            assert not mem.bad, (order, G, mem.bad[:3])
            assert settled(counter, TINY), (order, G, counter)
            assert mem.outputs() == reference[pos], (order, G, pos)


@pytest.mark.parametrize("G", [1, 3, 13])
def test_the_arrive_exit_reads_complete_data_and_zeroes_the_counts(reference, G):
    """The arrive variant (no epochs: the last to arrive picks and zeroes): the same outputs."""
    for order, seed in ORDERS:
        counter = clean_counter(TINY)
        for pos in (0, 1):
            mem = launch(TINY, G, order, counter, pos=pos, seed=seed + G, epochs=False)
            assert counter[P.SLOT_ERR] == 0 and not mem.bad and not counter.any(), (order, G)
            assert mem.outputs() == reference[pos], (order, G, pos)


@pytest.mark.parametrize("G", [1, 3, 13, 64])
def test_the_tails_variant_reads_complete_data_and_zeroes_the_counts(G):
    """The tails variants (arrive exit; the slice that completes its head's count merges the
    head, the output projection waits for every merged head): complete reads in every order,
    the same outputs as one block in order, the counts back to 0, two launches back to back."""
    ref, counter = [], clean_counter(TINY)
    for pos in (0, 1):
        ref.append(launch(TINY, 1, "forward", counter, pos=pos, epochs=False,
                          tails=True).outputs())
    for order, seed in ORDERS:
        counter = clean_counter(TINY)
        for pos in (0, 1):
            mem = launch(TINY, G, order, counter, pos=pos, seed=seed + G, epochs=False,
                         tails=True)
            assert counter[P.SLOT_ERR] == 0 and not mem.bad and not counter.any(), (order, G)
            assert mem.outputs() == ref[pos], (order, G, pos)


def test_the_tails_model_sized_protocol_and_its_teeth():
    """The model's dims on 132 blocks: complete reads, counts back to 0; the output
    projection's wait lowered by one merged head reads a head before it is merged in some
    order, with no error word."""
    counter = clean_counter(MODEL)
    mem = launch(MODEL, 132, "random", counter, seed=3, epochs=False, tails=True)
    assert counter[P.SLOT_ERR] == 0 and not mem.bad and not counter.any()
    assert lowered_part_wait_is_caught(epochs=False, tails=True)


@pytest.mark.parametrize("G", [1, 5, 13])
def test_launches_of_changing_split_counts_replay_with_no_reset(G):
    """The plan (split count) changes from launch to launch, as at the plan boundaries of a
    decode: the counts stay whole launches' (the picker's top-up), every read complete."""
    counter = clean_counter(TINY)
    for n, splits in enumerate((3, 1, 4, 2, 3)):
        c = dict(TINY, splits=splits)
        mem = launch(c, G, "random", counter, pos=n % 2, seed=G * 7 + n)
        assert counter[P.SLOT_ERR] == 0 and not mem.bad and settled(counter, c), (G, splits)
    assert counter[P.SLOT_EPOCH] == 5


@pytest.mark.parametrize("G", [1, 4, 13])
def test_launches_across_the_int32_wraparound(reference, G):
    """E just below 2**31 and every count at E launches' adds (wrapped): launches go on clean
    through the wrap of the counts and of E."""
    adds = adds_of(TINY)
    start = (1 << 31) - 2
    counter = np.array([P.wrap32(start * int(a)) for a in adds], np.int64)
    counter[P.SLOT_ERR] = counter[P.SLOT_EXIT] = 0
    counter[P.SLOT_EPOCH] = start
    for n, pos in enumerate((0, 1, 0, 1)):
        mem = launch(TINY, G, "random", counter, pos=pos, seed=G + n)
        assert counter[P.SLOT_ERR] == 0 and not mem.bad and settled(counter, TINY), (G, n)
        assert mem.outputs() == reference[pos]
    assert counter[P.SLOT_EPOCH] == P.wrap32(start + 4) < 0


def test_the_model_sized_protocol_in_two_orders():
    """The real model's dims (4 layers, 4 heads of 64, d_ff 512, vocab 77, 2 slices) on the
    H200's 132 blocks and on 7: the same outputs, complete reads, counts back to 0."""
    outs = set()
    for G, order, seed in ((132, "random", 5), (7, "reversed", 0)):
        counter = clean_counter(MODEL)
        mem = launch(MODEL, G, order, counter, seed=seed)
        assert counter[P.SLOT_ERR] == 0 and not mem.bad and settled(counter, MODEL)
        outs.add(mem.outputs())
    assert len(outs) == 1


@pytest.mark.parametrize("G,victim", [(1, 0), (2, 0), (2, 1), (5, 3), (13, 0), (13, 11), (13, 12)])
def test_a_starved_block_ends_in_the_error_word_not_a_deadlock(G, victim):
    """Every other block runs until it is done or has given up waiting, then the victim: the
    launch ends, the error word names a wait (where the victim had work another block waits
    for; a victim with no item starves nobody), the counts are whole launches' again (every
    block bumps what it did, wait or no wait); a read of incomplete data happened only with the
    error word set; after the host's reset the next launch (the victim no longer starved) is
    clean."""
    counter = clean_counter(TINY)
    mem = launch(TINY, G, "forward", counter, victim=victim, spin_limit=300, give_up_every=16)
    code = int(counter[P.SLOT_ERR])
    ops = P.block_program(victim, G, **TINY, epochs=True, tails=False)   # its bumps before the exit (the
    works = G > 1 and any(op[0] == "bump" for op in     # picker's top-up: no one waits on it)
                          itertools.takewhile(lambda op: op[:2] != ("wait", P.SLOT_LOGITS), ops))
    assert bool(code) == works and (not code or P.describe_wait(code)), (code, works)
    assert settled(counter, TINY), counter
    counter[:] = 0                                   # the host's reset (check_error_word)
    again = launch(TINY, G, "random", counter, seed=9)
    assert not again.bad and settled(counter, TINY) and counter[P.SLOT_ERR] == 0
    assert code or not mem.bad                       # incomplete reads only under an error


# kernels.check's GPU timeout case: its tiny dims over two layers, the last of its grids
CHECK_GPU = dict(n_layer=P.CASES["gpu_layers"], D=P.CASES["tiny"]["D"], F=P.CASES["tiny"]["F"],
                 V=P.CASES["tiny"]["V"], n_head=P.CASES["tiny"]["H"],
                 head_dim=P.CASES["tiny"]["hd"], splits=P.CASES["cases"][0][2])


@pytest.mark.parametrize("epochs", [False, True])
def test_the_error_word_names_the_wait_made_impossible(epochs):
    """kernels.check's timeout case (layer 0's mlp-up wait made impossible: its count started
    at -2**30) on 132 blocks of the tiny dims, every block run in turn. Blocks with no item in
    the phases after the attention reach a later wait first -- layer 1's qkv (blocks 8 to 11:
    qkv pairs and nothing else), or with the epoch exit the token pick (block 131: no item at
    all) -- and spin out before the impossible wait does: the rule "the first wait to spin out
    writes the word" names that later wait, as the H200 did. The kernel's rule (every wait that
    stops records its code, the word keeps the smallest) names the impossible wait."""
    G, want = P.CASES["gpu_grids"][-1][0], P.wait_code(0, 3, 0)
    words = {}
    for rule in ("first", "smallest"):
        counter = clean_counter(CHECK_GPU)
        counter[P.SLOT_X_ATTN] = -(1 << 30)
        launch(CHECK_GPU, G, "forward", counter, epochs=epochs, rule=rule, spin_limit=200,
               give_up_every=16)
        words[rule] = int(counter[P.SLOT_ERR])
    later = P.wait_code(CHECK_GPU["n_layer"], P.PHASE_PICK, 0) if epochs else P.wait_code(1, 0, 0)
    assert words["first"] == later, P.describe_wait(words["first"])
    assert words["smallest"] == want, P.describe_wait(words["smallest"])


@pytest.mark.parametrize("G", [7, 132])
def test_the_model_sized_timeout_names_the_wait_made_impossible(G):
    """The same poisoned count at the model's dims, in a random order: the smallest code is the
    impossible wait whoever spins out first."""
    for epochs in (False, True):
        counter = clean_counter(MODEL)
        counter[P.SLOT_X_ATTN] = -(1 << 30)
        launch(MODEL, G, "random", counter, seed=G, epochs=epochs, spin_limit=300,
               give_up_every=16)
        assert int(counter[P.SLOT_ERR]) == P.wait_code(0, 3, 0), P.describe_wait(
            int(counter[P.SLOT_ERR]))


def lowered_part_wait_is_caught(**form) -> bool:
    """Does some random order of 6 blocks read incomplete data, with no error word, when the
    output projection's wait is lowered by one (a partial, or a merged head in tails)?"""
    def lowered(b, G):
        for op in P.block_program(b, G, **TINY, **form):
            if op[0] == "wait" and op[1] == P.SLOT_PART:
                op = (op[0], op[1], op[2] - 1, op[3])
            yield op
    for seed in range(40):
        counter = clean_counter(TINY)
        mem = launch(TINY, 6, "random", counter, seed=seed, program=lowered, **form)
        if mem.bad and counter[P.SLOT_ERR] == 0:
            return True
    return False


def test_a_lowered_wait_target_is_caught():
    """The model has teeth: the output projection's wait lowered by one partial lets some order
    read a partial before it is written, with no error word (silent corruption)."""
    assert lowered_part_wait_is_caught(epochs=True, tails=False)


def test_the_program_matches_the_kernels_counts():
    """What block_program (the epoch exit) bumps adds up to each wait's target, for any grid: every count reaches
    exactly what its last waiter needs (the LM head waits for every down row of the last layer),
    and the attention waits for its own head's pairs only."""
    c = TINY
    for G in (1, 3, 8, 40):
        bumps = np.zeros(P.counter_slots(c["n_head"]), np.int64)
        targets = {}
        for b in range(G):
            for op in P.block_program(b, G, **c, epochs=True, tails=False):
                if op[0] == "bump":
                    bumps[op[1]] += op[2]
                elif op[0] == "wait":
                    targets[op[1]] = max(targets.get(op[1], 0), op[2])
        for slot, t in targets.items():
            assert bumps[slot] >= t, (G, slot)
        L, D, F = c["n_layer"], c["D"], c["F"]
        assert bumps[P.SLOT_X_DOWN] == L * D == targets[P.SLOT_X_DOWN]
        assert bumps[P.SLOT_ACT] == L * F == targets[P.SLOT_ACT]
        assert targets[P.SLOT_PART] == L * c["n_head"] * c["splits"]   # the top-up: after it
        assert bumps[P.SLOT_PART] == L * P.MERGE_MAX_PAIRS
        assert bumps[P.SLOT_LOGITS] == c["V"] == targets[P.SLOT_LOGITS]
        assert list(bumps[P.SLOT_LOGITS:]) == list(adds_of(c)[P.SLOT_LOGITS:])
        picks = [b for b in range(G) if ("pick",) in P.block_program(b, G, **c, epochs=True, tails=False)]
        assert picks == [G - 1]
        for h in range(c["n_head"]):
            assert bumps[P.SLOT_QKV + h] == L * 3 * (c["head_dim"] // 2)


@pytest.mark.gpu
def test_gpu_kernel_bits_over_replays_and_grids_and_its_error_word():
    """kernels.check's op persistent on the device (the one GPU test that runs it): grids of 1,
    2, 7 and 132 blocks, both KV dtypes, launches repeated identical, the fused step's bits,
    every body variant's and the stamped form's bits, a wait made impossible (a count started
    far below 0) setting the error word to that wait and leaving the counts 0."""
    from kernels import check
    res = check.run(["persistent"], "gpu")
    assert res["ok"], res["ops"]["persistent"]["error"]
