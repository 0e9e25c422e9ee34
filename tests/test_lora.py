"Chapter 09a: LoRA adapters merge exactly, the planner counts only what trains, checkpoints hold adapters alone and resume exactly."
import copy
from functools import partial
import pytest, torch
from torch import nn
from torch.utils.data import DataLoader
from netlite_nb.budget import fit_to_budget, plan_memory
from netlite_nb.memory.trace import trace_step
from netlite_nb.checkpoint import find_checkpoint
from netlite_nb.fixtures import blobs, mlp
from netlite_nb.layers import saved_bytes
from netlite_nb.lora import LoRAConv, LoRALinear, add_lora, is_lora, measured_step_peak, merge_lora, merged
from netlite_nb.train import Trainer


def _as_trained(model:nn.Module, seed:int=0)->nn.Module:
    "Give every adapter's B (zeros when created) random values, as training would, so merging has something to fold in."
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith('lora_B'): p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


class Mixed(nn.Module):
    "Every kind add_lora meets: a conv, a depthwise conv it skips, nn.MultiheadAttention, Linear layers."
    def __init__(self):
        super().__init__()
        self.conv, self.dw = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.attn, self.head = nn.MultiheadAttention(8, 2, batch_first=True), nn.Linear(8, 5)
    def forward(self, x):
        t = self.dw(torch.relu(self.conv(x))).flatten(2).transpose(1, 2)
        return self.head(self.attn(t, t, t)[0].mean(1))


def test_merging_computes_what_the_adapted_model_computes():
    torch.manual_seed(0)
    m = _as_trained(add_lora(Mixed(), rank=2)).eval()
    s = m.lora_summary
    assert s.adapted == {'conv': 'LoRAConv', 'attn': 'in_proj_weight (parametrization)', 'attn.out_proj': 'weight (parametrization)', 'head': 'LoRALinear'}
    assert list(s.skipped) == ['dw'] and 'grouped' in s.skipped['dw']
    x = torch.randn(4, 1, 6, 6)
    with torch.no_grad(): want, got = m(x), merge_lora(copy.deepcopy(m))(x)
    assert (want - got).abs().max() < 1e-5
    plain = merge_lora(m)
    assert not is_lora(plain) and sorted(plain.state_dict()) == sorted(Mixed().state_dict())


def test_an_adapter_is_its_layer_with_weight_w_plus_ba():
    "Against plain PyTorch: the layer computed with the weight W + (alpha/r) B A."
    torch.manual_seed(0)
    lin = LoRALinear(nn.Linear(7, 3), rank=2, alpha=6); _as_trained(lin)
    x = torch.randn(5, 7)
    with torch.no_grad(): assert torch.allclose(lin(x), x @ (lin.base.weight + 3.0 * lin.lora_B @ lin.lora_A).T + lin.base.bias, atol=1e-6)
    conv = LoRAConv(nn.Conv2d(2, 4, 3, stride=2, padding=1, dilation=1), rank=3); _as_trained(conv)
    xc = torch.randn(2, 2, 8, 8)
    with torch.no_grad(): assert torch.allclose(conv(xc), nn.functional.conv2d(xc, conv.weight, conv.bias, stride=2, padding=1), atol=1e-5)


def test_targets_glob_regex_and_errors():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))
    a = add_lora(copy.deepcopy(net), targets=['2.*'])
    assert list(a.lora_summary.adapted) == ['2.0', '2.1'] and not a[0].weight.requires_grad
    b = add_lora(copy.deepcopy(net), targets=['re:\\d'])                       # a whole-name regex: '0' only, not '2.0'
    assert list(b.lora_summary.adapted) == ['0']
    c = add_lora(copy.deepcopy(net), targets=['0'], train=['2'])
    assert c.lora_summary.trainable == 8 * 4 + 8 * 8 + (8 * 8 + 8) + (8 * 2 + 2)  # rank 8: A (8x4), B (8x8); layer 2 in full
    with pytest.raises(ValueError, match='No module named'): add_lora(copy.deepcopy(net), targets=['head'])
    with pytest.raises(ValueError, match='already has LoRA'): add_lora(a)


