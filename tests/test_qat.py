"Chapter 09c (qat): fake quantization that computes what ONNX Runtime's static INT8 file computes, and the ranges it exports."
import numpy as np, onnx, pytest, torch
from onnx import numpy_helper
from torch import nn
import torch.nn.functional as F
from netlite_nb.export import export_onnx, int8_weight_range, onnx_session, run_onnx
from netlite_nb.qat import (ActivationQuant, QuantAware, activation_qparams, fake_quant_weight, fold_batchnorm, observe,
                            prepare_qat, strip_qat, weight_qmax)
import onnxruntime as ort


def _file_layers(path):
    "Per Conv/Gemm node in order: ((input scale, zero point), (weight scales, int8 weights)), and the output's scale."
    g = onnx.load(str(path)).graph
    init = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    made_by = {o: n for n in g.node for o in n.output}
    dq = lambda name: made_by[name].input
    rows = []
    for n in g.node:
        if n.op_type in ('Conv', 'Gemm', 'MatMul'):
            a, w = dq(n.input[0]), dq(n.input[1])
            rows.append(((init[a[1]], init[a[2]]), (init[w[1]], init[w[0]])))
    return rows, init[made_by[g.output[0].name].input[1]]


@pytest.mark.parametrize('int8_target', ['no-vnni', 'vnni'])
def test_ranges_and_weights_are_those_of_the_exported_int8_file(tmp_path, int8_target):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 6, 3, groups=6), nn.ReLU(),
                          nn.Flatten(), nn.Linear(6 * 6 * 6, 5))
    model(torch.randn(16, 2, 8, 8)); model.eval()  # BatchNorm statistics as after training
    calib = [torch.randn(16, 2, 8, 8) * 3 for _ in range(3)]
    qm = observe(prepare_qat(model, int8_target), calib).eval()
    export_onnx(strip_qat(qm), calib[0], tmp_path / 'm.onnx', quantize='int8', calibration=[(c, torch.zeros(16, dtype=torch.long)) for c in calib],
                measure_speed=False, int8_target=int8_target)
    rows, out_scale = _file_layers(tmp_path / 'm.onnx')
    ours = [m for m in qm.modules() if isinstance(m, QuantAware)]
    plain = [m for m in strip_qat(qm).modules() if isinstance(m, (nn.Conv2d, nn.Linear))]  # BatchNorm folded, as the file's
    assert len(rows) == len(ours) == len(plain) == 3
    for ((a_scale, a_zp), (w_scale, w_int8)), m, p in zip(rows, ours, plain):
        scale, zp = activation_qparams(m.act.lo.item(), m.act.hi.item())
        assert float(a_scale) == pytest.approx(scale, rel=1e-6) and int(a_zp) == zp
        w = p.weight.detach()
        assert np.allclose(w_scale.reshape(-1), (w.abs().amax(tuple(range(1, w.dim()))) / m.qmax).numpy(), rtol=1e-6)
        assert np.abs(w_int8).max() <= (64 if int8_target == 'no-vnni' else 127)
        ours_int = torch.round(fake_quant_weight(w, m.qmax) / torch.from_numpy(w_scale.astype(np.float32)).view(-1, *[1] * (w.dim() - 1)))
        assert np.array_equal(ours_int.numpy().astype(np.int8), w_int8)
    assert float(out_scale) == pytest.approx(activation_qparams(qm.out.lo.item(), qm.out.hi.item())[0], rel=1e-6)
    if int8_weight_range(int8_target)[0] != int8_weight_range('auto')[0]: return  # 8-bit weights saturate on a CPU without VNNI (chapter 09)
    with torch.no_grad(): fq = qm(calib[1]).numpy()
    assert np.abs(run_onnx(onnx_session(tmp_path / 'm.onnx'), calib[1].numpy()) - fq).max() < 0.05 * np.abs(fq).max()


def test_fake_quantization_rounds_to_the_grid_and_passes_gradients():
    w = torch.randn(5, 7, requires_grad=True)
    q = fake_quant_weight(w, weight_qmax(False))
    s = w.detach().abs().amax(1, keepdim=True) / 127
    assert torch.allclose(q / s, (q / s).round(), atol=1e-4) and ((q - w).abs() <= s / 2 + 1e-7).all()
    q.sum().backward(); assert torch.equal(w.grad, torch.ones_like(w))
    a = ActivationQuant(); x = torch.linspace(-1, 3, 101, requires_grad=True)
    a(x.detach()); a.observing = False
    y = a(x * 2)  # half of these lie outside the range: clipped, no gradient there
    y.sum().backward()
    assert y.max().item() == pytest.approx(3.0, abs=4 / 255) and (x.grad[x * 2 > 3.01] == 0).all()


