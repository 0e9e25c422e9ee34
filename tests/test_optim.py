"Chapter 03 (optim): AdamW8bit against torch.optim.AdamW, state round trips, bad input, other devices when present."
import copy, io, os
import pytest, torch, torch.nn as nn, torch.nn.functional as F
from netlite_nb.budget import fit_to_budget, plan_memory
from netlite_nb.memory.trace import make_optimizer
from netlite_nb.optim import AdamW8bit, adamw8bit_backend, dynamic_map, quantize_blockwise, dequantize_blockwise, state_bytes
from netlite_nb.optim import code_and_mids_lists, nearest_code

torch.set_num_threads(1)
DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else []) + \
          (['mps'] if getattr(torch.backends, 'mps', None) and torch.backends.mps.is_available() else [])


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def _train(model, opt, steps=30, seed=1, device='cpu'):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(32, 64, generator=g).to(device), torch.randint(0, 10, (32,), generator=g).to(device)
        opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
    return model


def test_dynamic_maps():
    s, u = dynamic_map(True), dynamic_map(False)
    assert s.shape == u.shape == (256,) and s.unique().numel() == 256 and u.unique().numel() == 256
    assert s.max() == 1 and u.max() == 1 and (u >= 0).all() and (s < 0).any()
    # non-linear: the codes span ~7 orders of magnitude
    assert u[u > 0].min() < 1e-6 and s[s > 0].min() < 1e-6


@pytest.mark.parametrize('signed', [True, False])
def test_quantize_roundtrip_relative_error(signed):
    torch.manual_seed(0)
    x = torch.randn(100_000) * 3
    if not signed: x = x ** 2
    q, a = quantize_blockwise(x, signed)
    assert q.dtype == torch.uint8 and a.numel() == q.numel() // 256
    back = dequantize_blockwise(q, a, signed, x.numel())
    big = x.abs() > 0.05 * x.abs().max()
    assert ((back - x).abs()[big] / x.abs()[big]).max() < 0.1


def test_fp32_path_is_torch_adamw_with_param_groups():
    a, b = _mlp(), _mlp()
    oa = torch.optim.AdamW([{'params': a[0].parameters(), 'lr': 3e-3, 'weight_decay': 0.1},
                            {'params': a[2].parameters(), 'lr': 1e-3, 'betas': (0.8, 0.99), 'weight_decay': 0}])
    ob = AdamW8bit([{'params': b[0].parameters(), 'lr': 3e-3, 'weight_decay': 0.1},
                    {'params': b[2].parameters(), 'lr': 1e-3, 'betas': (0.8, 0.99), 'weight_decay': 0}], min_8bit_size=10**9)
    _train(a, oa); _train(b, ob)
    for p, q in zip(a.parameters(), b.parameters()): torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('first_moment', ['8bit', 'fp16'])
def test_8bit_tracks_adamw(first_moment):
    a, b = _mlp(), _mlp()
    _train(a, torch.optim.AdamW(a.parameters(), lr=1e-3)); _train(b, AdamW8bit(b.parameters(), lr=1e-3, first_moment=first_moment, min_8bit_size=0))
    init = _mlp()
    for p, q, p0 in zip(a.parameters(), b.parameters(), init.parameters()):
        assert (p - q).norm() < 0.1 * (p - p0).norm(), (p - q).norm() / (p - p0).norm()


def test_state_bytes_large_tensors():
    m = nn.Linear(2048, 2048, bias=False)
    o = AdamW8bit(m.parameters())
    m(torch.randn(2, 2048)).sum().backward(); o.step()
    assert state_bytes(o) / m.weight.numel() <= 2.1