def test_the_plan_has_no_gradient_or_optimizer_state_for_frozen_weights():
    torch.manual_seed(0)
    net = lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    batch = (torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,)))
    full, lora = net(), add_lora(net(), rank=4)
    tb = sum(p.numel() * 4 for p in lora.parameters() if p.requires_grad)
    cat = lambda m, c: sum(r.nbytes for r in trace_step(m, batch).tracker.allocs if r.category == c)
    assert cat(lora, 'gradients') == 2 * tb                                    # two traced steps, adapters only
    assert 2 * tb <= cat(lora, 'optimizer') < 2 * tb + 1024 < cat(full, 'optimizer') / 10
    for m in (full, lora, add_lora(net(), targets=['5'])):                     # what autograd saves, as a real forward saves it
        p = plan_memory(m, batch)
        assert p.saved_activations - p.by_module.get('loss', 0) == saved_bytes(m, batch[0], exclude=[*m.parameters(), batch[0]])
    head_only = plan_memory(add_lora(net(), targets=['5']), batch).by_module
    assert set(head_only) <= {'5', 'loss'} and head_only['5'] >= 32 * 256 * 4  # frozen layers before it keep nothing


def test_plan_matches_a_real_step():
    torch.manual_seed(0)
    m = add_lora(nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)), rank=8, dropout=0.1)
    batch = (torch.rand(64, 1, 28, 28), torch.randint(0, 10, (64,)))
    planned, real = plan_memory(m, batch).peak, measured_step_peak(m, batch)
    assert abs(planned - real) / real < 0.05, (planned, real)


def test_fit_to_budget_offers_lora_with_a_traced_saving():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))
    batch = (torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,)))
    lora_total = plan_memory(net, batch, transform=partial(add_lora, rank=8)).total
    budget = int(1.1 * lora_total)
    assert plan_memory(net, batch, budget=budget).fits is False
    assert not any(c.description.startswith('LoRA') for c in fit_to_budget(net, batch, budget=budget))   # training from scratch
    ch = next(c for c in fit_to_budget(net, batch, budget=budget, finetune=True) if c.description.startswith('LoRA'))
    assert ch.fits and ch.new_plan.total == lora_total and not is_lora(net)
    assert not any(c.description.startswith('LoRA') for c in fit_to_budget(add_lora(copy.deepcopy(net)), batch, budget=budget, finetune=True))


def _run(base, run_dir=None, steps=6, resume=None, checkpoint_every=None, bias='none'):
    torch.manual_seed(0)
    m = add_lora(copy.deepcopy(base), targets=['0'], rank=4, dropout=0.2, train=['3'], bias=bias)
    dl = DataLoader(blobs(256), 32, shuffle=True, generator=torch.Generator().manual_seed(0))
    return Trainer(m, dl, device='cpu', lr=1e-2, progress=False, verbose=False, plan=False, run_dir=run_dir,
                   checkpoint_every=checkpoint_every).fit(steps=steps, resume=resume)


def test_checkpoints_hold_adapters_only_and_resume_exactly(tmp_path):
    "A 6-step run that checkpoints at step 3; a new trainer resumes that checkpoint and must end where the run ended."
    torch.manual_seed(0)
    base = mlp(hidden=256)
    straight = _run(base, tmp_path / 'run', checkpoint_every=3)
    ck = tmp_path / 'run' / 'step-0000003'
    resumed = _run(base, tmp_path / 'resumed', resume=ck)
    assert resumed.step == straight.step == 6
    for (n, p), (_, q) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()): assert torch.equal(p, q), n
    import safetensors.torch as st
    keys = set(st.load_file(str(ck / 'model.safetensors')))
    assert keys == {'0.lora_A', '0.lora_B', '3.weight', '3.bias', 'lora_base_sha256'}   # no frozen weight in the file
    other = mlp(hidden=256)                                                   # adapters onto other base weights: refused
    with pytest.raises(ValueError, match='other base weights'): _run(other, tmp_path / 'other', resume=ck)