def test_folding_and_stripping_give_the_plain_model_back():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
    m(torch.randn(4, 1, 6, 6)); m.eval()
    x = torch.randn(2, 1, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(fold_batchnorm(m)(x), m(x), atol=1e-5, rtol=1e-5)
        qm = prepare_qat(m)
        latent = strip_qat(qm, on_grid=False)
        assert [type(l).__name__ for l in latent] == ['Conv2d', 'Identity', 'ReLU', 'Flatten', 'Linear']
        torch.testing.assert_close(latent(x), m(x), atol=1e-5, rtol=1e-5)
        plain = strip_qat(qm)  # what is exported: the same layers, weights on the int8 grid
        assert [type(l).__name__ for l in plain] == ['Conv2d', 'Identity', 'ReLU', 'Flatten', 'Linear']
        for a, b in [(0, 0), (4, 4)]:
            torch.testing.assert_close(plain[a].weight, fake_quant_weight(latent[b].weight, qm.model[a].qmax), atol=0, rtol=0)
            torch.testing.assert_close(plain[a].bias, latent[b].bias, atol=0, rtol=0)


def test_reobserve_sets_the_ranges_of_the_current_weights_every_few_steps():
    from types import SimpleNamespace
    from netlite_nb.qat import Reobserve
    torch.manual_seed(0)
    qm = observe(prepare_qat(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))), [torch.randn(16, 4)])
    calib = [torch.randn(16, 4) * 5]
    before = qm.model[2].act.hi.item()
    cb = Reobserve(calib, every=10)
    cb.after_step(SimpleNamespace(step=9, model=qm))
    assert qm.model[2].act.hi.item() == before  # between re-observations the ranges stay frozen
    cb.after_step(SimpleNamespace(step=10, model=qm))
    l = qm.model[0]  # observed as exported: the weights on their grid, the activations in fp32
    with torch.no_grad(): want = torch.relu(F.linear(calib[0], fake_quant_weight(l.layer.weight, l.qmax), l.layer.bias)).max().item()
    assert qm.model[2].act.hi.item() == pytest.approx(want) and not qm.model[2].act.observing


def _spread_channels(conv:nn.Module, decades:float):
    "Scale `conv`'s output channels (weights and bias) over 10**decades, as a layer with no normalization after it can end up."
    with torch.no_grad():
        s = torch.logspace(-decades / 2, decades / 2, conv.weight.shape[0])
        conv.weight.mul_(s.view(-1, *[1] * (conv.weight.dim() - 1)))
        if conv.bias is not None: conv.bias.mul_(s)


def _separable_1d():
    "A model the equalization was not written on: Conv1d, a grouped conv, LeakyReLU/PReLU, pooling, BatchNorm, a Flatten, an MLP head."
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv1d(3, 8, 5, padding=2), nn.LeakyReLU(0.1), nn.Conv1d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm1d(8),
                      nn.PReLU(), nn.MaxPool1d(2), nn.Conv1d(8, 12, 1, groups=2), nn.ReLU(), nn.AvgPool1d(2), nn.Flatten(),
                      nn.Linear(12 * 4, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 5))
    _spread_channels(m[0], 3)
    m(torch.randn(32, 3, 16)); return m.eval()


