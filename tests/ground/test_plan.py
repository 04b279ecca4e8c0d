import pytest

from lab.config import LabConfig
from lab.plan import CHUNK_TARGET, MAX_SPLITS, decode_plan, plan_boundaries, splits_for


def test_splits_grow_with_context_in_powers_of_two():
    assert splits_for(1) == 1 and splits_for(CHUNK_TARGET) == 1
    assert splits_for(CHUNK_TARGET + 1) == 2
    assert splits_for(10 ** 6) == MAX_SPLITS
    for ctx in range(1, 2048):
        s = splits_for(ctx)
        assert s & (s - 1) == 0 and (s == MAX_SPLITS or -(-ctx // s) <= CHUNK_TARGET)


def test_boundaries_are_where_the_key_changes(model):
    cfg = LabConfig()
    bounds = plan_boundaries(model.cfg.max_seq)
    assert bounds == [32, 64, 128, 256, 512]
    for b in bounds:
        assert decode_plan(b - 1, model.cfg, cfg).key != decode_plan(b, model.cfg, cfg).key


def test_plan_key_names_the_combine_form(model):
    a = decode_plan(5, model.cfg, LabConfig(split_combine=False))
    b = decode_plan(5, model.cfg, LabConfig(split_combine=True))
    assert a.key != b.key and a.splits == b.splits == 1


def test_positions_outside_the_model_are_refused(model):
    with pytest.raises(ValueError, match="outside"):
        decode_plan(model.cfg.max_seq, model.cfg, LabConfig())
