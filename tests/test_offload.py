"Chapter 03a (offload): each offload trains to the ordinary step's weights; refusals; the planner's host rows against a real CPU run; levers."
import copy, sys, types
import pytest, torch, torch.nn as nn, torch.nn.functional as F
from netlite_nb.budget import IncompatibleStepError, TrainingStep, fit_to_budget, plan_memory
from netlite_nb.memory.trace import Target, make_optimizer
from netlite_nb.layers import checkpoint_every
from netlite_nb.optim import state_bytes
from netlite_nb.offload import (HostOptimizer, StepInBackward, check_offload, host_optimizer_backend, nvml_pcie_link, offload_activations,
                                offload_hooks, pcie_link)

torch.set_num_threads(1)
BASES = ('adamw', 'sgd', 'adamw8bit')


def _mlp(seed=0, d=32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10))


def _train(make_opt, steps=3, accum=1, model=None):
    m = model or _mlp(); opt = make_opt(m.parameters())
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _ in range(accum):
            (F.cross_entropy(m(torch.randn(8, 32, generator=g)), torch.randint(0, 10, (8,), generator=g)) / accum).backward()
        opt.step(); opt.zero_grad()
    return [p.detach().clone() for p in m.parameters()]


def _same(a, b): return all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize('checkpointed', [False, True])
def test_offloaded_activations_train_to_the_same_weights(checkpointed):
    wrap = (lambda m: checkpoint_every(m, k=2)) if checkpointed else (lambda m: m)
    ref = _train(lambda ps: torch.optim.AdamW(ps), model=wrap(_mlp()))
    assert _same(ref, _train(lambda ps: torch.optim.AdamW(ps), model=offload_activations(wrap(_mlp()))))


def test_offloaded_activations_send_activations_and_keep_weights():
    sent, kept = [], []
    pack, unpack = offload_hooks(False)
    def spy(t):
        out = pack(t)
        (kept if out is t else sent).append(t.shape)
        return out
    m = _mlp()
    with torch.autograd.graph.saved_tensors_hooks(spy, unpack): F.cross_entropy(m(torch.randn(4, 32)), torch.zeros(4, dtype=torch.long)).backward()
    assert sent and kept and all(len(s) == 0 or s[0] == 4 for s in sent)  # what is sent has the batch's rows (or is a scalar): no weight


def test_offload_hooks_are_left_when_forward_raises():
    m = offload_activations(_mlp(), pin_memory=True)  # on a CPU-only machine: a copy of each saved tensor, unpinned
    with pytest.raises(RuntimeError): m(torch.randn(4, 7))  # wrong width
    x = torch.randn(3, requires_grad=True); z = x.exp()
    assert z.grad_fn._saved_result.data_ptr() == z.data_ptr()  # saved as itself: the failed forward left no offload hooks entered


@pytest.mark.parametrize('base', BASES)
@pytest.mark.parametrize('grads', [False, True])
def test_host_optimizer_equals_the_ordinary_step_over_accumulation(base, grads):
    ref = _train(lambda ps: make_optimizer(base, ps), accum=2)
    assert _same(ref, _train(lambda ps: HostOptimizer(ps, base, offload_grads=grads), accum=2))


def test_host_optimizer_keeps_its_state_off_the_model_and_takes_loaded_weights():
    m = _mlp(); opt = HostOptimizer(m.parameters(), 'adamw')
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    F.cross_entropy(m(x), y).backward(); opt.step(); opt.zero_grad()
    assert state_bytes(opt) == 0 and state_bytes(opt.inner) > 0  # the outer optimizer holds nothing; the host one the moments
    fresh = _mlp(seed=5)
    m.load_state_dict(fresh.state_dict())  # e.g. a checkpoint restored into the model
    ref = copy.deepcopy(m); ropt = torch.optim.AdamW(ref.parameters()); ropt.load_state_dict(copy.deepcopy(opt.state_dict()))
    for mm, o in ((m, opt), (ref, ropt)): F.cross_entropy(mm(x), y).backward(); o.step(); o.zero_grad()
    assert _same(list(ref.parameters()), list(m.parameters()))


@pytest.mark.parametrize('base', BASES)
def test_step_in_backward_equals_the_ordinary_step(base):
    assert _same(_train(lambda ps: make_optimizer(base, ps)), _train(lambda ps: StepInBackward(ps, base)))


def test_step_in_backward_frees_each_gradient_during_backward():
    m = _mlp(); opt = StepInBackward(m.parameters())  # kept: a collected optimizer updates nothing
    F.cross_entropy(m(torch.randn(4, 32)), torch.zeros(4, dtype=torch.long)).backward()
    assert all(p.grad is None for p in m.parameters())


def test_step_in_backward_refuses_a_second_backward():
    with pytest.raises(IncompatibleStepError, match='cannot accumulate gradients'): _train(lambda ps: StepInBackward(ps), accum=2)


