"Chapter 02 (layers): cross-checks against plain PyTorch that are heavier than the notebook's, and ONNX export."
import copy
import pytest, torch, torch.nn as nn, torch.nn.functional as F
from netlite_nb.budget import fit_to_budget, plan_memory
from netlite_nb.memory.trace import AllocationTracker
from netlite_nb.layers import (ChunkedFFN, ChunkedLinearCrossEntropy, BitReLU, BitDropout, CheckpointedSequential,
                               chunked_linear_cross_entropy, memory_transform, checkpoint_every, convert_model, saved_bytes, ChunkedFFNFn,
                               measure_step)

torch.set_num_threads(1)


def _step_peak(fn):
    with AllocationTracker(None) as tr: fn().backward()
    return tr.peak


def test_chunked_ffn_gradcheck_and_plain_equivalence():
    torch.manual_seed(0)
    f = ChunkedFFN(6, 24, act='gelu').double()
    x = torch.randn(11, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *p: ChunkedFFNFn.apply(x, *p, f[1], 4), (x, *f.parameters()))
    x = torch.randn(4, 9, 6, dtype=torch.float64, requires_grad=True)
    f.chunk_size = 5
    (f(x) ** 2).sum().backward()
    g = [x.grad.clone()] + [p.grad.clone() for p in f.parameters()]
    x.grad = None; f.zero_grad()
    (nn.Sequential.forward(f, x) ** 2).sum().backward()
    for a, b in zip(g, [x.grad] + [p.grad for p in f.parameters()]): torch.testing.assert_close(a, b)


def test_chunked_ffn_saves_a_ninth_and_lower_peak():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
    ours = ChunkedFFN.from_sequential(copy.deepcopy(plain))
    x = torch.randn(4096, 128, requires_grad=True)  # big enough that activations, not weight grads, dominate
    sp, so = saved_bytes(plain, x, exclude=plain.parameters()), saved_bytes(ours, x, exclude=ours.parameters())
    assert so * 9 == sp
    pp, po = _step_peak(lambda: plain(x).sum()), _step_peak(lambda: ours(x).sum())
    assert po <= pp / 3, (po, pp)


def test_chunked_ce_matches_and_peak_is_5x_lower():
    torch.manual_seed(0)
    n, d, v = 2048, 64, 8192
    head = nn.Linear(d, v)
    x = torch.randn(n, d, requires_grad=True)
    y = torch.randint(0, v, (n,)); y[::7] = -100
    for ls, red in [(0.0, 'mean'), (0.1, 'sum'), (0.05, 'mean')]:
        l = chunked_linear_cross_entropy(x, head.weight, head.bias, y, label_smoothing=ls, reduction=red)
        l.backward()
        g = (x.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())
        x.grad = None; head.zero_grad()
        r = F.cross_entropy(head(x), y, label_smoothing=ls, reduction=red); r.backward()
        torch.testing.assert_close(l, r, rtol=1e-4, atol=1e-4)
        for a, b in zip(g, (x.grad, head.weight.grad, head.bias.grad)): torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)
        x.grad = None; head.zero_grad()
    pp = _step_peak(lambda: F.cross_entropy(head(x), y))
    po = _step_peak(lambda: chunked_linear_cross_entropy(x, head.weight, head.bias, y))
    assert po * 5 <= pp, (po, pp)


def test_chunked_ce_bf16_input_close_to_fp32():
    torch.manual_seed(0)
    x, w = torch.randn(300, 32), torch.randn(50, 32) / 6
    y = torch.randint(0, 50, (300,))
    l16 = chunked_linear_cross_entropy(x.bfloat16(), w.bfloat16(), None, y, chunk_size=64)
    assert l16.dtype == torch.bfloat16
    torch.testing.assert_close(l16.float(), F.cross_entropy(x @ w.t(), y), rtol=2e-2, atol=2e-2)