def test_state_dict_roundtrip_through_a_file():
    a = _mlp(); oa = AdamW8bit(a.parameters(), lr=1e-3, min_8bit_size=1024)
    _train(a, oa, steps=5)
    buf = io.BytesIO(); torch.save({'model': a.state_dict(), 'opt': oa.state_dict()}, buf); buf.seek(0)
    ck = torch.load(buf, weights_only=True)
    b = _mlp(5); b.load_state_dict(ck['model']); ob = AdamW8bit(b.parameters(), lr=1e-3, min_8bit_size=1024); ob.load_state_dict(ck['opt'])
    assert ob.state[b[0].weight]['exp_avg_q'].dtype == torch.uint8
    assert state_bytes(ob) == state_bytes(oa)  # the base class would have cast the uint8 codes to float32
    _train(a, oa, steps=3, seed=9); _train(b, ob, steps=3, seed=9)
    for p, q in zip(a.parameters(), b.parameters()): assert torch.equal(p, q)


def test_state_into_other_shape_names_the_parameter():
    a = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 10)); b = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 20))
    oa = AdamW8bit(a.named_parameters()); a(torch.randn(2, 64)).sum().backward(); oa.step()
    with pytest.raises(ValueError, match=r"'1\.weight'.*\(10, 128\).*\(20, 128\)"):
        AdamW8bit(b.named_parameters()).load_state_dict(oa.state_dict())
    with pytest.raises(ValueError, match='parameter groups'):
        AdamW8bit([{'params': b[0].parameters()}, {'params': b[1].parameters()}]).load_state_dict(oa.state_dict())


def test_bad_parameters():
    w = nn.Parameter(torch.randn(8, 4).t())
    with pytest.raises(ValueError, match=r"'w'.*not contiguous"): AdamW8bit([('w', w)])
    e = nn.Embedding(10, 3, sparse=True); o = AdamW8bit(e.parameters())
    e(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match='sparse'): o.step()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_parameters(dtype):
    m = nn.Linear(256, 64).to(dtype); o = AdamW8bit(m.parameters(), lr=1e-2, min_8bit_size=1024)
    w0 = m.weight.detach().clone()
    m(torch.randn(4, 256, dtype=dtype)).float().sum().backward(); o.step()
    assert m.weight.dtype == dtype and not torch.equal(m.weight, w0) and torch.isfinite(m.weight).all()


def test_grad_scaler_fp16_autocast_cpu():
    a, b = _mlp(), _mlp()
    oa, ob = AdamW8bit(a.parameters()), AdamW8bit(b.parameters())
    scaler = torch.amp.GradScaler('cpu', init_scale=2.**12)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    try:
        with torch.autocast('cpu', dtype=torch.float16): loss = F.cross_entropy(a(x), y)
    except RuntimeError: pytest.skip('no fp16 autocast on this CPU build')
    scaler.scale(loss).backward(); scaler.step(oa); scaler.update()
    with torch.autocast('cpu', dtype=torch.float16): F.cross_entropy(b(x), y).backward()
    ob.step()
    for p, q in zip(a.parameters(), b.parameters()): torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


def test_closure():
    m = _mlp(); o = AdamW8bit(m.parameters())
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    def closure():
        o.zero_grad(); l = F.cross_entropy(m(x), y); l.backward(); return l
    assert o.step(closure) is not None


@pytest.mark.parametrize('device', DEVICES)
def test_runs_on_every_available_device(device):
    a = _mlp().to(device); o = AdamW8bit(a.parameters(), min_8bit_size=1024)
    _train(a, o, steps=3, device=device)
    assert o.state[a[0].weight]['exp_avg_sq_q'].device.type == device


