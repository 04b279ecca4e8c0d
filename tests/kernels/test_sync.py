"""kernels/sync.py: the counts and elections with which blocks of one launch hand data over,
and the flag-in-data words. On the simulator (its atomics sequentially consistent, its blocks run
one after another in the grid's order) and, marked gpu, on a device."""
import numpy as np
import pytest

from kernels import cudasim
from kernels import sync as S

G = 5           # blocks
T = 32          # threads a block

SOURCE = """
import numba
from numba import cuda
from kernels.sync import arrive_last, count_arrival, wait_arrivals


@cuda.jit
def elect(parts, counter, whole, reset, elected, total):
    # each block writes its part, arrives; the elected block sums every part in block order
    flag = cuda.shared.array(1, numba.int32)
    b = cuda.blockIdx.x
    if cuda.threadIdx.x == 0:
        parts[b] = numba.float32(b + 1) * numba.float32(0.5)
    if arrive_last(counter, 0, whole, flag, reset != 0):
        if cuda.threadIdx.x == 0:
            elected[b] = 1
            s = numba.float32(0)
            for i in range(parts.shape[0]):
                s += parts[i]
            total[0] = s


@cuda.jit
def count_then_wait(parts, counter, n_counted, out):
    # blocks below n_counted write and count; the rest wait for them, then read every part
    b = cuda.blockIdx.x
    if b < n_counted:
        if cuda.threadIdx.x == 0:
            parts[b] = numba.float32(b + 1)
        count_arrival(counter, 0)
    else:
        wait_arrivals(counter, 0, n_counted)
        if cuda.threadIdx.x == 0:
            s = numba.float32(0)
            for i in range(n_counted):
                s += parts[i]
            out[b] = s
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = cudasim.Simulator(str(tmp_path_factory.mktemp("sync")))
    yield s
    s.close()


def _elect(sim, whole, reset, start=0):
    arrays = {"parts": np.zeros(G, np.float32), "counter": np.array([start], np.int32),
              "elected": np.zeros(G, np.int32), "total": np.zeros(1, np.float32)}
    (res,) = sim.run([cudasim.Launch("elect", "elect", (G,), (T,),
                                     ["parts", "counter", (whole, "int32"),
                                      (int(reset), "int32"), "elected", "total"])],
                     arrays, SOURCE)
    assert not res.error, res.error
    return res.arrays[1], res.arrays[4], res.arrays[5]


def test_arrive_last_elects_the_block_that_completes_the_count_and_resets_it(sim):
    """Exactly one block is elected, it sees every part, and the slot is back at 0 (reset)."""
    counter, elected, total = _elect(sim, G, True)
    assert elected.sum() == 1                      # one block, the one whose arrival made G
    assert total[0] == np.float32(sum((b + 1) * 0.5 for b in range(G)))
    assert counter[0] == 0                         # clean for the next launch


def test_arrive_last_without_reset_keeps_counting(sim):
    """reset False: the slot keeps its count (the megakernel's per-head counts, over layers); a
    count that starts at 3 reaches `whole` = 3 + G with the last block; one already past
    `whole` elects nobody."""
    counter, elected, _ = _elect(sim, 3 + G, False, start=3)
    assert elected.sum() == 1 and counter[0] == 3 + G
    counter, elected, _ = _elect(sim, G, False, start=G)
    assert elected.sum() == 0 and counter[0] == 2 * G


def test_count_arrival_and_wait_arrivals(sim):
    """The waiting blocks read every counted block's part; the count is the counted blocks'."""
    arrays = {"parts": np.zeros(3, np.float32), "counter": np.zeros(1, np.int32),
              "out": np.zeros(G, np.float32)}
    (res,) = sim.run([cudasim.Launch("ctw", "count_then_wait", (G,), (T,),
                                     ["parts", "counter", (3, "int32"), "out"])], arrays, SOURCE)
    assert not res.error, res.error
    assert res.arrays[1][0] == 3
    assert res.arrays[3].tolist() == [0.0, 0.0, 0.0, 6.0, 6.0]


LL_CASES = ((1.5, 7), (-0.0, -1), (float("nan"), 2 ** 31 - 1), (3.4e38, -2 ** 31), (1e-45, 0))


def test_ll_words_keep_each_value_beside_its_tag():
    """ll_store / ll_load (lab/measure/handoff.py's flag-in-data hand-off): the float32's bits
    (a NaN's, -0.0's, a subnormal's) and the int32 tag come back from one word as stored; an
    untouched word reads tag 0."""
    words = np.zeros(3, np.int64)
    for val, tag in LL_CASES:
        S.ll_store_host(words, 1, np.float32(val), np.int32(tag))
        v, t = S.ll_load_host(words, 1)
        assert np.float32(v).tobytes() == np.float32(val).tobytes() and int(t) == tag
        assert int(words[1]) >> 32 == tag                  # the tag in the high half
    assert S.ll_load_host(words, 0) == (0.0, 0) and S.ll_load_host(words, 2) == (0.0, 0)


@pytest.mark.gpu
def test_gpu_ll_words_keep_each_value_beside_its_tag():
    """The device's ll_store / ll_load (one 64-bit relaxed store and load): the same words."""
    from numba import cuda

    @cuda.jit
    def round_trip(words, vals, tags, out_v, out_t):
        i = cuda.grid(1)
        if i < vals.shape[0]:
            S.ll_store(words, i, vals[i], tags[i])
            v, t = S.ll_load(words, i)
            out_v[i] = v
            out_t[i] = t

    vals = np.array([v for v, _ in LL_CASES], np.float32)
    tags = np.array([t for _, t in LL_CASES], np.int32)
    words = np.zeros(len(vals), np.int64)
    out_v, out_t = np.zeros_like(vals), np.zeros_like(tags)
    round_trip[1, 32](words, vals, tags, out_v, out_t)
    assert out_v.tobytes() == vals.tobytes() and out_t.tolist() == tags.tolist()
    for i in range(len(vals)):   # the word's halves: the value's bits low, the tag high
        assert int(words[i]) & 0xFFFFFFFF == int(vals[i:i + 1].view(np.uint32)[0])