def test_only_the_newest_optimizer_over_a_parameter_acts():
    m = _mlp(); old = StepInBackward(m.parameters(), 'sgd', lr=0.5); keep = StepInBackward(m.parameters(), 'sgd', lr=0.1)  # both alive
    ref = _mlp(); ropt = make_optimizer('sgd', ref.parameters(), lr=0.1)
    x, y = torch.randn(4, 32), torch.zeros(4, dtype=torch.long)
    F.cross_entropy(m(x), y).backward(); keep.step()
    F.cross_entropy(ref(x), y).backward(); ropt.step()
    assert _same(list(ref.parameters()), list(m.parameters()))  # the newest one's update (lr 0.1), not the old one's


@pytest.mark.parametrize('base', ['adamw', 'adamw8bit'])
@pytest.mark.parametrize('cls', [StepInBackward, HostOptimizer])
def test_resume_from_a_saved_state(base, cls):
    def run(make, split):
        m = _mlp(); opt = make(m.parameters())
        g = torch.Generator().manual_seed(1)
        for i in range(4):
            if i == split:
                sd, w = copy.deepcopy(opt.state_dict()), copy.deepcopy(m.state_dict())
                m = _mlp(seed=9); m.load_state_dict(w); opt = make(m.parameters()); opt.load_state_dict(sd)
                dtypes = lambda d: [(k, v.dtype) for st in d['state'].values() for k, v in st.items() if isinstance(v, torch.Tensor)]
                assert dtypes(opt.state_dict()) == dtypes(sd)  # 8-bit codes come back as bytes, not floats
            F.cross_entropy(m(torch.randn(8, 32, generator=g)), torch.randint(0, 10, (8,), generator=g)).backward(); opt.step(); opt.zero_grad()
        return [p.detach() for p in m.parameters()]
    assert _same(run(lambda ps: make_optimizer(base, ps), None), run(lambda ps: cls(ps, base), 2))


@pytest.mark.parametrize('step, match', [
    (TrainingStep(optimizer='adamw-in-backward', micro_batch=4), 'cannot accumulate'),
    (TrainingStep(optimizer='adamw-in-backward', precision='fp16'), 'loss scaling'),
    (TrainingStep(optimizer='sgd-offload-grads', precision='fp16'), 'loss scaling')])
def test_refusals(step, match):
    with pytest.raises(IncompatibleStepError, match=match): check_offload(step, 16)


def test_refusals_of_clip_data_parallel_and_the_cpu():
    with pytest.raises(IncompatibleStepError, match='global-norm clip'): check_offload(TrainingStep(optimizer='adamw-in-backward'), 8, clip_grad=1.0)
    with pytest.raises(IncompatibleStepError, match='data-parallel'): check_offload(TrainingStep(optimizer='adamw-offload-grads'), 8, distributed=True)
    with pytest.raises(IncompatibleStepError, match='same memory'): check_offload(TrainingStep(optimizer='adamw-offload'), 8, Target('cpu', 'cpu', 2**34))
    check_offload(TrainingStep(optimizer='adamw-offload', precision='fp16', micro_batch=2), 8, clip_grad=1.0, distributed=True)  # all fine together
    check_offload(TrainingStep(optimizer='adamw-offload-grads'), 8, clip_grad=1.0)  # the host optimizer clips on the host (chapter 07)


def _wide():
    return nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def test_plan_moves_state_and_activations_to_host_rows():
    b = (torch.empty(64, 512, device='meta'), torch.empty(64, dtype=torch.long, device='meta'))
    base = plan_memory(_wide(), b, device_or_gpu='gtx 1650')
    off = plan_memory(_wide(), b, device_or_gpu='gtx 1650', optimizer='adamw-offload-grads', transform=offload_activations)
    assert off.breakdown['optimizer'] == 0 and base.breakdown['optimizer'] > 0 and off.total < base.total
    steps = 4 * len(list(_wide().parameters()))  # AdamW's step counters: CPU tensors, outside a device plan's trace, on the host here
    assert off.host['host: optimizer state (pageable)'] == base.breakdown['optimizer'] + steps
    assert off.host['bus per step'] > 0 and 'ms' in off.host['offload time per step'] and not base.host
    assert any('PCIe 3.0 x16 (the GPU catalogue)' in n for n in off.notes) and any('of RAM' in n for n in off.notes)