def test_module_head_and_all_ignored():
    h = ChunkedLinearCrossEntropy(8, 5, ignore_index=3)
    x, y = torch.randn(10, 8), torch.full((10,), 3)
    assert torch.isnan(h(x, y))  # like F.cross_entropy: 0 / 0 rows
    assert torch.isnan(F.cross_entropy(h.logits(x), y, ignore_index=3))


def test_bit_activations_saved_ratio():
    for dt in (torch.float32, torch.float16):
        x = torch.randn(512, 512, dtype=dt, requires_grad=True)
        base = saved_bytes(lambda t: t * 1, x)
        plain = saved_bytes(lambda t: F.relu(t * 1), x) - base
        bits = saved_bytes(lambda t: BitReLU()(t * 1), x) - base
        assert bits * 16 <= plain, (dt, bits, plain)


def test_bit_relu_in_place_detects_unsafe_use():
    # exp saves its output; overwriting it in place must be caught, as with nn.ReLU(inplace=True)
    x = torch.randn(50, requires_grad=True)
    y = BitReLU(inplace=True)(x.exp())
    with pytest.raises(RuntimeError): y.sum().backward()


def test_checkpoint_bn_stats_updated_once_and_grads_equal():
    torch.manual_seed(0)
    layers = []
    for _ in range(5): layers += [nn.Linear(12, 12), nn.BatchNorm1d(12, momentum=None), nn.ReLU(), nn.Dropout(0.2)]
    plain = nn.Sequential(*layers); ck = checkpoint_every(copy.deepcopy(plain), k=3)
    x = torch.randn(16, 12, requires_grad=True)
    for _ in range(2):
        torch.manual_seed(5); yp = plain(x); (yp ** 2).sum().backward()
        torch.manual_seed(5); yc = ck(x); (yc ** 2).sum().backward()
        torch.testing.assert_close(yp, yc)
    for a, b in zip(plain.parameters(), ck.parameters()): torch.testing.assert_close(a.grad, b.grad)
    for (n, a), b in zip(plain.named_buffers(), ck.buffers()): torch.testing.assert_close(a, b, msg=n)
    assert ck[1].num_batches_tracked.item() == 2


def test_convert_model_keeps_weights_and_eval_is_plain():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)),
                      nn.Dropout(0.1), nn.Linear(16, 3))
    ref = copy.deepcopy(m)
    convert_model(m, checkpoint=2)
    kinds = {b for _, _, b in m.netlite_conversion.swapped}
    assert {'BitReLU', 'ChunkedFFN', 'BitDropout'} <= kinds and isinstance(m, CheckpointedSequential)
    assert list(m.state_dict()) == list(ref.state_dict())
    ref.load_state_dict(m.state_dict())  # the keys still load into the unconverted model
    m.eval(); ref.eval()
    x = torch.randn(7, 8)
    assert torch.equal(m(x), ref(x))
    # training mode (without dropout, whose masks differ between implementations): same values and gradients
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)),
                      nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    ref = copy.deepcopy(m); convert_model(m, checkpoint=2)
    x = torch.randn(7, 8, requires_grad=True)
    ym = m(x); (ym ** 2).sum().backward(); gm = [x.grad.clone()] + [p.grad for p in m.parameters()]; x.grad = None
    yr = ref(x); (yr ** 2).sum().backward(); gr = [x.grad] + [p.grad for p in ref.parameters()]
    torch.testing.assert_close(ym, yr)
    for a, b in zip(gm, gr): torch.testing.assert_close(a, b)
    for a, b in zip(m.buffers(), ref.buffers()): torch.testing.assert_close(a, b)