def test_fp16_first_moment_keeps_its_dtype_after_loading():
    a = _mlp(); oa = AdamW8bit(a.parameters(), first_moment='fp16', min_8bit_size=1024); _train(a, oa, steps=2)
    b = _mlp(); ob = AdamW8bit(b.parameters(), first_moment='fp16', min_8bit_size=1024); ob.load_state_dict(oa.state_dict())
    assert ob.state[b[0].weight]['exp_avg'].dtype == torch.float16 and ob.state[b[0].bias]['exp_avg'].dtype == torch.float32


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_state_of_half_precision_parameters_reloads_bit_for_bit(dtype):
    torch.manual_seed(0)
    lin = nn.Linear(64, 300).to(dtype)
    opt = AdamW8bit(lin.parameters(), lr=1e-3)
    for _ in range(3):
        lin(torch.randn(8, 64, dtype=dtype)).float().pow(2).mean().backward(); opt.step(); opt.zero_grad()
    saved = copy.deepcopy(opt.state_dict())
    fresh = AdamW8bit(lin.parameters(), lr=1e-3)
    fresh.load_state_dict(copy.deepcopy(saved))
    again = fresh.state_dict()
    for pid, st in saved['state'].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                w = again['state'][pid][k]
                assert w.dtype == v.dtype and torch.equal(w, v), (pid, k, v.dtype, w.dtype)