def test_equalization_computes_the_same_floats_and_matches_the_ranges_of_each_pair():
    from netlite_nb.qat import cross_layer_equalize, fold_batchnorm
    m = _separable_1d()
    eq, how = cross_layer_equalize(m)
    assert how.pairs == [('0', '2'), ('2', '6'), ('6', '10'), ('10', '13')] and list(how.skipped) == ['13']
    x = torch.randn(64, 3, 16) * 4
    with torch.no_grad():  # power-of-two scales only change exponents: the same floats, bit for bit (no tolerance to choose)
        assert torch.equal(eq(x), fold_batchnorm(m)(x))
    assert how.sweeps < 20 and how.spread_before['0'] > 300 and how.spread_after['0'] < how.spread_before['0'] / 30
    for a, b in how.pairs:  # settled: every channel's ranges in the two layers within a factor of 2 (the nearest power of two of sqrt is 1)
        la, lb = eq.get_submodule(a), eq.get_submodule(b)
        c = la.weight.shape[0]
        r1 = la.weight.detach().reshape(c, -1).abs().amax(1)
        w = lb.weight.detach()
        r2 = (w.view(w.shape[0], c, -1).abs().amax((0, 2)) if isinstance(lb, nn.Linear) else
              w.view(lb.groups, w.shape[0] // lb.groups, w.shape[1], -1).abs().amax((1, 3)).reshape(-1))
        assert ((r1 / r2 >= 0.5) & (r1 / r2 <= 2)).all(), (a, b, r1 / r2)


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.c3 = nn.Conv2d(2, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1), nn.Conv2d(6, 6, 1)
        self.c4, self.fc = nn.Conv2d(6, 6, 1), nn.Linear(6, 3)
        _spread_channels(self.c1, 3)
    def forward(self, x):
        y = torch.relu(self.c1(x))
        z = F.relu(self.c2(y)) + y          # c1's output also feeds the addition; c2's output meets it
        z = F.relu6(self.c3(z))             # clips at 6: a per-channel scale would move the clip
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(F.relu(self.c4(z)), 1), 1))


def test_layers_before_a_residual_addition_or_a_clip_are_left_alone_and_the_report_says_why():
    from netlite_nb.qat import cross_layer_equalize, fold_batchnorm
    torch.manual_seed(0)
    m = _Residual().eval()
    eq, how = cross_layer_equalize(m)
    assert how.pairs == [] and set(how.skipped) == {'c1', 'c2', 'c3', 'c4', 'fc'}
    assert 'feeds 2 operations' in how.skipped['c1'] and 'add follows it' in how.skipped['c2'] and 'relu6 follows it' in how.skipped['c3']
    assert "c1" in str(how) and 'residual' in str(how)
    for n, p in m.named_parameters(): assert torch.equal(p, eq.get_parameter(n)), n   # nothing rescaled
    class Branchy(nn.Module):  # data-dependent control flow: torch.fx cannot trace it, so nothing is known about where outputs go
        def __init__(self): super().__init__(); self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)
        def forward(self, x): return self.b(torch.relu(self.a(x))) if x.sum() > 0 else self.b(self.a(x))
    eq2, how2 = cross_layer_equalize(Branchy())
    assert how2.pairs == [] and all('torch.fx could not trace' in v for v in how2.skipped.values()) and set(how2.skipped) == {'a', 'b'}


def _grid_levels(qm, batches):
    "Per channel of the first activation after the stem: how many levels of its uint8 grid the channel's largest value reaches."
    layer = [m for m in qm.modules() if isinstance(m, QuantAware)][1]
    seen = []
    h = layer.register_forward_pre_hook(lambda mod, inp: seen.append(inp[0].detach().transpose(0, 1).reshape(inp[0].shape[1], -1).amax(1)))
    with torch.no_grad():
        for b in batches: qm(b)
    h.remove()
    return torch.stack(seen).amax(0) / activation_qparams(layer.act.lo.item(), layer.act.hi.item())[0]


def test_equalization_puts_every_channel_on_the_activation_grid_and_int8_follows_fp32(tmp_path):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 16, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 10))
    _spread_channels(m[0], 4)
    m[3].momentum = None; m(torch.randn(64, 1, 12, 12)); m.eval()   # BatchNorm's statistics of its input: it scales the small channels back up
    calib = [torch.randn(64, 1, 12, 12) for _ in range(4)]
    plain, equal = observe(prepare_qat(m, equalize=False), calib).eval(), observe(prepare_qat(m), calib).eval()
    assert plain.equalization is None and equal.equalization.pairs[0] == ('0', '2')
    before, after = _grid_levels(plain, calib), _grid_levels(equal, calib)
    assert before.min() < 1 and after.min() > 50   # the smallest channel: rounded to zero before, on a hundred levels and more after
    x = torch.cat(calib)  # inside the calibrated ranges: the error is rounding, not clipping
    with torch.no_grad(): ref = m(x)
    err = {}
    for name, q in dict(plain=plain, equal=equal).items():
        export_onnx(strip_qat(q), calib[0], tmp_path / f'{name}.onnx', quantize='int8', measure_speed=False,
                    calibration=[(c, torch.zeros(len(c), dtype=torch.long)) for c in calib])
        err[name] = float(np.abs(run_onnx(onnx_session(tmp_path / f'{name}.onnx'), x.numpy()) - ref.numpy()).max() / ref.abs().max())
    assert err['equal'] < 0.1 < 0.3 < err['plain'], err


