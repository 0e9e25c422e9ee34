"Chapter 09c (qat): fake quantization that computes what ONNX Runtime's static INT8 file computes, and the ranges it exports."
import numpy as np, onnx, pytest, torch
from onnx import numpy_helper
from torch import nn
from netlite_nb.export import export_onnx, int8_weight_range, onnx_session, run_onnx
from netlite_nb.qat import (ActivationQuant, QuantAware, activation_qparams, fake_quant_weight, fold_batchnorm, observe,
                            prepare_qat, strip_qat, weight_qmax)


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
    assert len(rows) == len(ours) == 3
    for ((a_scale, a_zp), (w_scale, w_int8)), m in zip(rows, ours):
        scale, zp = activation_qparams(m.act.lo.item(), m.act.hi.item())
        assert float(a_scale) == pytest.approx(scale, rel=1e-6) and int(a_zp) == zp
        w = m.layer.weight.detach()  # BatchNorm folded, as the file's
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
        plain = strip_qat(prepare_qat(m))
        assert [type(l).__name__ for l in plain] == ['Conv2d', 'Identity', 'ReLU', 'Flatten', 'Linear']
        torch.testing.assert_close(plain(x), m(x), atol=1e-5, rtol=1e-5)


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
    with torch.no_grad(): want = torch.relu(qm.model[0].layer(calib[0])).max().item()
    assert qm.model[2].act.hi.item() == pytest.approx(want) and not qm.model[2].act.observing