def test_bad_input_messages():
    with pytest.raises(ValueError, match='chunk_size'): ChunkedFFN(4, 8, chunk_size=0)
    # a fixed chunk_size is an upper bound for ChunkedFFN (a strategy sets one for every model); the explicit loss head still refuses
    f = ChunkedFFN(4, 8, chunk_size=32); x = torch.randn(5, 4)
    torch.testing.assert_close(f(x), f[2](f[1](f[0](x))))
    with pytest.raises(ValueError, match='larger than the input'): chunked_linear_cross_entropy(torch.randn(5, 4), torch.randn(3, 4), None, torch.zeros(5, dtype=torch.long), chunk_size=32)
    with pytest.raises(ValueError, match='`k`'): checkpoint_every([nn.Linear(2, 2)] * 3, k=-1)
    f = ChunkedFFN(4, 8); f[2].weight = nn.Parameter(torch.randn(4, 8, device='meta'))
    with pytest.raises(ValueError, match=r'`2\.weight`.*model\.to'): f(torch.randn(5, 4))


@pytest.mark.filterwarnings('ignore::DeprecationWarning')
def test_onnx_export_of_converted_model_in_eval(tmp_path):
    onnx = pytest.importorskip('onnx'); ort = pytest.importorskip('onnxruntime')
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)),
                      nn.Dropout(0.1), nn.Linear(16, 3))
    convert_model(m, checkpoint=True).eval()
    x = torch.randn(4, 8)
    torch.onnx.export(m, (x,), tmp_path / 'm.onnx', dynamo=False, input_names=['x'])
    ops = {n.op_type for n in onnx.load(tmp_path / 'm.onnx').graph.node}
    assert ops <= {'Gemm', 'Relu', 'Gelu', 'Erf', 'Mul', 'Add', 'Div', 'Constant', 'MatMul', 'Identity'}, ops
    out = ort.InferenceSession(str(tmp_path / 'm.onnx')).run(None, {'x': x.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(out), m(x), rtol=1e-4, atol=1e-5)


def test_onnx_dynamo_export_sees_plain_ops():
    pytest.importorskip('onnxscript')
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)),
                      nn.Dropout(0.1), nn.Linear(16, 3))
    convert_model(m, checkpoint=True).eval()
    prog = torch.onnx.export(m, (torch.randn(4, 8),), dynamo=True, verbose=False)
    assert {n.op_type for n in prog.model_proto.graph.node} == {'Gemm', 'Relu', 'Gelu'}


@pytest.mark.parametrize('which', ['ffn', 'ce'])
def test_autocast_bf16_matches_plain_under_autocast(which):
    torch.manual_seed(0)
    x = torch.randn(300, 32, requires_grad=True); y = torch.randint(0, 50, (300,))
    if which == 'ffn':
        ours = ChunkedFFN(32, 128, chunk_size=64); plain = lambda x: nn.Sequential.forward(ours, x)
        run = lambda f: (f(x).float() ** 2).mean()
        params = list(ours.parameters())
    else:
        head = nn.Linear(32, 50); params = list(head.parameters())
        ours = lambda x: chunked_linear_cross_entropy(x, head.weight, head.bias, y, chunk_size=64)
        plain = lambda x: F.cross_entropy(head(x).float(), y)
        run = lambda f: f(x)
    grads = []
    for f in (ours, plain):
        x.grad = None
        for p in params: p.grad = None
        with torch.autocast('cpu', dtype=torch.bfloat16): l = run(f)
        l.backward()
        grads.append([x.grad.clone()] + [p.grad.clone() for p in params])
        assert all(p.grad.dtype == torch.float32 for p in params)
    for a, b in zip(*grads): torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-3)


def test_chunked_ce_from_linear_shares_the_head_and_matches_plain():
    torch.manual_seed(0)
    head = nn.Linear(16, 50)
    x, y = torch.randn(64, 16), torch.randint(0, 50, (64,))
    ce = ChunkedLinearCrossEntropy.from_linear(head, label_smoothing=0.1, chunk_size=16)
    assert ce.head is head and ce.logits(x).shape == (64, 50)
    loss = ce(x, y); loss.backward()
    g = head.weight.grad.clone(); head.weight.grad = None
    ref = F.cross_entropy(head(x), y, label_smoothing=0.1); ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g, head.weight.grad, rtol=1e-4, atol=1e-6)


TRAINER_CK = memory_transform(True)   # what chapter 07's Trainer applies


