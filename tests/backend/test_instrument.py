"""The launch log: every launch with kernel, layer, grid, block and argument provenance."""
from lab.backend.instrument import launch_bill
from lab.engine.runner import DecodeEngine


def test_launches_per_layer_and_per_token(model, sim_cfg):
    for split, per_layer in ((False, 8), (True, 9)):
        eng = DecodeEngine(model, sim_cfg.replace(graph=False, split_combine=split))
        eng.generate("ROMEO.\n", 4)
        counts = eng.log.kernels_per_layer(0)
        assert all(counts[i] == per_layer for i in range(model.cfg.n_layer))
        assert counts[None] == 5  # embed; final norm, lm head, argmax, advance
        bill = launch_bill(eng.log, 0, "eager", 1.0, "simulated")
        assert bill.launches_per_token == per_layer * model.cfg.n_layer + 5
        assert abs(bill.us_per_launch - 1000.0 / bill.launches_per_token) < 1e-9


def test_arguments_carry_provenance(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg.replace(graph=False))
    eng.generate("ROMEO.\n", 2)
    rows = eng.log.table(0)
    attn = next(r for r in rows if r["kernel"] == "attn_partial")
    assert attn["layer"] == 0 and attn["grid"] == (model.cfg.n_head, 1)
    assert "k_cache=k_cache.0" in attn["args"] and "pos=pos" in attn["args"]
    assert "scale=value " in attn["args"]  # a scalar passed by value says so
    assert rows[0]["kernel"] == "embed" and rows[-1]["kernel"] == "advance"