def _conv_bn_1d():
    "A model the bench does not use: Conv1d + BatchNorm1d blocks (one grouped, one without affine), a Linear + BatchNorm1d head."
    torch.manual_seed(2)
    m = nn.Sequential(nn.Conv1d(3, 8, 5, padding=2), nn.BatchNorm1d(8), nn.ReLU(), nn.Conv1d(8, 8, 3, padding=1, groups=4, bias=False),
                      nn.BatchNorm1d(8, affine=False), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 12, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 4))
    _spread_channels(m[0], 3)
    m.train()
    for _ in range(5): m(torch.randn(32, 3, 12) * 2)
    return m.eval()


def test_batchnorm_trains_on_batch_statistics_until_frozen_then_computes_the_folded_graph():
    m = _conv_bn_1d()
    qm = observe(prepare_qat(m), [torch.randn(32, 3, 12) * 2])
    layers = [q for q in qm.modules() if isinstance(q, QuantAware)]
    assert [q.bn is not None for q in layers] == [True, True, True, False]
    assert not any(isinstance(x, nn.modules.batchnorm._BatchNorm) for x in qm.model)   # each BatchNorm lives in its layer
    first, outs = layers[0], []
    first.register_forward_hook(lambda mod, i, o: outs.append(o))
    x = torch.randn(64, 3, 12) * 5 + 1   # statistics unlike the running ones
    rm = first.bn.running_mean.clone()
    qm.train(); qm(x)
    # normalized with this batch's statistics: per channel, mean beta and spread |gamma|, and the running mean moved
    o = outs[-1].transpose(0, 1).reshape(8, -1)
    torch.testing.assert_close(o.mean(1), first.bn.bias.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(o.var(1, unbiased=False).sqrt(), first.bn.weight.detach().abs(), rtol=1e-2, atol=1e-3)  # eps: a hair under
    assert not torch.equal(first.bn.running_mean, rm)
    qm(x).sum().backward()
    assert first.layer.weight.grad.abs().sum() > 0 and first.bn.weight.grad.abs().sum() > 0   # the layer and its BatchNorm learn
    from netlite_nb.qat import FreezeBatchNorm
    from types import SimpleNamespace
    cb = FreezeBatchNorm(at=3)
    cb.after_step(SimpleNamespace(step=2, model=qm)); assert not any(q.bn_frozen for q in layers)
    cb.after_step(SimpleNamespace(step=3, model=qm)); assert all(q.bn_frozen for q in layers)
    rm = first.bn.running_mean.clone()
    with torch.no_grad():
        train_out = qm.train()(x)
        assert torch.equal(first.bn.running_mean, rm)   # frozen: the statistics no longer move
        assert torch.equal(train_out, qm.eval()(x))     # training now computes what evaluation (and the file) computes


def test_equalization_on_kept_batchnorm_gives_the_folded_equalized_weights_exactly():
    from netlite_nb.qat import cross_layer_equalize
    m = _conv_bn_1d()
    eq, how = cross_layer_equalize(m)
    qm = prepare_qat(m)
    assert qm.equalization.pairs == how.pairs and how.pairs   # something was rescaled
    kept = [q.bn for q in qm.modules() if isinstance(q, QuantAware) and getattr(q, 'bn', None) is not None]
    assert len(kept) == 3   # the copy keeps its BatchNorms (rescaled through gamma and beta), yet folds to the equalized weights
    plain = strip_qat(qm, on_grid=False)  # the latent weights: those of the equalized model, exactly
    for n, p in eq.named_parameters(): assert torch.equal(p, plain.get_parameter(n)), n
    x = torch.randn(16, 3, 12)
    with torch.no_grad(): assert torch.equal(plain(x), eq(x))


def _quant_points(path):
    "(scale, zero point) of every QuantizeLinear of activations in the file, and its int32 biases as {Conv/Gemm node index: (int32, scale)}."
    g = onnx.load(str(path)).graph
    init = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    made_by = {o: n for n in g.node for o in n.output}
    points = [(float(init[n.input[1]]), int(init[n.input[2]])) for n in g.node if n.op_type == 'QuantizeLinear']
    layers = [n for n in g.node if n.op_type in ('Conv', 'Gemm', 'MatMul')]
    biases = {i: (init[made_by[n.input[2]].input[0]], init[made_by[n.input[2]].input[1]]) for i, n in enumerate(layers) if len(n.input) > 2}
    return points, biases


def _pooled_net():
    "Conv+BN+ReLU, a depthwise conv and ReLU, then global average pooling (fp32 in the file) before the Linear head, as `wide_stem_cnn` ends."
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1, groups=6), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4))
    m(torch.randn(32, 1, 12, 12) * 2); return m.eval()