def test_planned_checkpointing_and_micro_batches_save_activations():
    "Moved from test_budget.py: checkpointing is planned with the Trainer's conversion (transform=), no longer by the planner itself."
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(8)], nn.Linear(256, 10))
    x = (torch.randn(512, 256), torch.randint(0, 10, (512,)))
    base = plan_memory(blocks, x, optimizer='sgd')
    ck = plan_memory(blocks, x, optimizer='sgd', transform=TRAINER_CK)
    assert ck.peak < base.peak and ck.saved_activations < base.saved_activations
    assert ck.transform == 'activation checkpointing (about √n modules per segment)'
    assert type(blocks) is nn.Sequential   # the planner converted a copy
    mb = plan_memory(blocks, x, optimizer='sgd', micro_batch=128)
    assert mb.micro_batch == 128 and mb.peak < base.peak


@pytest.mark.parametrize('precision', ['fp32', 'bf16', 'fp16'])
def test_convert_model_runs_on_the_planners_fake_copies(precision):
    "Meta tensors in fp32, FakeTensors under autocast: checkpointing and the chunked layers' custom backward both trace."
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)), nn.ReLU(), nn.Dropout(0.1),
                      nn.Linear(64, 10))
    batch = (torch.randn(300, 32), torch.randint(0, 10, (300,)))
    base = plan_memory(m, batch, precision=precision)
    both = plan_memory(m, batch, precision=precision, transform=lambda c: TRAINER_CK(convert_model(c, checkpoint=None)))
    assert both.saved_activations < base.saved_activations


def test_planned_checkpointing_saving_matches_the_measured_one():
    "The issue's disagreement (planner 4.74 MB, run 3.69 MB) cannot recur: the planner traces what the Trainer runs."
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    x = torch.randn(32, 1, 28, 28)
    planned = plan_memory(cnn, (x, torch.randint(0, 10, (32,)))).saved_activations - \
              plan_memory(cnn, (x, torch.randint(0, 10, (32,))), transform=TRAINER_CK).saved_activations
    run = TRAINER_CK(copy.deepcopy(cnn))
    measured = saved_bytes(cnn, x, exclude=cnn.parameters()) - saved_bytes(run, x, exclude=run.parameters())
    bn_stats = sum(b.nbytes for m in cnn.modules() if isinstance(m, nn.BatchNorm2d) for b in (m.running_mean, m.running_var))
    assert measured - planned == bn_stats   # saved_bytes also counts BatchNorm's running statistics, which the planner calls weights


def test_levers_are_registered_and_say_what_they_save():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)), nn.ReLU(), nn.Dropout(0.1),
                      nn.Linear(64, 10))
    batch = (torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
    base = plan_memory(m, batch)
    changes = {c.description: c for c in fit_to_budget(m, batch, budget=base.total // 2)}
    chunked = changes['chunked FFN and bit-packed ReLU layers (chapter 02)']
    assert chunked.saving == base.total - plan_memory(m, batch, **chunked.changes).total > 0
    assert any('accumulation' in d for d in changes)
    # a strategy's transform that checkpoints already: the checkpointing lever has nothing left to save
    again = fit_to_budget(m, batch, budget=base.total // 2, transform=TRAINER_CK)
    assert not any(c.description.startswith('activation checkpointing') for c in again)


def test_measure_step_adds_second_gradients_in_place_as_a_plain_step_does():
    "A tensor read twice gets two gradients; a plain backward adds the second into the first's buffer, which the tracker's dispatch mode would make out of place (one more buffer at the peak)."
    x = torch.randn(512, 512, requires_grad=True)
    m = measure_step(lambda x: (x * 2).sum() + (x * 3).sum(), x, repeats=1)
    # a plain step's peak: the two gradients of x (the second added into the first), a few scalars; out of place it was three
    assert 2 * x.nbytes <= m.peak <= 2 * x.nbytes + 1024, (m.peak, x.nbytes)