@pytest.mark.parametrize('base, d', [('adamw', 32), ('adamw8bit', 256)])  # 8-bit state from 4096 values a tensor: a plan makes it without an update
def test_plan_host_terms_match_a_real_cpu_run(base, d):
    "The host bytes a plan records equal those the real mechanisms hold on this CPU: the host optimizer's state, the tensors save_on_cpu keeps."
    b = (torch.empty(16, d, device='meta'), torch.empty(16, dtype=torch.long, device='meta'))
    plan = plan_memory(_mlp(d=d), b, optimizer=f'{base}-offload', transform=offload_activations)  # no device named: tensor bytes only
    m = _mlp(d=d); opt = HostOptimizer(m.parameters(), base)
    held = []
    pack, unpack = offload_hooks(False)
    def spy(t):
        out = pack(t)
        if out is not t: held.append(out[1].numel() * out[1].element_size())
        return out
    x, y = torch.randn(16, d), torch.randint(0, 10, (16,))
    with torch.autograd.graph.saved_tensors_hooks(spy, unpack): out = m(x)  # the model's forward, as offload_activations wraps it
    loss = F.cross_entropy(out, y)
    assert plan.host['host: saved activations (pinned)'] == sum(held)
    loss.backward(); opt.step()
    assert plan.host['host: optimizer state (pageable)'] == state_bytes(opt.inner)


def test_planner_refuses_and_fit_to_budget_never_pairs_step_in_backward_with_accumulation():
    b = (torch.empty(64, 512, device='meta'), torch.empty(64, dtype=torch.long, device='meta'))
    with pytest.raises(IncompatibleStepError): plan_memory(_wide(), b, device_or_gpu='gtx 1650', optimizer='adamw-in-backward', micro_batch=8)
    base = plan_memory(_wide(), b, device_or_gpu='gtx 1650')
    changes = fit_to_budget(_wide(), b, budget=base.total - base.breakdown['activations'] // 2 - base.breakdown['gradients'] // 4, device_or_gpu='gtx 1650')
    assert any(c.new_plan.optimizer.endswith(('-offload', '-offload-grads', '-in-backward')) for c in changes)
    # a lever that would pair them is re-planned, refused by `check_offload`, and left out rather than proposed (or raised)
    bad = [('step in backward with accumulation', dict(optimizer='adamw-in-backward', micro_batch=8), 0.0),
           ('step in backward with fp16 loss scaling', dict(optimizer='adamw-in-backward', precision='fp16'), 0.0)]
    more = fit_to_budget(_wide(), b, budget=base.total // 2, device_or_gpu='gtx 1650', levers=bad)
    assert not any(c.description.startswith('step in backward with') for c in more)
    changes += more
    for c in changes:
        p = c.new_plan
        assert not (p.optimizer.endswith('-in-backward') and (p.micro_batch < p.batch_size or p.precision == 'fp16')), c


def test_fit_to_budget_on_the_cpu_offers_no_offload():
    b = (torch.empty(8, 32, device='meta'), torch.empty(8, dtype=torch.long, device='meta'))
    assert not any('03a' in c.description for c in fit_to_budget(_mlp(), b, budget=10**6, device_or_gpu='cpu'))


def test_pcie_link_from_the_catalogue_and_a_faked_nvml(monkeypatch):
    assert pcie_link(Target('GeForce GTX 1050 Ti', 'cuda', 4 * 2**30))[:2] == (3, 16)
    assert pcie_link(Target('GeForce RTX 3060', 'cuda', 12 * 2**30))[:2] == (4, 16)
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
                                 nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 4, nvmlDeviceGetMaxPcieLinkWidth=lambda h: 8)
    monkeypatch.setitem(sys.modules, 'pynvml', fake)
    assert nvml_pcie_link(0) == (4, 8)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda i=0: 'GeForce RTX 3060')
    assert pcie_link(Target('GeForce RTX 3060', 'cuda', 12 * 2**30)) == (4, 8, 'NVML')


def test_backend_is_ours_without_cuda():
    assert host_optimizer_backend('cpu') == 'netlite_nb'
    if not torch.cuda.is_available(): assert host_optimizer_backend('cuda') == 'netlite_nb'


def _trainer_run(**kw):
    from netlite_nb.train import Trainer
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16)
    m = _mlp()
    t = Trainer(m, (dl, None), device='cpu', precision='fp32', verbose=False, progress=False, plan=False, lr_schedule=None, warmup=0,
                threads=None, check_data=False, **kw)
    t.fit(2)
    return [p.detach().clone() for p in m.parameters()]


@pytest.mark.parametrize('kw', [dict(optimizer='adamw-in-backward'), dict(optimizer='adamw-offload'), dict(offload='activations'),
                                dict(optimizer='adamw-offload-grads', accum_steps=2, micro_batch=8)])
def test_trainer_switches_offloads_on_by_name(kw):
    ref = _trainer_run(**{k: v for k, v in kw.items() if k in ('accum_steps', 'micro_batch')})
    assert _same(ref, _trainer_run(**kw))


@pytest.mark.parametrize('kw, match', [(dict(optimizer='adamw-in-backward', accum_steps=2, micro_batch=8), 'cannot accumulate'),
                                       (dict(optimizer='sgd-in-backward', clip_grad=1.0), 'global-norm clip'),
                                       (dict(offload='optimizer'), 'optimizer names')])