def _sess(path, optimized:bool):
    "ONNX Runtime on the file; not optimized, it computes the QDQ graph in floats: the file's own arithmetic without its int8 kernels."
    so = ort.SessionOptions(); so.intra_op_num_threads = 1
    if not optimized: so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=['CPUExecutionProvider'])


def test_every_point_the_file_quantizes_is_fake_quantized_with_the_same_grid(tmp_path):
    m = _pooled_net()
    calib = [torch.randn(32, 1, 12, 12) * 2 for _ in range(3)]
    qm = observe(prepare_qat(m), calib).eval()
    export_onnx(strip_qat(qm), calib[0], tmp_path / 'm.onnx', quantize='int8', calibration=qm.calibration, measure_speed=False)
    points, biases = _quant_points(tmp_path / 'm.onnx')
    ours = {activation_qparams(a.lo.item(), a.hi.item()) for a in qm.modules() if isinstance(a, ActivationQuant)}
    # the ReLU before the pooling is quantized in the file, though no Conv or Gemm reads it: the fake quantization must round there too
    assert len(points) == len(ours) == 5
    for s, z in points: assert any(z == zo and s == pytest.approx(so, rel=1e-6) for so, zo in ours), (s, z, ours)
    layers = [l for l in qm.modules() if isinstance(l, QuantAware)]
    for i, l in enumerate(layers):  # the int32 biases are those `fake_quant_bias` rounds to
        q, scale = biases[i]
        w, b = strip_qat(qm)[[0, 3, 7][i]].weight.detach(), strip_qat(qm)[[0, 3, 7][i]].bias.detach()
        s_in = activation_qparams(l.act.lo.item(), l.act.hi.item())[0]
        s_w = w.abs().amax(tuple(range(1, w.dim()))) / l.qmax
        assert np.array_equal(np.round(b.double().numpy() / (np.float32(s_in) * s_w.numpy()).astype(np.float64)), q.astype(np.float64))


def test_the_int8_file_computes_what_the_fake_quantized_model_computes(tmp_path):
    m = _pooled_net()
    calib = [torch.randn(32, 1, 12, 12) * 2 for _ in range(3)]
    qm = observe(prepare_qat(m), calib).eval()
    export_onnx(strip_qat(qm), calib[0], tmp_path / 'm.onnx', quantize='int8', calibration=qm.calibration, measure_speed=False)
    x = torch.randn(256, 1, 12, 12) * 2
    with torch.no_grad(): fq = qm(x).numpy()
    step = activation_qparams(qm.out.lo.item(), qm.out.hi.item())[0]
    for optimized in (False, True):  # the QDQ graph in floats, then ORT's int8 kernels
        out = run_onnx(_sess(tmp_path / 'm.onnx', optimized), x.numpy())
        d = np.abs(out - fq) / step
        # the same grids and rounding: a logit differs only where a float sum in another order lands on the other side of a tie
        assert d.max() <= 1 + 1e-3 and d.mean() < 0.01, (optimized, d.max(), d.mean())


def test_qat_fine_tune_hands_the_export_the_inputs_its_ranges_come_from(tmp_path):
    from netlite_nb.data import mnist_sample, mnist_sample_loaders
    from netlite_nb.qat import qat_fine_tune, wide_stem_cnn
    torch.manual_seed(0)
    dls = mnist_sample_loaders(batch_size=64)  # shuffled training batches: each pass over them draws other samples
    qm = qat_fine_tune(wide_stem_cnn(), dls, steps=2, freeze_bn=0, observe_every=None)
    assert qm.calibration.shape == (512, 1, 28, 28)
    export_onnx(strip_qat(qm), mnist_sample()[1].x[:8], tmp_path / 'q.onnx', quantize='int8', calibration=qm.calibration, measure_speed=False)
    points, _ = _quant_points(tmp_path / 'q.onnx')
    ours = {activation_qparams(a.lo.item(), a.hi.item()) for a in qm.modules() if isinstance(a, ActivationQuant)}
    assert len(points) == len(ours)
    for s, z in points: assert any(z == zo and s == pytest.approx(so, rel=1e-6) for so, zo in ours), (s, z, ours)
