"Chapter 05 across chapters: every zoo model builds for both image shapes, traces on meta, trains a step, exports to ONNX."
import warnings
import pytest, torch
from netlite_nb.models import create_model, list_models, summary, InputShapeError, UnknownModelError
from netlite_nb.data import mnist_sample_loaders

SHAPES = [(1, 28), (3, 32)]
CASES = [(n, c, s) for n in ['mlp', 'netlite_tiny', 'netlite_small', 'resnet', 'vit_tiny'] for c, s in SHAPES]

def test_names():
    assert list_models() == ['mlp', 'netlite_tiny', 'netlite_small', 'resnet', 'vit_tiny']
    with pytest.raises(UnknownModelError, match="Did you mean 'netlite_tiny'.*Available: mlp, netlite_tiny"): create_model('netlite-tiny')
    with pytest.raises(UnknownModelError, match='Available'): create_model('alexnet')

@pytest.mark.parametrize('name,c,s', CASES)
def test_builds_trains_and_checks_shape(name, c, s):
    torch.manual_seed(0)
    m = create_model(name, num_classes=7, in_channels=c)
    assert m.input_shape == (c, s, s)
    x, y = torch.rand(4, c, s, s), torch.randint(0, 7, (4,))
    out = m(x)
    assert out.shape == (4, 7)
    torch.nn.functional.cross_entropy(out, y).backward()
    assert all(p.grad is not None for p in m.parameters())
    with pytest.raises(InputShapeError, match=rf'expects a batch of shape \[batch, {c}, {s}, {s}\]'): m(torch.rand(4, 4 - c, s, s))
    with torch.device('meta'): mm = create_model(name, in_channels=c)
    assert mm(torch.empty(512, c, s, s, device='meta')).shape == (512, 10)     # what the chapter 01 planner traces
    st = summary(mm, torch.empty(512, c, s, s, device='meta'))
    assert st.params == sum(p.numel() for p in create_model(name, in_channels=c).parameters()) and st.output_shape == (512, 10)
    # the layer rows themselves account for every parameter but those held outside a leaf layer (ViT's positions)
    outside = mm.pos.numel() if hasattr(mm, 'pos') else 0
    assert sum(r.params for r in st.rows if r.kind != 'Parameter') == st.params - outside

def test_param_budgets():
    n = lambda name: sum(p.numel() for p in create_model(name).parameters())
    assert 0.4e6 <= n('netlite_tiny') <= 0.6e6 and 1.6e6 <= n('netlite_small') <= 2.4e6
    assert n('mlp') == 784 * 128 + 128 + 128 * 64 + 64 + 650

def test_two_epochs_on_the_sample_learn():
    "The MLP, two passes over the embedded sample on the CPU: far better than chance (10%)."
    torch.manual_seed(0)
    dls = mnist_sample_loaders(batch_size=128)
    m = create_model('mlp')
    opt = torch.optim.AdamW(m.parameters(), 3e-3)
    for _ in range(2):
        for xb, yb in dls.train:
            loss = torch.nn.functional.cross_entropy(m(xb), yb); opt.zero_grad(); loss.backward(); opt.step()
    m.eval()
    with torch.no_grad(): acc = sum(int((m(x).argmax(1) == y).sum()) for x, y in dls.valid) / 1000
    assert acc > 0.85, acc

def _onnx_max_diff(m, c, s):
    import onnxruntime as ort
    m.eval()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        prog = torch.onnx.export(m, (torch.rand(2, c, s, s),), dynamo=True, dynamic_shapes=({0: torch.export.Dim('batch')},), verbose=False)
    sess = ort.InferenceSession(prog.model_proto.SerializeToString())
    x = torch.rand(5, c, s, s)
    with torch.no_grad(): ref = m(x)
    return float((torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]) - ref).abs().max())

@pytest.mark.parametrize('name,c,s', [('netlite_tiny', 1, 28), ('vit_tiny', 3, 32)])
def test_onnx_export_matches(name, c, s):
    assert _onnx_max_diff(create_model(name, in_channels=c), c, s) < 1e-4

@pytest.mark.slow
@pytest.mark.parametrize('name,c,s', CASES)
def test_onnx_export_whole_zoo(name, c, s, request):
    assert _onnx_max_diff(create_model(name, in_channels=c), c, s) < 1e-4