def test_merged_export_parity(tmp_path):
    from netlite_nb.export import export_onnx
    torch.manual_seed(0)
    m = _as_trained(add_lora(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)), rank=2)).eval()
    x = torch.randn(8, 1, 8, 8)
    rep = export_onnx(merged(m), x, tmp_path / 'm.onnx', measure_speed=False)
    assert rep.ok and rep.max_abs_diff['fp32'] <= 1e-4 and is_lora(m)       # `merged` leaves the adapted model as it was
    import onnx
    assert not any('lora' in i.name for i in onnx.load(str(tmp_path / 'm.onnx')).graph.initializer)


def test_the_lora_section_of_a_run_configuration():
    from netlite_nb.strategies import ConfigError, load_config
    c = load_config({'strategy': 'cpu', 'lora': {'base': 'runs/a', 'targets': ['features.*'], 'rank': 4}})
    assert (c.lora.base, c.lora.targets, c.lora.rank, c.lora.alpha, c.lora.train) == ('runs/a', ['features.*'], 4, 16.0, [])
    assert load_config({'strategy': 'cpu'}).lora.base is None                 # no section: train every weight
    for bad in ({'rank': 0}, {'dropout': 1.0}, {'targets': []}, {'targets': 'head'}):
        with pytest.raises(ConfigError, match='lora'): load_config({'strategy': 'cpu', 'lora': bad})


def test_bias_option_trains_the_biases_peft_trains():
    "bias= as peft's LoraConfig: 'none', 'lora_only' (biases of adapted modules), 'all' (every bias)."
    torch.manual_seed(0)
    train = lambda b: {n for n, p in add_lora(Mixed(), rank=2, bias=b).named_parameters() if p.requires_grad and 'lora_' not in n}
    assert train('none') == set()
    assert train('lora_only') == {'conv.base.bias', 'attn.in_proj_bias', 'attn.out_proj.bias', 'head.base.bias'}  # not the skipped 'dw'
    assert train('all') == train('lora_only') | {'dw.bias'}
    m = Mixed()
    n = add_lora(copy.deepcopy(m), rank=2, bias='all').lora_summary.trainable - add_lora(copy.deepcopy(m), rank=2).lora_summary.trainable
    assert n == sum(p.numel() for k, p in m.named_parameters() if 'bias' in k) == 8 + 8 + 24 + 8 + 5
    with pytest.raises(ValueError, match="'none', 'all' or 'lora_only'"): add_lora(Mixed(), bias='yes')


def test_merging_keeps_trained_biases():
    torch.manual_seed(0)
    m = _as_trained(add_lora(Mixed(), rank=2, bias='all')).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if 'bias' in n: p.add_(torch.randn_like(p))                           # as training would move them
        x = torch.randn(4, 1, 6, 6)
        want, plain = m(x), merge_lora(copy.deepcopy(m))
        assert (plain(x) - want).abs().max() < 1e-5
        assert torch.equal(plain.state_dict()['conv.bias'], m.conv.base.bias)


def test_trained_biases_are_saved_with_the_adapters_and_resume_exactly(tmp_path):
    torch.manual_seed(0)
    base = mlp(hidden=256)
    straight = _run(base, tmp_path / 'run', checkpoint_every=3, bias='lora_only')
    ck = tmp_path / 'run' / 'step-0000003'
    resumed = _run(base, tmp_path / 'resumed', resume=ck, bias='lora_only')
    for (n, p), (_, q) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()): assert torch.equal(p, q), n
    import safetensors.torch as st
    saved = st.load_file(str(ck / 'model.safetensors'))
    assert set(saved) == {'0.lora_A', '0.lora_B', '0.base.bias', '3.weight', '3.bias', 'lora_base_sha256'}
    assert not torch.equal(saved['0.base.bias'], base[0].bias)                 # the bias trained, and the file holds it
    other = add_lora(copy.deepcopy(base), targets=['0'], rank=4, dropout=0.2, train=['3'])   # bias='none': the same base weights
    other.load_state_dict(saved)                                               # not refused as another base, and the bias comes along
    assert torch.equal(other[0].base.bias, saved['0.base.bias'])