def test_trainer_refuses_impossible_offloads(kw, match):
    with pytest.raises(ValueError, match=match): _trainer_run(**kw)


# --- half-precision weights on the card, fp32 masters on the host (ZeRO-Offload) ---

def _half_run(dtype, host=True, steps=3):
    "`steps` AdamW steps of a half-weight `_mlp`: by HostOptimizer, or by hand (fp32 masters, rounded copies, unscaled fp32 gradients)."
    from netlite_nb.offload import half_weights
    m = half_weights(_mlp(), dtype)
    if host: opt = HostOptimizer(m.parameters(), 'adamw', offload_grads=True); ws = list(opt.host.values())
    else: ws = [p.detach().float().clone().requires_grad_() for p in m.parameters()]; opt = make_optimizer('adamw', ws)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        if not host:
            with torch.no_grad():
                for p, w in zip(m.parameters(), ws): p.copy_(w)
        F.cross_entropy(m(torch.randn(8, 32, generator=g)), torch.randint(0, 10, (8,), generator=g)).backward()
        if not host:
            s = m[0].weight._loss_scale
            for p, w in zip(m.parameters(), ws): w.grad, p.grad = p.grad.float() * (1 / (s.scale if s else 1.0)), None
        opt.step(); opt.zero_grad()
    return ws, m, opt


@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
def test_half_weights_keep_fp32_masters_on_the_host_bit_for_bit(dtype):
    ws, m, opt = _half_run(dtype)
    assert _same(ws, _half_run(dtype, host=False)[0])
    assert {w.dtype for w in ws} == {torch.float32} and {p.dtype for p in m.parameters()} == {torch.float16 if dtype == 'fp16' else torch.bfloat16}
    assert all(torch.equal(p, w.to(p.dtype)) for p, w in zip(m.parameters(), ws))
    assert opt.skipped == 0


def test_half_weights_accumulate_in_fp32_on_the_host():
    "Two micro-batches: the second half-precision gradient is added to the first in fp32, as the hand-written step does."
    from netlite_nb.offload import half_weights
    m = half_weights(_mlp(), 'bf16'); opt = HostOptimizer(m.parameters(), 'adamw', lr=0.0, weight_decay=0.0, offload_grads=True)
    g = torch.Generator().manual_seed(2); xs = [torch.randn(8, 32, generator=g) for _ in range(2)]; y = torch.randint(0, 10, (8,), generator=g)
    grads = []
    for x in xs:
        ref = half_weights(_mlp(), 'bf16'); F.cross_entropy(ref(x), y).backward(); grads.append([p.grad.float() for p in ref.parameters()])
        F.cross_entropy(m(x), y).backward()
    opt.step()  # lr 0: the weights stay, the host gradients are left for us to read
    assert all(torch.equal(h.grad, a + b) for h, a, b in zip(opt.host.values(), *grads))


def test_fp16_overflow_skips_the_step_and_halves_the_scale():
    _, m, opt = _half_run('fp16', steps=1)
    before, scale = [h.clone() for h in opt.host.values()], opt.loss_scale.scale
    (m(torch.randn(8, 32)).sum() * 1e30).backward(); opt.step()
    assert opt.skipped == 1 and opt.loss_scale.scale == scale / 2 and _same(before, list(opt.host.values()))
    sd = opt.state_dict(); opt.zero_grad()
    _, _, opt2 = _half_run('fp16', steps=1); opt2.load_state_dict(sd)
    assert opt2.loss_scale.scale == scale / 2


def test_plan_of_half_weights_keeps_two_bytes_a_weight_on_the_card():
    from netlite_nb.offload import half_weights_fp16
    b = (torch.empty(64, 512, device='meta'), torch.empty(64, dtype=torch.long, device='meta'))
    full = plan_memory(_wide(), b, device_or_gpu='gtx 1650', optimizer='adamw-offload-grads')
    half = plan_memory(_wide(), b, device_or_gpu='gtx 1650', optimizer='adamw-offload-grads', transform=half_weights_fp16)
    assert half.breakdown['weights'] * 2 == full.breakdown['weights'] == 4 * half.params
    assert half.host['host: weights (pinned)'] == full.host['host: weights (pinned)'] == 4 * half.params  # fp32 masters
    assert full.host['host: gradients (pinned)'] == 2 * half.host['host: gradients (pinned)'] == 4 * half.params  # each lands in the device's dtype
    assert half.host['host: fp32 gradients (pageable)'] == 4 * half.params and 'host: fp32 gradients (pageable)' not in full.host  # the masters' at the step
    assert half.host['bus per step'] * 2 == full.host['bus per step']  # half-precision gradients out, half-precision weights back