def test_the_planner_offers_and_traces_the_8bit_state():
    "Chapter 03's lever: plain AdamW -> 'adamw8bit', planned with exactly the state AdamW8bit creates."
    # large enough that the state, not the step's dequantization temporaries (up to 2**20 values at a time), decides the peak
    m = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    batch = (torch.randn(16, 1024), torch.randint(0, 10, (16,)))
    plain, eight = plan_memory(m, batch), plan_memory(m, batch, optimizer='adamw8bit')
    real = AdamW8bit(m.parameters()); m(batch[0]).sum().backward(); real.step()
    assert eight.breakdown['optimizer'] == state_bytes(real) and eight.optimizer == 'adamw8bit'
    c = next(c for c in fit_to_budget(m, batch, budget=(plain.total + eight.total) // 2) if c.description == '8-bit AdamW state (chapter 03)')
    assert c.changes == {'optimizer': 'adamw8bit'} and c.fits and c.saving > 0
    assert not any('8-bit' in c.description for c in fit_to_budget(m, batch, budget=eight.total, optimizer='sgd'))

def test_8bit_map_survives_fake_tensor_traces():
    "Planning with adamw8bit under bf16 (FakeTensorMode) must not leave fake tensors behind for a real run or another trace."
    from netlite_nb.budget import plan_memory
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    batch = (torch.randn(8, 64), torch.randint(0, 10, (8,)))
    for _ in range(2): plan_memory(m, batch, optimizer='adamw8bit', precision='bf16')
    opt = AdamW8bit(m.parameters(), min_8bit_size=0)
    F.cross_entropy(m(batch[0]), batch[1]).backward()
    opt.step()  # a real step after the traces: its quantization map is a real tensor
    assert all(torch.isfinite(p).all() for p in m.parameters()) and any(s['exp_avg_sq_q'].dtype == torch.uint8 for s in opt.state.values() if 'exp_avg_sq_q' in s)
    plan_memory(m, batch, optimizer='adamw8bit', precision='bf16')


@pytest.mark.parametrize('signed', [True, False])
def test_table_lookup_rounds_like_the_binary_search(signed):
    "The lookup tables give the nearest code exactly as torch.searchsorted over the midpoints (plus v > 0 never becomes 0)."
    mids = torch.tensor(code_and_mids_lists(signed)[1])
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 2**31, (2_000_000,), generator=g, dtype=torch.int64).to(torch.int32)  # any positive float32 bit pattern
    x = torch.cat([bits.view(torch.float32), -bits.view(torch.float32), mids, mids.nextafter(torch.tensor(2.)),
                   mids.nextafter(torch.tensor(-2.)), torch.tensor([0., -0., 1., -1., 1e-45, -1e-45])])
    x = x[x.abs() <= 1]
    want = torch.searchsorted(mids, x)
    if not signed: want = torch.where(x > 0, want.clamp_min(1), want)
    assert torch.equal(nearest_code(x, signed).long(), want)


@pytest.mark.parametrize('signed', [True, False])
def test_one_read_quantizer_rounds_like_the_lookup_tables(signed):
    "The step's quantizer (one int32 read and integer arithmetic) gives `nearest_code`'s codes: random bit patterns, midpoints, NaNs of both signs, -0.0."
    from netlite_nb.optim import quant_table, quantize_into
    mids = torch.tensor(code_and_mids_lists(signed)[1])
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(0, 2**31, (1_000_000,), generator=g, dtype=torch.int64).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), -bits.view(torch.float32), mids, mids.nextafter(torch.tensor(2.)),
                   mids.nextafter(torch.tensor(-2.)), torch.tensor([0., -0., 1e-45, -1e-45])])
    x = x[x.abs() <= 1]
    if not signed: x = torch.cat([x.abs(), torch.tensor([-0.])])  # v is a sum of squares: only -0.0 and NaNs carry a sign
    x = torch.cat([x, x.new_zeros((-x.numel()) % 255)]).view(-1, 255)
    x = torch.cat([torch.cat([x, torch.ones(len(x), 1)], 1).view(-1), torch.tensor([float('nan'), -float('nan')]).repeat(128)])  # absmax 1: unchanged
    q, absmax = torch.empty(x.numel(), dtype=torch.uint8), torch.empty(x.numel() // 256, 1)
    w = {'t': torch.empty_like(x), 'i': torch.empty(x.numel(), dtype=torch.int32)}
    quantize_into(x.clone(), q, absmax, quant_table(signed, x), w, 256, signed)
    assert torch.equal(q, nearest_code(x, signed))


def test_adamw8bit_name_builds_ours_on_cpu_and_for_the_planner():
    assert type(make_optimizer('adamw8bit', nn.Linear(4, 2).parameters())) is AdamW8bit
    assert type(make_optimizer('adamw8bit', [nn.Parameter(torch.empty(4, 4, device='meta'))])) is AdamW8bit
    assert adamw8bit_backend('cpu') == adamw8bit_backend('mps') == 'netlite_nb'


def _bnb():
    "bitsandbytes, or a skip where it is not installed; in CI (`.[dev]` installs it) a missing bitsandbytes is a failure."
    if os.environ.get('CI'): import bitsandbytes; return bitsandbytes
    return pytest.importorskip('bitsandbytes', reason='bitsandbytes is not installed: pip install -e ".[bnb]"')


def test_same_code_maps_as_bitsandbytes():
    from bitsandbytes.functional import create_dynamic_map
    _bnb()
    for signed in (True, False): assert torch.equal(create_dynamic_map(signed), dynamic_map(signed))


def test_same_updates_as_bitsandbytes_on_cpu():
    "Five steps of both on the same gradients: the weights move alike. Ours differs by design where bnb rounds a positive v to 0."
    bnb = _bnb()
    torch.manual_seed(0)
    a, b = nn.Linear(512, 256, bias=False), nn.Linear(512, 256, bias=False)
    b.load_state_dict(a.state_dict()); w0 = a.weight.detach().clone()
    oa, ob = AdamW8bit(a.parameters(), lr=1e-3), bnb.optim.AdamW8bit(b.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grad = torch.randn(256, 512, generator=g) * torch.rand(256, 1, generator=g)
        a.weight.grad, b.weight.grad = grad.clone(), grad.clone(); oa.step(); ob.step()
    da, db = a.weight - w0, b.weight - w0
    # each update is about lr per step; 8-bit moments carry a few % error, so the two paths agree to ~1% on average
    assert (da - db).abs().mean() < 0.01 * da.abs().mean(), ((da - db).abs().mean() / da.abs().mean()).item()
    assert ((da - db).abs() > 0.1 * da.abs().max()).float().mean() < 1e-3  # the rare large differences: v near zero


def test_plan_of_our_state_bounds_bitsandbytes_state():
    "The planner traces ours; bitsandbytes' state differs by its two 1 KB code maps per 8-bit tensor, minus our block padding."
    bnb = _bnb()
    m = nn.Sequential(nn.Linear(300, 1000), nn.ReLU(), nn.Linear(1000, 10))
    batch = (torch.randn(8, 300), torch.randint(0, 10, (8,)))
    ob = bnb.optim.AdamW8bit(m.parameters()); F.cross_entropy(m(batch[0]), batch[1]).backward(); ob.step()
    planned = plan_memory(m, batch, optimizer='adamw8bit').breakdown['optimizer']
    eight_bit = sum(p.numel() >= 4096 for p in m.parameters())
    assert abs(state_bytes(ob) - planned) <= eight_bit * (2 * 256 * 4 + 2 * 255), (state_bytes(ob), planned)


def test_bitsandbytes_state_is_refused_with_a_sentence():
    bnb = _bnb()
    m = nn.Linear(128, 64); ob = bnb.optim.AdamW8bit(m.parameters())
    m(torch.randn(2, 128)).sum().backward(); ob.step()
    with pytest.raises(ValueError, match='bitsandbytes'): AdamW8bit(m.parameters()).load_state_dict(ob.state_dict())


def _one_step_each_way(p, opt, chunk=None, threads=1, decay=1.0):
    "From the same parameter and state, one step by the plain reference and one by the optimizer's own chunked update (decay first)."
    from netlite_nb.optim import adamw_8bit_reference, chunk_values
    import netlite_nb.optim as optim
    group, st = opt.param_groups[0], opt.state[p]
    if not st: opt._init_state(p, group, st)
    ref, st_ref, before = p.detach().clone(), {k: v.clone() for k, v in st.items() if isinstance(v, torch.Tensor)}, p.detach().clone()
    ref.grad = p.grad
    t = st['step'] = st['step'] + 1
    step_size, bc2_sqrt = group['lr'] / (1 - group['betas'][0] ** t), (1 - group['betas'][1] ** t) ** 0.5
    sized, threads_before = optim.chunk_values, torch.get_num_threads()
    try:
        if chunk: optim.chunk_values = lambda device, block_size: chunk
        torch.set_num_threads(threads)
        with torch.no_grad():
            adamw_8bit_reference(ref.mul_(decay), st_ref, group, step_size, bc2_sqrt)
            opt._update_8bit(p, st, group, step_size, bc2_sqrt, decay)
    finally: optim.chunk_values = sized; torch.set_num_threads(threads_before)
    return before, p.detach().clone(), ref, {k: st[k] for k in st_ref}, st_ref


def _assert_same_step(before, fast, ref, st, st_ref):
    "Same state (a code may be one step off on at most 1/1000 of values: a last-bit tie), parameter up to float rounding."
    for k in st_ref:
        if k.endswith('_q'):
            diff = (st[k].int() - st_ref[k].int()).abs()
            assert diff.max() <= 1 and (diff > 0).float().mean() <= 1e-3, (k, int((diff > 0).sum()))
        else: torch.testing.assert_close(st[k].float(), st_ref[k].float(), rtol=2**-21 if st[k].dtype == torch.float32 else 2**-10, atol=0, equal_nan=True)
    # the folded bias correction rounds differently by a few ulps of the update; a half-precision parameter also rounds the
    # update (times the step size) and its new value to its dtype, in each path
    moved = (ref.float() - before.float()).abs()
    tol = torch.finfo(fast.dtype).eps * (ref.float().abs() + 2 * moved) + 8 * 2**-23 * moved
    bad = ((fast.float() - ref.float()).abs() > tol) & ~(fast.isnan() & ref.isnan())
    assert not bad.any(), (int(bad.sum()), (fast.float() - ref.float()).abs().max().item())


@pytest.mark.parametrize('first_moment', ['8bit', 'fp16', 'fp32'])
@pytest.mark.parametrize('threads', [1, 2])
def test_chunked_step_is_the_reference_step(first_moment, threads):
    "Several chunks and a ragged last one (and its padded last block), one thread or a pool of two: the plain whole-tensor step's result."
    g = torch.Generator().manual_seed(0)
    n = 5 * 2**15 + 300  # two threads cut it into two pieces of 82 176 and 81 844 values, the last ending in a padded block
    p = nn.Parameter(torch.randn(n, generator=g) * 0.1)
    opt = AdamW8bit([p], lr=1e-2, min_8bit_size=0, first_moment=first_moment)
    for _ in range(4):
        p.grad = torch.randn(n, generator=g) * 10.0 ** -torch.randint(0, 6, (n,), generator=g)
        _assert_same_step(*_one_step_each_way(p, opt, chunk=None if threads == 2 else 4096, threads=threads, decay=1 - 1e-2 * 0.1))


def test_odd_parameters_step_like_the_reference():
    "One value, a shape that is not whole blocks, a non-contiguous gradient, bf16 and fp16, zero, NaN (both signs) and infinite gradients, odd block sizes."
    g = torch.Generator().manual_seed(1)
    cases = [(torch.randn(1, generator=g), None), (torch.randn(3, 5, 7, generator=g), None),
             (torch.randn(40, 70, generator=g), lambda w: torch.randn(70, 40, generator=g).t()),   # gradient is a transposed view
             (torch.randn(300, 20, generator=g).bfloat16(), None), (torch.randn(300, 20, generator=g).half(), None),
             (torch.randn(1000, generator=g), lambda w: torch.zeros_like(w)),
             (torch.randn(1000, generator=g), lambda w: torch.full_like(w, float('nan'))),
             (torch.randn(1000, generator=g), lambda w: torch.full_like(w, -float('nan'))),
             (torch.randn(1000, generator=g), lambda w: torch.full_like(w, float('inf')))]  # inf / inf: the CPU's own NaN, often negative
    for w, make_grad in cases:
        p = nn.Parameter(w.clone()); opt = AdamW8bit([p], lr=1e-2, min_8bit_size=0)
        for _ in range(3):
            p.grad = make_grad(p) if make_grad else torch.randn(p.shape, generator=g).to(p.dtype) * 1e-2
            assert p.grad.is_contiguous() == (make_grad is None or w.dim() == 1)
            _assert_same_step(*_one_step_each_way(p, opt, chunk=512))
        assert p.dtype == w.dtype and p.shape == w.shape
    for bs in (255, 100):  # an odd block size: chunks of an odd number of codes
        p = nn.Parameter(torch.randn(3000, generator=g)); opt = AdamW8bit([p], block_size=bs, min_8bit_size=0)
        for _ in range(3):
            p.grad = torch.randn(3000, generator=g) * 1e-2
            _assert_same_step(*_one_step_each_way(p, opt, chunk=3 * bs))


def test_step_buffers_are_reused_and_not_state():
    "The chunk buffers are made once (the same tensors on the next step) and never saved or counted as state."
    m = nn.Linear(512, 300, bias=False); o = AdamW8bit(m.parameters())
    m(torch.randn(2, 512)).sum().backward(); o.step()
    bufs = {k: v.data_ptr() for sc in o._scratch_buffers.values() for k, v in sc.items() if isinstance(v, torch.Tensor)}
    o.step()
    assert bufs == {k: v.data_ptr() for sc in o._scratch_buffers.values() for k, v in sc.items() if isinstance(v, torch.Tensor)}
    assert state_bytes(o) == 2 * (600 * 256 + 600 * 4)
    assert set(o.state_dict()['state'][0]) == {'step', 'shape', 'exp_avg_q', 'exp_avg_absmax', 'exp_avg_sq_q', 'exp_avg_sq_absmax'}
    assert all(v.numel() <= 512 * 300 for sc in o._scratch_buffers.values() for v in sc.values() if isinstance(v, torch.Tensor))


def _step_in_child(conn, p):
    "In a forked child: one 8-bit step of `p` on two threads, its result sent back as bytes (numpy: no OpenMP), or the error."
    try:
        AdamW8bit([p]).step()
        conn.send(p.detach().numpy().tobytes())
    except BaseException as e: conn.send(repr(e))
    finally: conn.close()


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='fork is POSIX-only')
def test_8bit_step_runs_in_a_forked_child_of_a_process_that_ran_parallel_ops():
    "GNU OpenMP does not survive fork: the 8-bit step uses its own threads, never OpenMP's, so a forked child can step."
    import multiprocessing as mp
    n, threads = 4 * 2**16 + 300, torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.randn(2**22).add_(1).sum()  # an OpenMP team in the parent, as any training would start
        p, q = (nn.Parameter(torch.linspace(-1, 1, n)) for _ in range(2))
        p.grad = q.grad = torch.linspace(1e-3, -1e-3, n)
        AdamW8bit([p]).step()
        assert torch.get_num_threads() == 2  # the step restored the thread count
        recv, send = mp.Pipe(duplex=False)
        child = mp.get_context('fork').Process(target=_step_in_child, args=(send, q)); child.start(); send.close()
        got = recv.recv() if recv.poll(60) else None
        child.join(5)
        if child.is_alive(): child.kill()
        assert got is not None, "the 8-bit step hung in a forked child (OpenMP after fork)"
        assert isinstance(got, bytes), got
        assert got == p.detach().numpy().tobytes()
    finally: torch.set_num_threads(threads)


# bf16 weights with stochastic rounding (issue 41)
from netlite_nb.optim import AdamW, bf16_weights, stochastic_round_bf16


def _rounding_z(rnd, n=20_000, reps=100, seed=0)->float:
    "z-score of the mean error of `rnd`, in units of bf16's gap, over `reps` roundings of `n` values in the lower half of their gap."
    g = torch.Generator().manual_seed(seed)
    high = torch.randint(100 << 7, 150 << 7, (n,), generator=g) | (torch.randint(0, 2, (n,), generator=g) << 15)  # sign, exponent, 7 bits
    low = torch.randint(1, 2**15, (n,), generator=g)  # a fraction f < 1/2 of the gap: round-to-nearest always rounds down
    x = ((high << 16) | low).to(torch.int32).view(torch.float32)
    f = low.double() / 2**16
    gap = ((high << 16) + 2**16).to(torch.int32).view(torch.float32).double().abs() - (high << 16).to(torch.int32).view(torch.float32).double().abs()
    err = sum(((rnd(x.clone(), g).double().abs() - x.double().abs()) / gap).sum() for _ in range(reps))
    return (err / (reps * (f * (1 - f)).sum()).sqrt()).item()


def test_stochastic_rounding_is_unbiased_and_lands_on_bf16_neighbours():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(10_000, generator=g)
    r = stochastic_round_bf16(x.clone(), g)
    assert torch.equal(r, r.to(torch.bfloat16).float())  # bf16 values
    lo = x.view(torch.int32).bitwise_and(-2**16).view(torch.float32)
    hi = (x.view(torch.int32).bitwise_and(-2**16) + 2**16).view(torch.float32)
    assert ((r == lo) | (r == hi)).all()
    assert abs(_rounding_z(stochastic_round_bf16)) < 4.5
    assert abs(_rounding_z(lambda x, g: x.to(torch.bfloat16).float())) > 10  # the test can see a bias: round-to-nearest's


def _pulled(make, dtype, n=4096, steps=300):
    w = nn.Parameter(torch.ones(n, dtype=dtype))
    opt = make([w])
    for _ in range(steps):
        w.grad = torch.ones_like(w); opt.step()
    return w.detach().float()


@pytest.mark.parametrize('cls,n', [(AdamW, 4096), (AdamW8bit, 4096), (AdamW8bit, 3 * 2**16 + 100)])
def test_bf16_sr_keeps_updates_that_round_to_nearest_loses(cls, n):
    "Updates 1/78 of bf16's spacing at 1.0: round-to-nearest never moves, stochastic rounding moves as fp32 does (several chunks and threads too)."
    kw = dict(lr=1e-4, weight_decay=0)
    fp32 = 1 - _pulled(lambda ps: cls(ps, **kw), torch.float32, n).mean()
    assert torch.equal(_pulled(lambda ps: cls(ps, **kw), torch.bfloat16, n), torch.ones(n))
    with torch.no_grad():
        old = torch.get_num_threads(); torch.set_num_threads(2)
        try: sr = 1 - _pulled(lambda ps: cls(ps, master_weights='bf16-sr', **kw), torch.bfloat16, n).mean()
        finally: torch.set_num_threads(old)
    assert abs(sr - fp32) < 0.03 * fp32, (sr, fp32)


def test_bf16_sr_repeats_with_its_seed_and_resumes_bit_exactly():
    data = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 64, generator=data).bfloat16(), torch.randint(0, 10, (32,), generator=data)) for _ in range(6)]
    def run(seed, batches, state=None, model=None):
        m = model or bf16_weights(_mlp())
        opt = AdamW8bit(m.parameters(), lr=3e-3, min_8bit_size=1024, master_weights='bf16-sr', seed=seed)
        if state is not None: opt.load_state_dict(state)
        for x, y in batches: opt.zero_grad(); F.cross_entropy(m(x).float(), y).backward(); opt.step()
        return m, opt
    same = lambda a, b: all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    a, b, c = run(0, batches)[0], run(0, batches)[0], run(1, batches)[0]
    assert same(a, b) and not same(a, c)
    half, opt = run(0, batches[:3])
    buf = io.BytesIO(); torch.save(opt.state_dict(), buf); buf.seek(0)
    resumed, _ = run(0, batches[3:], torch.load(buf), copy.deepcopy(half))
    assert same(a, resumed)