# recurrent layers (issue 38, item 10) and quantized bases, peft's format (issue 41)
import importlib.util, json
from netlite_nb.lora import QuantizedWeight, dequantize_4bit, load_peft, quantize_4bit, save_peft
import safetensors.torch as st


class _Recurrent(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.rnn = kind(12, 16, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(32, 5)
    def forward(self, x): return self.head(self.rnn(x)[0].mean(1))


@pytest.mark.parametrize('kind', [nn.RNN, nn.GRU, nn.LSTM])
def test_recurrent_layers_get_adapters_that_train_and_merge(kind):
    torch.manual_seed(0)
    model = _as_trained(add_lora(_Recurrent(kind), rank=2))
    assert model.lora_summary.adapted['rnn'] == '8 weight matrices (parametrization)'  # 2 layers x 2 directions x (ih, hh)
    x = torch.randn(3, 7, 12)
    model(x).sum().backward()
    grads = [n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert sum('rnn.' in n for n in grads) == 16  # every adapter of the recurrent layer receives a gradient
    with torch.no_grad():
        flat = merge_lora(copy.deepcopy(model))
        assert type(flat.rnn) is kind
        torch.testing.assert_close(flat(x), model(x), atol=1e-5, rtol=1e-5)


def _bnb_4bit_on_cpu():
    if importlib.util.find_spec('bitsandbytes') is None: return False
    try: import bitsandbytes.functional as bf; bf.quantize_4bit(torch.randn(64), blocksize=64, quant_type='nf4')
    except Exception: return False
    return True


@pytest.mark.skipif(not _bnb_4bit_on_cpu(), reason='bitsandbytes does not quantize to 4 bits on this CPU')
@pytest.mark.parametrize('quant_type', ['nf4', 'fp4'])
@pytest.mark.parametrize('shape,blocksize', [((40, 37), 64), ((64, 128), 64), ((33, 64), 128), ((7, 3, 3, 3), 64)])
def test_same_4bit_codes_and_values_as_bitsandbytes(quant_type, shape, blocksize):
    import bitsandbytes.functional as bf
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 0.05
    w.view(-1)[5] = 0.0  # a zero, and a value exactly at a block's absmax
    q, a = quantize_4bit(w, quant_type, blocksize, backend='netlite_nb')
    qb, sb = bf.quantize_4bit(w, blocksize=blocksize, quant_type=quant_type)
    assert torch.equal(q, qb.view(-1)) and torch.equal(a, sb.absmax)
    assert torch.equal(dequantize_4bit(q, a, shape, quant_type, blocksize), bf.dequantize_4bit(qb, sb))


def test_4bit_codes_round_to_the_nearest_level():
    from netlite_nb.lora import NF4
    levels = torch.tensor(NF4)
    w = torch.linspace(-1, 1, 2001)
    q, a = quantize_4bit(w, 'nf4', 2001, backend='netlite_nb')
    assert a.item() == 1.0
    got = dequantize_4bit(q, a, w.shape, 'nf4', 2001)
    best = (w[:, None] - levels[None]).abs().min(1).values
    assert torch.allclose((got - w).abs(), best, atol=1e-7)


@pytest.mark.parametrize('bits,double_quant', [(4, False), (4, True), (8, False)])
def test_quantized_base_trains_merges_and_checkpoints_adapters_only(bits, double_quant):
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Identity(), nn.Flatten(),
                         nn.Linear(16 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 4))
    model = add_lora(copy.deepcopy(base), rank=4, base_bits=bits, double_quant=double_quant, bias='lora_only')
    assert all(getattr(model[i].base, 'weight') is None for i in (0, 4, 6))  # the fp32 weights are gone
    x, y = torch.randn(5, 3, 8, 8), torch.randint(0, 4, (5,))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    # the quantized layer computes the layer with its dequantized weight, and its gradients are those of that dense layer
    dense = copy.deepcopy(model)
    for i in (0, 4, 6):
        dense[i].base.weight = nn.Parameter(dense[i].qweight.dequantize(), requires_grad=False); del dense[i].qweight
    xg = x.clone().requires_grad_(); xd = x.clone().requires_grad_()
    model.zero_grad(); dense.zero_grad()
    model(xg).square().sum().backward(); dense(xd).square().sum().backward()
    torch.testing.assert_close(xg.grad, xd.grad)
    torch.testing.assert_close(model[4].lora_A.grad, dense[4].lora_A.grad)
    with torch.no_grad():
        torch.testing.assert_close(merged(model)(x), model(x), atol=1e-5, rtol=1e-5)
    sd = model.state_dict()
    assert sorted(k for k in sd if k.rsplit('.', 1)[-1] not in ('lora_A', 'lora_B')) == ['0.base.bias', '4.base.bias', '6.base.bias', 'lora_base_sha256']
    twin = add_lora(copy.deepcopy(base), rank=4, base_bits=bits, double_quant=double_quant, bias='lora_only')
    twin.load_state_dict(sd)
    with torch.no_grad(): assert torch.equal(twin(x), model(x))
    with pytest.raises(ValueError, match='other base weights'):
        add_lora(copy.deepcopy(base), rank=4, bias='lora_only').load_state_dict(sd)


@pytest.mark.parametrize('kind', ['linear', 'conv'])
def test_planned_weights_of_a_4bit_base_are_a_fifth_of_fp32_lora(kind):
    torch.manual_seed(0)
    if kind == 'linear':
        wide = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
        batch = (torch.randn(16, 512), torch.randint(0, 10, (16,)))
    else:  # 3x3 kernels: a rank-8 adapter adds rank/out + rank/(in*9) of each weight, and the blocks of 64 run across channels
        wide = nn.Sequential(nn.Conv2d(16, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))
        batch = (torch.randn(16, 16, 8, 8), torch.randint(0, 10, (16,)))
    held = lambda m: sum(t.numel() * t.element_size() for t in (*m.parameters(), *m.buffers()))
    p32, p4 = plan_memory(wide, batch, transform=add_lora), plan_memory(wide, batch, transform=partial(add_lora, base_bits=4))
    assert p32.breakdown['weights'] == held(add_lora(copy.deepcopy(wide)))
    assert p4.breakdown['weights'] == held(add_lora(copy.deepcopy(wide), base_bits=4))
    assert p4.breakdown['weights'] <= 0.2 * p32.breakdown['weights']
    q = add_lora(copy.deepcopy(wide), base_bits=4)
    assert abs(plan_memory(q, batch).peak - measured_step_peak(q, batch)) <= 0.02 * measured_step_peak(q, batch)


def test_peft_files_round_trip_and_refuse_what_they_cannot_hold(tmp_path):
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    model = _as_trained(add_lora(copy.deepcopy(base), rank=2, alpha=5.0))
    save_peft(model, tmp_path / 'a')
    cfg = json.loads((tmp_path / 'a' / 'adapter_config.json').read_text())
    assert (cfg['peft_type'], cfg['r'], cfg['lora_alpha'], cfg['target_modules']) == ('LORA', 2, 5.0, ['0', '3'])
    keys = st.load_file(tmp_path / 'a' / 'adapter_model.safetensors')
    assert keys['base_model.model.0.lora_B.weight'].shape == (8, 2, 1, 1) and keys['base_model.model.3.lora_A.weight'].shape == (2, 288)
    assert sorted(p.name for p in (tmp_path / 'a').iterdir()) == ['adapter_config.json', 'adapter_model.safetensors']  # no temporaries left
    back = load_peft(copy.deepcopy(base), tmp_path / 'a')
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(): assert torch.equal(back(x), model(x))
    with pytest.raises(ValueError, match='Linear and Conv layers only'):
        save_peft(add_lora(copy.deepcopy(base), rank=2, train=['3']), tmp_path / 'b')
    cfg['use_dora'] = True; (tmp_path / 'a' / 'adapter_config.json').write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="use_dora"): load_peft(copy.deepcopy(base), tmp_path / 'a')


@pytest.mark.skipif(importlib.util.find_spec('peft') is None, reason='peft is not installed (an optional check)')
def test_peft_reads_our_files_and_writes_files_we_read(tmp_path):
    import peft
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
    ours = _as_trained(add_lora(copy.deepcopy(base), rank=4, alpha=8.0))
    save_peft(ours, tmp_path / 'ours')
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / 'ours').eval()
    x = torch.randn(3, 20)
    with torch.no_grad(): torch.testing.assert_close(theirs(x), ours(x))
    made = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=2, lora_alpha=6, target_modules=['2']))
    with torch.no_grad():
        for n, p in made.named_parameters():
            if 'lora_' in n: p.normal_()
    made.save_pretrained(tmp_path / 'theirs')
    back = load_peft(copy.deepcopy(base), tmp_path / 'theirs')
    with torch.no_grad(): torch.testing.assert_close(back(x), made(x))