@pytest.mark.parametrize('step, match', [(dict(optimizer='adamw'), 'master weights'), (dict(optimizer='adamw-in-backward'), 'master weights'),
                                         (dict(optimizer='adamw-offload', precision='fp16'), 'GradScaler')])
def test_half_weights_refusals(step, match):
    from netlite_nb.offload import half_weights_fp16
    with pytest.raises(IncompatibleStepError, match=match): check_offload(TrainingStep(transform=half_weights_fp16, **step), 8)


def test_bf16_weights_refused_where_bf16_is_emulated():
    from netlite_nb.offload import half_weights_bf16
    b = (torch.empty(8, 32, device='meta'), torch.empty(8, dtype=torch.long, device='meta'))
    with pytest.raises(IncompatibleStepError, match='no bf16 arithmetic'):
        plan_memory(_mlp(), b, device_or_gpu='gtx 1650', optimizer='adamw-offload-grads', transform=half_weights_bf16)
    plan_memory(_mlp(), b, device_or_gpu='rtx 3060', optimizer='adamw-offload-grads', transform=half_weights_bf16)


def test_trainer_trains_half_weights_against_host_masters():
    from netlite_nb.train import Trainer
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16)
    m = _mlp(); w0 = [p.detach().clone() for p in m.parameters()]
    t = Trainer(m, (dl, None), device='cpu', precision='fp32', verbose=False, progress=False, plan=False, lr_schedule=None, warmup=0,
                threads=None, check_data=False, optimizer='adamw-offload-grads', offload='bf16-weights')
    t.fit(1)
    ps = list(t.model.parameters())
    assert {id(p) for p in t.opt.host} == {id(p) for p in ps}  # the optimizer was built over the converted weights
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, h.to(p.dtype)) for p, h in t.opt.host.items())
    assert all(not torch.equal(h, w) for h, w in zip(t.opt.host.values(), w0))  # it trained


# --- pricing the levers by their plan ---

def test_offload_levers_are_priced_by_their_bus_and_host_bytes():
    from netlite_nb.offload import offload_seconds, step_seconds
    from netlite_nb.memory.trace import resolve_target
    b = (torch.empty(64, 512, device='meta'), torch.empty(64, dtype=torch.long, device='meta'))
    base = plan_memory(_wide(), b, device_or_gpu='gtx 1650')
    changes = fit_to_budget(_wide(), b, budget=base.total - base.breakdown['gradients'] // 2, device_or_gpu='gtx 1650')
    target, off = resolve_target('gtx 1650'), [c for c in changes if '03a' in c.description and 'inside backward' not in c.description]
    assert off
    step = step_seconds(_wide(), b, target)[0]
    assert step == pytest.approx(3 * 2 * 64 * sum(p.numel() for n, p in _wide().named_parameters() if n.endswith('weight')) / (lookup_tflops('gtx 1650') * 1e12))
    for c in off:
        h = c.new_plan.host
        assert c.slowdown == round(offload_seconds(h['bus per step'], h['host traffic per step'], target)[0] / step, 3), c


def lookup_tflops(name):
    from netlite_nb.probe import lookup_gpu
    return lookup_gpu(name).fp32_tflops


# --- an out-of-memory error in the middle of the step inside backward ---

def test_trainer_never_retries_a_half_applied_step_in_backward():
    from netlite_nb.train import Trainer
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16)
    m = _mlp()
    fired = []
    def oom(grad):  # the first layer's weight gradient fails once: the layers after it were already stepped
        if not fired: fired.append(1); raise torch.OutOfMemoryError("CUDA out of memory (faked mid-backward)")
    m[0].weight.register_hook(oom)
    t = Trainer(m, (dl, None), device='cpu', precision='fp32', verbose=False, progress=False, plan=False, lr_schedule=None, warmup=0,
                threads=None, check_data=False, optimizer='adamw-in-backward')
    with pytest.raises(IncompatibleStepError, match='already updated 5 of 6 parameters'): t.fit(1)


# --- weights streamed from the host, block by block (ZeRO-Infinity / FSDP CPU offload) ---

def _stack(seed=0, d=16):
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)) for _ in range(4)])


def _stack_run(m, steps=3, accum=1, opt='adamw'):
    o, g = make_optimizer(opt, m.parameters()), torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _ in range(accum):
            x = torch.randn(4, 16, generator=g); (F.mse_loss(m(x), x) / accum).backward()
        o.step(); o.zero_grad()
    return [p.detach().clone() for p in m.parameters()]


@pytest.mark.parametrize('checkpointed', [False, True])
@pytest.mark.parametrize('accum', [1, 2])
@pytest.mark.parametrize('opt', ['adamw', 'adamw8bit'])
def test_streamed_weights_train_to_the_same_weights(checkpointed, accum, opt):
    from netlite_nb.offload import stream_weights
    wrap = (lambda m: checkpoint_every(m, k=2)) if checkpointed else (lambda m: m)
    assert _same(_stack_run(wrap(_stack()), accum=accum, opt=opt), _stack_run(stream_weights(wrap(_stack())), accum=accum, opt=opt))