def test_bf16_sr_refuses_fp32_weights_and_unknown_modes():
    m = _mlp(); m(torch.randn(2, 64)).sum().backward()
    with pytest.raises(ValueError, match=r"'0.weight' is torch.float32.*bf16_weights"):
        AdamW(m.named_parameters(), master_weights='bf16-sr').step()
    with pytest.raises(ValueError, match="None or 'bf16-sr'"): AdamW8bit(m.parameters(), master_weights='bf16')


def test_bf16_sr_plan_is_six_bytes_per_parameter_and_refused_without_bf16():
    wide = nn.Sequential(nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    sample = (torch.empty(64, 784, device='meta'), torch.empty(64, dtype=torch.long, device='meta'))
    n = sum(p.numel() for p in wide.parameters())
    per = lambda p: (p.breakdown['weights'] + p.breakdown['gradients'] + p.breakdown['optimizer']) / n
    step = dict(optimizer='adamw8bit-bf16sr', transform=bf16_weights, precision='bf16')
    assert per(plan_memory(wide, sample)) == 16
    assert 6 <= per(plan_memory(wide, sample, **step)) < 6.1
    assert 12 <= per(plan_memory(wide, sample, **{**step, 'optimizer': 'adamw-bf16sr'})) < 12.1
    for gpu, cc in (('gtx 1080 ti', '6.1'), ('rtx 2080 ti', '7.5')):
        with pytest.raises(ValueError, match=rf"compute capability {cc}\) has no bf16 arithmetic.*adamw8bit"):
            plan_memory(wide, sample, device_or_gpu=gpu, **step)
    assert plan_memory(wide, sample, device_or_gpu='rtx 3060', **step).total > 0


def test_a_traced_8bit_step_runs_a_steady_chunk_once():
    """A plan of the 8-bit step runs each parameter's first two chunks and its last (every whole chunk after the first allocates and
    frees what the second does), so a weight of 32 chunks of 2**18 values traces as many optimizer allocations as one of 8, and the
    billion-parameter plans of bench/offload.py do not trace thousands of chunks each."""
    from netlite_nb.memory.trace import trace_step
    def optimizer_allocations(out_features):
        batch = (torch.randn(4, 1024), torch.randn(4, out_features))
        tr = trace_step(nn.Linear(1024, out_features, bias=False), batch, optimizer='adamw8bit').tracker
        return sum(s > 0 and r.phase == 'optimizer' and r.step == 1 for s, r in tr.events)
    assert optimizer_allocations(2048) == optimizer_allocations(8192) > 0