def test_modules_that_train_in_full_keep_their_weights_under_a_quantized_base():
    model = add_lora(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), base_bits=4, train=['2'])
    assert model[0].base.weight is None and hasattr(model[0], 'qweight')
    assert not hasattr(model[2], 'qweight') and model[2].base.weight.requires_grad


def _qlora_pair(base:nn.Module):
    "(QLoRA model, fp32-base LoRA model) of `base` with the same adapters and biases, as after training."
    q = _as_trained(add_lora(copy.deepcopy(base), rank=4, base_bits=4, double_quant=True, bias='lora_only'))
    f = add_lora(copy.deepcopy(base), rank=4, bias='lora_only')
    with torch.no_grad():
        theirs = dict(f.named_parameters())
        for n, p in q.named_parameters():
            if p.requires_grad: p.add_(0.05 * torch.randn_like(p) * ('bias' in n)); theirs[n].copy_(p)  # trained biases too
    return q.eval(), f.eval()


@pytest.mark.parametrize('kind', ['linear', 'conv'])
def test_qlora_merges_then_exports_with_chapter_09s_parity(kind, tmp_path):
    "A 4-bit base's adapters fold into the dequantized weight; the merged model exports to fp32 and INT8 ONNX within chapter 09's checks."
    from netlite_nb.export import export_onnx, run_onnx
    torch.manual_seed(0)
    base = (nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 5)) if kind == 'linear' else
            nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                          nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 5)))
    q, f = _qlora_pair(base)
    x = torch.randn(256, 1, 8, 8)
    with torch.no_grad(): want, fp32_base = q(x), f(x)
    y = want.argmax(1)  # labels: the adapted model's own answers, so accuracy is agreement with it
    flat = merged(q)
    assert is_lora(q) and not is_lora(flat) and not any(isinstance(m, (LoRALinear, LoRAConv)) for m in flat.modules())
    with torch.no_grad(): torch.testing.assert_close(flat(x), want, atol=1e-5, rtol=1e-5)
    r32 = export_onnx(flat, x, tmp_path / 'q.onnx', valid=(x, y), measure_speed=False)
    got = run_onnx(tmp_path / 'q.onnx', x)
    assert r32.ok and r32.max_abs_diff['fp32'] <= 1e-4
    assert abs(got - want.numpy()).max() <= 1e-4 < abs(got - fp32_base.numpy()).max()  # the file holds the 4-bit base plus B A, not the fp32 base
    r8 = export_onnx(flat, x, tmp_path / 'q8.onnx', quantize='int8', calibration=[(x[i:i + 64], y[i:i + 64]) for i in range(0, 256, 64)],
                     valid=(x, y), measure_speed=False)
    assert r8.ok and r8.max_abs_diff['fp32'] <= 1e-4 and r8.accuracy_drop <= 1.0 and r8.agreement['int8'] >= 90, r8