def test_streamed_weights_are_copied_per_block_and_freed():
    import weakref
    from netlite_nb.offload import stream_weights
    from netlite_nb.memory.trace import is_host_resident
    m = stream_weights(checkpoint_every(_stack(), k=2))
    host = {id(p) for p in m.parameters()}
    seen = []  # (block, what its first layer's weight is while the block runs)
    for i, blk in enumerate(m): blk[0].register_forward_pre_hook(lambda mod, a, i=i: seen.append((i, id(mod.weight) in host, weakref.ref(mod.weight))))
    x = torch.randn(4, 16)
    F.mse_loss(m(x), x).backward()
    assert [i for i, _, _ in seen] == [0, 1, 2, 3, 0, 1]  # each block in forward; the checkpointed segment (blocks 0, 1) again in its recompute
    assert not any(h for _, h, _ in seen) and all(r() is None for _, _, r in seen)  # copies, every one freed
    assert all(is_host_resident(p) and p.grad is not None for p in m.parameters())  # the gradients landed on the host parameters
    assert all(m[0][0]._parameters['weight'] is p for p in [m[0][0].weight])  # the module holds its host parameter again


def test_streamed_weights_refusals():
    from netlite_nb.offload import stream_weights
    with pytest.raises(ValueError, match='no stack of blocks'): stream_weights(nn.Linear(4, 4))
    for step in (TrainingStep(optimizer='adamw-offload-grads', transform=stream_weights), TrainingStep(optimizer='adamw-offload', transform=stream_weights)):
        with pytest.raises(IncompatibleStepError, match='already live on the host'): check_offload(step, 16)
    with pytest.raises(IncompatibleStepError, match='data-parallel'): check_offload(TrainingStep(transform=stream_weights), 16, distributed=True)
    with pytest.raises(IncompatibleStepError, match='same memory'): check_offload(TrainingStep(transform=stream_weights), 16, Target('cpu', 'cpu', 2**34))
    check_offload(TrainingStep(optimizer='adamw8bit', transform=stream_weights, micro_batch=4), 16, clip_grad=1.0)  # an ordinary optimizer on the host: allowed


def test_trainer_streams_weights_by_name():
    assert _same(_trainer_run(), _trainer_run(offload='stream-weights'))
    assert _same(_trainer_run(accum_steps=2, micro_batch=8), _trainer_run(offload='stream-weights', accum_steps=2, micro_batch=8))
    with pytest.raises(ValueError, match='already live on the host'): _trainer_run(offload='stream-weights', optimizer='adamw-offload-grads')


def test_trainer_builds_its_optimizer_over_the_streamed_weights(monkeypatch):
    "The optimizer is built after streaming moved the weights to the host, so it is chosen for where they live (8-bit AdamW picks its kernels by device)."
    import netlite_nb.train as T
    from netlite_nb.memory.trace import is_host_resident
    seen, real = [], T.make_optimizer
    def spy(spec, params, **kw):
        params = list(params); seen.append(any(is_host_resident(p) for p in params))
        return real(spec, params, **kw)
    monkeypatch.setattr(T, 'make_optimizer', spy)
    _trainer_run(offload='stream-weights', optimizer='adamw8bit')
    assert seen and seen[-1], seen


def test_plan_of_streamed_weights_matches_a_real_cpu_run():
    from netlite_nb.offload import stream_weights, stream_weights_checkpointed
    from netlite_nb.memory.trace import is_host_resident
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)
    d, b = 32, (torch.empty(8, 16, 32, device='meta'), torch.empty(8, 16, 32, device='meta'))
    stack = lambda: nn.Sequential(*[nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(4)])
    base = plan_memory(stack(), b, loss_fn=F.mse_loss, device_or_gpu='rtx 3060')
    plan = plan_memory(stack(), b, loss_fn=F.mse_loss, device_or_gpu='rtx 3060', transform=stream_weights_checkpointed)
    assert (plan.breakdown['weights'], plan.breakdown['gradients'], plan.breakdown['optimizer']) == (0, 0, 0) and plan.total < base.total
    m = stream_weights_checkpointed(stack()); opt = make_optimizer('adamw', m.parameters())
    copies = []
    for blk in m: blk.register_forward_pre_hook(lambda mod, a: copies.append(nbytes(p for p in mod.parameters() if not is_host_resident(p))))
    x = torch.randn(8, 16, d); F.mse_loss(m(x), x).backward()
    grads = nbytes(p.grad for p in m.parameters()); opt.step()
    assert plan.host['host: streamed weights (pinned)'] == nbytes(m.parameters()) == grads == plan.host['host: streamed gradients (pageable)']
    assert plan.host['host: optimizer state (pageable)'] == state_bytes(opt)  # the moments, and each parameter's step count
    assert plan.host['bus per step'] == sum(copies) + grads  # the copies the hooks made (forward and recompute), the gradients once
    assert plan.host_held == 2 * grads + state_bytes(opt)  # these sizes are powers of two: the pinned allocator rounds nothing
    # a model streamed for real plans as its transform does: the marks travel with the planner's copy
    assert plan_memory(stream_weights(checkpoint_every(stack(), k=1)), b, loss_fn=F.mse_loss, device_or_gpu='rtx 3060').host == plan.host


