"Chapter 03a (offload): host memory is a budget too — plans check what the offloads hold on the host, pinned blocks rounded as PyTorch's allocator rounds them."
import pytest, torch, torch.nn as nn, torch.nn.functional as F
from netlite_nb.budget import fit_to_budget, plan_memory
from netlite_nb.offload import HOST_SHARE, host_budget, offload_activations, pinned_bytes

torch.set_num_threads(1)
B = (torch.empty(64, 500, device='meta'), torch.empty(64, dtype=torch.long, device='meta'))


def _odd():  # sizes that are not powers of two, so the pinned allocator's rounding shows
    return nn.Sequential(nn.Linear(500, 300), nn.ReLU(), nn.Linear(300, 10))


def test_pinned_bytes_rounds_up_to_a_power_of_two():
    assert [pinned_bytes(n) for n in (0, 1, 4, 5, 4096, 4097, 600_000)] == [0, 1, 4, 8, 4096, 8192, 2**20]


def test_plan_rows_are_pinned_or_pageable_and_the_rounding_is_counted():
    p = plan_memory(_odd(), B, device_or_gpu='gtx 1650', optimizer='adamw-offload-grads')
    sizes = [w.numel() * 4 for w in _odd().parameters()]
    assert p.host['host: weights (pinned)'] == p.host['host: gradients (pinned)'] == sum(sizes)
    assert p.host['host: pinned allocator rounding'] == 2 * sum(pinned_bytes(n) - n for n in sizes)  # each host weight and each gradient buffer
    assert 'host: optimizer state (pageable)' in p.host
    assert p.host_held == sum(v for k, v in p.host.items() if k.startswith('host:'))


def test_plan_checks_the_host_rows_against_the_host_budget():
    kw = dict(device_or_gpu='gtx 1650', optimizer='adamw-offload-grads', transform=offload_activations)
    roomy = plan_memory(_odd(), B, host_budget=2**40, **kw)
    assert roomy.fits and roomy.host_fits and roomy.host_budget == 2**40
    tight = plan_memory(_odd(), B, host_budget=roomy.host_held - 1, **kw)
    assert tight.total == roomy.total and tight.host_fits is False and tight.fits is False  # the card's bytes fit; the host's do not
    assert any('does NOT fit in host memory' in n for n in tight.notes)
    assert any(r[0] == 'host budget' and 'does NOT fit' in r[2] for r in tight._rows())


def test_the_default_host_budget_is_a_share_of_this_machines_ram():
    import psutil
    assert host_budget() == int(HOST_SHARE * psutil.virtual_memory().total) and host_budget(3 * 2**30) == int(HOST_SHARE * 3 * 2**30)
    p = plan_memory(_odd(), B, device_or_gpu='gtx 1650', optimizer='adamw-offload')
    assert p.host_budget == host_budget()
    assert plan_memory(_odd(), B, device_or_gpu='gtx 1650').host_budget is None  # nothing on the host: nothing to check


def test_fit_to_budget_never_claims_an_offload_the_host_cannot_hold():
    wide = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)])
    b = (torch.empty(32, 1024, device='meta'), torch.empty(32, 1024, device='meta'))
    base = plan_memory(wide, b, device_or_gpu='gtx 1650', loss_fn=F.mse_loss)
    budget = base.total - base.breakdown['optimizer'] // 2  # only moving the optimizer state off the card fits
    kw = dict(budget=budget, device_or_gpu='gtx 1650', loss_fn=F.mse_loss)
    roomy = [c for c in fit_to_budget(wide, b, host_budget=2**40, **kw) if c.fits]
    assert any('optimizer' in c.changes and c.new_plan.host_held for c in roomy)
    tight = fit_to_budget(wide, b, host_budget=2**20, **kw)
    assert not any(c.fits and c.new_plan.host_held for c in tight)
    assert any(c.new_plan.host_fits is False and 'host memory' in str(c) for c in tight)


def test_host_optimizer_refuses_weights_this_machine_cannot_hold(monkeypatch):
    import psutil, types
    from netlite_nb.offload import HostOptimizer
    m = _odd()
    monkeypatch.setattr(psutil, 'virtual_memory', lambda: types.SimpleNamespace(available=1000, total=2000))
    with pytest.raises(MemoryError, match='host memory'): HostOptimizer(m.parameters(), 'adamw')
    monkeypatch.undo()
    HostOptimizer(m.parameters(), 'adamw')  # with this machine's RAM: built


def test_a_plan_over_the_host_budget_still_says_the_card_fits():
    kw = dict(device_or_gpu='gtx 1650', optimizer='adamw-offload-grads')
    rows = {r[0]: r[2] for r in plan_memory(_odd(), B, host_budget=1, **kw)._rows()}
    assert rows['budget'] == 'fits' and rows['host budget'].startswith('does NOT fit')


@pytest.mark.parametrize('base', ['adamw8bit-bf16sr', 'adamw-bf16sr'])
def test_bf16_stochastic_rounding_on_the_host_trains_to_the_same_weights(base):
    "bf16 weights rounded stochastically need no fp32 masters: the host keeps bf16 copies, and the weights end bit for bit where the plain step's do."
    from netlite_nb.memory.trace import make_optimizer
    from netlite_nb.optim import bf16_weights
    def run(name):
        torch.manual_seed(0); m = bf16_weights(nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 10)))
        opt = make_optimizer(name, m.parameters()); g = torch.Generator().manual_seed(1)
        for _ in range(3):
            for _ in range(2):  # two micro-batches a step
                x, y = torch.randn(8, 128, generator=g).bfloat16(), torch.randint(0, 10, (8,), generator=g)
                (F.cross_entropy(m(x).float(), y) / 2).backward()
            opt.step(); opt.zero_grad()
        return [p.detach().clone() for p in m.parameters()], opt
    ref, _ = run(base)
    for suffix in ('-offload', '-offload-grads'):
        got, opt = run(base + suffix)
        assert all(torch.equal(a, b) for a, b in zip(ref, got)), suffix
        assert {h.dtype for h in opt.host.values()} == {torch.bfloat16}  # no fp32 masters


def test_plan_of_bf16_weights_with_host_state_holds_no_fp32_masters():
    from netlite_nb.optim import bf16_weights
    p = plan_memory(_odd(), B, device_or_gpu='rtx 3060', optimizer='adamw8bit-bf16sr-offload-grads', transform=bf16_weights, precision='bf16')
    n = p.params
    assert p.host['host: weights (pinned)'] == p.host['host: gradients (pinned)'] == 2 * n and 'host: fp32 gradients (pageable)' not in p.host
    with pytest.raises(ValueError, match='no bf16 arithmetic'):
        plan_memory(_odd(), B, device_or_gpu='gtx 1650', optimizer='adamw8bit-bf16sr-offload-grads', transform=bf16_weights, precision='bf16')