def test_fit_to_budget_offers_streamed_weights_when_only_they_fit():
    from netlite_nb.offload import stream_weights_checkpointed
    deep = lambda: nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)])
    b = (torch.empty(16, 2048, device='meta'), torch.empty(16, 2048, device='meta'))
    streamed = plan_memory(deep(), b, device_or_gpu='gtx 1650', transform=stream_weights_checkpointed)  # less than half-precision weights leave
    changes = fit_to_budget(deep(), b, budget=streamed.total, device_or_gpu='gtx 1650')
    fitting = [c for c in changes if c.fits]
    assert fitting and all('stream_weights' in c.new_plan.transform for c in fitting), [str(c) for c in changes[:4]]
    assert all(c.new_plan.breakdown['weights'] == 0 and c.slowdown > 0 for c in fitting)


def test_streamed_bf16_weights_with_stochastic_rounding_train_to_the_same_weights():
    "Chapter 03's bf16 weights with 8-bit state rounded stochastically, streamed: the host's update is the card's, bit for bit."
    from netlite_nb.offload import stream_weights
    from netlite_nb.optim import bf16_weights
    def run(m, steps=3, accum=2):
        o, g = make_optimizer('adamw8bit-bf16sr', m.parameters()), torch.Generator().manual_seed(1)
        torch.manual_seed(5)  # the stochastic rounding's draws
        for _ in range(steps):
            for _ in range(accum):
                x = torch.randn(4, 16, generator=g).bfloat16(); (F.mse_loss(m(x).float(), x.float()) / accum).backward()
            o.step(); o.zero_grad()
        return [p.detach().clone() for p in m.parameters()]
    ref = run(checkpoint_every(bf16_weights(_stack()), k=1))
    assert ref[0].dtype == torch.bfloat16 and _same(ref, run(stream_weights(checkpoint_every(bf16_weights(_stack()), k=1))))


def test_a_streamed_copy_that_fails_midway_leaves_the_host_weights_in_place(monkeypatch):
    "A weight copy that raises (out of memory on the N-th weight) is undone: the block holds its host Parameters, and training then updates what forward uses."
    from netlite_nb.offload import stream_weights
    m = stream_weights(_stack())
    real, calls = torch.empty_like, []
    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 2: raise torch.OutOfMemoryError('simulated')
        return real(*a, **k)
    monkeypatch.setattr(torch, 'empty_like', failing)
    with pytest.raises(torch.OutOfMemoryError): m(torch.randn(4, 16))
    monkeypatch.setattr(torch, 'empty_like', real)
    assert all(isinstance(p, nn.Parameter) for mod in m.modules() for p in mod._parameters.values())
    assert _same(_stack_run(m), _stack_run(stream_weights(_stack())))


def test_streaming_refuses_recurrent_layers_and_a_copy_of_a_streamed_model_still_fetches():
    "A GRU's forward reads `_flat_weights`, which a swap does not reach: refused with a sentence (and not offered). A deepcopy (an EMA model) loses the marks but still fetches."
    import copy
    from netlite_nb.offload import stream_weights
    rnn = nn.Sequential(nn.GRU(8, 8, batch_first=True), nn.GRU(8, 8, batch_first=True))
    with pytest.raises(ValueError, match='cannot stream a GRU'): stream_weights(rnn)
    m = stream_weights(_stack())
    twin = copy.deepcopy(m)   # torch.optim.swa_utils.AveragedModel copies the model this way
    x = torch.randn(4, 16, device='meta')   # inputs on another device than the host weights: each block must fetch them
    assert twin(x).device.type == 'meta' and m(x).device.type == 'meta'
    assert all(isinstance(p, nn.Parameter) and p.device.type == 'cpu' for p in twin.parameters())


def test_streamed_block_interrupted_by_ctrl_c_fetches_again():
    "Ctrl-C inside a block's forward skips its `always_call` hook (it runs on an Exception only): the next forward puts the host Parameters back and fetches afresh."
    from netlite_nb.offload import stream_weights
    def run(interrupted:bool):
        m = stream_weights(_stack()); o, g = make_optimizer('adamw', m.parameters()), torch.Generator().manual_seed(1)  # as a Trainer: built before
        if interrupted:
            h = m[1][1].register_forward_pre_hook(lambda mod, args: (_ for _ in ()).throw(KeyboardInterrupt))  # inside block 1, its weights fetched
            with pytest.raises(KeyboardInterrupt): m(torch.randn(4, 16))
            h.remove()
        for _ in range(3):
            x = torch.randn(4, 16, generator=g); F.mse_loss(m(x), x).backward(); o.step(); o.zero_grad()
        return m, [p.detach().clone() for p in o.param_groups[0]['params']]
    (m, after), (_, clean) = run(True), run(False)
    assert _same(after, clean)  # else block 1 ran on its stale copies while AdamW updated the host weights
    assert all(isinstance(p, nn.Parameter) for mod in m.modules() for p in mod._parameters.values())


def test_host_weights_are_back_right_after_a_ctrl_c_and_a_block_may_call_itself():
    "`restore_host_weights` (which the Trainer calls on Ctrl-C) puts the host Parameters back at once, so an optimizer built next holds them; a block calling itself inside its forward keeps its copies."
    from netlite_nb.offload import restore_host_weights, stream_weights
    m = stream_weights(_stack())
    h = m[1][1].register_forward_pre_hook(lambda mod, args: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt): m(torch.randn(4, 16))
    h.remove()
    assert not all(isinstance(p, nn.Parameter) for p in m.parameters())  # the copies block 1 fetched are still in place
    make_optimizer('adamw', restore_host_weights(m).parameters())  # before: "can't optimize a non-leaf Tensor"
    assert all(isinstance(p, nn.Parameter) and p.device.type == 'cpu' for p in m.parameters())
    class Deep(nn.Module):  # a block that runs itself again, one level down, before its own layer
        def __init__(s): super().__init__(); s.lin = nn.Linear(8, 8)
        def forward(s, x, depth=1): return s.lin(s(x, depth - 1) if depth else x)
    net = stream_weights(nn.Sequential(Deep(), Deep()))
    assert net(torch.randn(2, 8, device='meta')).device.type == 'meta'  # the inner call must not put the outer call's copies back


def test_trainer_interrupted_inside_a_streamed_block_keeps_training_the_host_weights():
    "Ctrl-C during `fit` inside a streamed block's forward: the Trainer puts the host weights back before it saves, and a second fit trains what the optimizer holds."
    from netlite_nb.train import Trainer
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16)
    m = _mlp()
    t = Trainer(m, (dl, None), device='cpu', precision='fp32', verbose=False, progress=False, plan=False, lr_schedule=None, warmup=0,
                threads=None, check_data=False, offload='stream-weights')
    calls = []
    def ctrl_c(mod, args):
        calls.append(1)
        if len(calls) == 3: raise KeyboardInterrupt
    h = m[2].register_forward_pre_hook(ctrl_c)
    t.fit(1)
    h.remove()
    assert t.interrupted and all(isinstance(p, nn.Parameter) for p in m.parameters())
    held = {id(p) for g in t.opt.param_groups for p in g['params']}
    assert {id(p) for p in m.parameters()} == held


def test_streaming_picks_the_stack_that_leaves_least_on_the_device_and_fetches_to_the_inputs_device():
    "Sequential(Embedding, Sequential(8 blocks), Linear): the inner blocks stream one at a time, not the inner stack as one block; a CPU index tensor before the activations does not decide where weights go."
    from netlite_nb.memory.trace import is_host_resident
    from netlite_nb.offload import stream_weights
    torch.manual_seed(0)
    inner = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
    m = stream_weights(nn.Sequential(nn.Embedding(100, 64), inner, nn.Linear(64, 10)))
    assert all(is_host_resident(p) for p in inner.parameters()) and not is_host_resident(m[0].weight) and not is_host_resident(m[2].weight)
    assert sum(len(b._forward_pre_hooks) for b in inner) == 8 and not inner._forward_pre_hooks
    class Gated(nn.Module):  # a block called with (mask on the CPU, activations elsewhere)
        def __init__(s): super().__init__(); s.lin = nn.Linear(8, 8)
        def forward(s, mask, x): return s.lin(x) * mask.to(x.device)
    class Net(nn.Module):
        def __init__(s): super().__init__(); s.blocks = nn.ModuleList([Gated(), Gated()])
        def forward(s, x):
            mask = torch.ones(8)
            for b in s.blocks: x = b(mask, x)
            return x
    assert stream_weights(Net())(torch.randn(2, 8, device='meta')).device.type == 'meta'
    class PreBody(nn.Module):  # a stack without weights, then one whose single block holds them all: nothing to take turns
        def __init__(s): super().__init__(); s.pre, s.body = nn.Sequential(nn.Dropout(), nn.ReLU()), nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        def forward(s, x): return s.body(s.pre(x))
    with pytest.raises(ValueError, match='two or more blocks that hold weights'): stream_weights(PreBody())  # not: nothing streamed, silently
