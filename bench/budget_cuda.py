"""The planner against a real CUDA device: every model family of bench/budget_accuracy.py, plan vs. torch.cuda.max_memory_reserved.

    python bench/budget_cuda.py                     # every family at its two batch sizes, cudnn.benchmark off and on, on cuda:0
    python bench/budget_cuda.py --models resnet18 lstm --benchmark on    # a part
    python bench/budget_cuda.py --workspaces        # each convolution's cuDNN workspace and each RNN's saved bytes, next to the model
    python bench/budget_cuda.py --set ninth         # the CPU bench's ninth round (CTC, double backward, LSQ...); --set seventh etc. likewise
    python bench/budget_cuda.py --dry-run           # no GPU needed: builds and plans every case for a catalogue GPU (--gpu 'rtx 3060')

Each measured case runs in a fresh process (CUDA's caches, cuDNN's plan cache and the allocator's segments start empty, as in a
new training run): torch.backends.cudnn.benchmark set as asked, the model and batch moved to the device, two AdamW training steps
(the planner traces the same two), then torch.cuda.max_memory_reserved() — what the caching allocator held at its peak, which the
plan's `reserved` predicts (the CUDA context is in neither; nvidia-smi shows both). The error column is (planned - measured) /
measured; the issue's target is within +-10 %, and the script exits 1 when a case is outside it. The plan is made for the device
that is present (`device_or_gpu='cuda'`) with the same benchmark setting (`strategy.cudnn_benchmark`). Without a GPU it says so and
exits 0, so it can sit in CI and run the moment a GPU is there.

--workspaces runs every distinct convolution of the families alone (forward, then backward) in a fresh process per benchmark
setting and prints the memory it took beyond its outputs (max_memory_allocated), next to `cudnn_conv_workspace`'s two numbers (the
heuristics' engine, the bound); and for the recurrent families the bytes autograd saves for the RNN on the card (cuDNN's reserve
space among them) next to what the trace saves for it. Those are the numbers to correct the model with.
"""
import argparse, json, os, subprocess, sys
from pathlib import Path
from types import SimpleNamespace
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'bench'))
import budget_accuracy as ba
from budget_accuracy import ALL, FAMILIES, LOSSES, make, _loss, _steps  # the same models, seeds, batches, losses and training steps as the CPU bench
SETS = ba.SETS  # --set: the CPU bench's rounds of models

MODES = {'off': [False], 'on': [True], 'both': [False, True]}

def cuda_steps(name:str, bs:int, benchmark:bool=False, device:str='cuda', steps:int=2)->dict:
    "Run in a fresh process: `steps` AdamW steps of family `name` at batch `bs` on `device`; the allocator's peaks in bytes."
    torch.backends.cudnn.benchmark = benchmark
    model, (x, y) = make(name, bs)
    model, x, y = model.to(device), x.to(device), y.to(device)
    torch.cuda.reset_peak_memory_stats(device)
    _steps(model, torch.optim.AdamW(model.parameters(), lr=1e-3), x, y, steps, _loss(name))
    torch.cuda.synchronize(device)
    return dict(reserved=torch.cuda.max_memory_reserved(device), allocated=torch.cuda.max_memory_allocated(device))

def planned(name:str, bs:int, benchmark:bool=False, device='cuda')->dict:
    "The planner's peak allocated and reserved bytes for the same step on `device` (the GPU that is present, or a catalogue name)."
    from netlite_nb.budget import plan_memory
    model, batch = make(name, bs)
    p = plan_memory(model, batch, LOSSES.get(name), optimizer='adamw', device_or_gpu=device, strategy=SimpleNamespace(cudnn_benchmark=benchmark))
    return dict(reserved=p.reserved, allocated=p.peak)

def error(plan:int, measured:int)->float:
    "Relative error of a plan against a measurement: positive when the plan over-promises memory."
    return (plan - measured) / measured

def row(name:str, bs:int, plan:dict, meas:dict|None, tolerance:float=0.10, benchmark:bool=False)->str:
    "One line of the table; `meas` None (a dry run) leaves the measured columns empty."
    mib = lambda b: f"{b/2**20:>11.1f}Mi"
    head = f"{name:<13}{bs:>6}{'on' if benchmark else 'off':>6}{mib(plan['reserved'])}"
    if meas is None: return f"{head}{'-':>13}{'-':>9}{mib(plan['allocated'])}{'-':>13}"
    e = error(plan['reserved'], meas['reserved'])
    ok = 'ok' if abs(e) <= tolerance else f"OFF by more than {100*tolerance:.0f}%"
    return f"{head}{mib(meas['reserved'])}{100*e:>+8.1f}%{mib(plan['allocated'])}{mib(meas['allocated'])}  {ok}"

def in_child(flag:str, arg)->dict|list:
    "Run this script with `flag arg` in a fresh Python process; its last line of output is JSON."
    out = subprocess.run([sys.executable, __file__, flag, json.dumps(arg)], capture_output=True, text=True,
                         env={**os.environ, 'PYTHONPATH': str(ROOT)})
    if out.returncode: raise RuntimeError(f"the measuring process failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])

def measured(name:str, bs:int, benchmark:bool)->dict: return in_child('--child', [name, bs, benchmark])

def accuracy(models, modes, dry_run:bool=False, gpu:str='rtx 3060', tolerance:float=0.10)->list[float]:
    "Plan vs measured reserved peak for every case; prints the table and returns the errors (none in a dry run)."
    print(f"{'model':<13}{'batch':>6}{'bench':>6}{'plan res.':>13}{'measured':>13}{'error':>9}{'plan alloc':>13}{'measured':>13}")
    errs = []
    for name in models:
        for bs in ALL[name][2]:
            for bm in modes:
                p = planned(name, bs, bm, gpu if dry_run else 'cuda')
                m = None if dry_run else measured(name, bs, bm)
                if m: errs.append(error(p['reserved'], m['reserved']))
                print(row(name, bs, p, m, tolerance, bm), flush=True)
    if errs: print(f"max |error| {100*max(map(abs, errs)):.1f}% (target: {100*tolerance:.0f}%)")
    return errs

def conv_specs(name:str, bs:int)->list[dict]:
    "Every distinct convolution family `name` runs at batch `bs`: its layer settings and input shape, found by a forward on 'meta'."
    import copy
    model, (x, _) = make(name, bs)
    model = copy.deepcopy(model).to('meta')
    specs, hooks = [], []
    def see(mod, args):
        s = dict(kind=type(mod).__name__, c_in=mod.in_channels, c_out=mod.out_channels, kernel=list(mod.kernel_size), stride=list(mod.stride),
                 padding=list(mod.padding), dilation=list(mod.dilation), groups=mod.groups, bias=mod.bias is not None,
                 x=list(args[0].shape), xgrad=bool(args[0].requires_grad))
        if s not in specs: specs.append(s)
    for m in model.modules():
        if isinstance(m, nn.modules.conv._ConvNd): hooks.append(m.register_forward_pre_hook(see))
    with torch.no_grad(): model(x.to('meta'))
    for h in hooks: h.remove()
    return specs

def _conv(s:dict)->nn.Module:
    return getattr(nn, s['kind'])(s['c_in'], s['c_out'], s['kernel'], s['stride'], s['padding'], dilation=s['dilation'], groups=s['groups'], bias=s['bias'])

def conv_model(s:dict)->dict:
    "`cudnn_conv_workspace` for spec `s`: forward, and the larger of its backward directions, as (heuristics, bound)."
    from netlite_nb.memory.cuda import cudnn_conv_workspace
    y = list(_conv(s).to('meta')(torch.empty(s['x'], device='meta')).shape)
    w = [s['c_out'], s['c_in'] // s['groups'], *s['kernel']]
    ws = lambda d: cudnn_conv_workspace(s['x'], w, y, s['stride'], s['padding'], s['dilation'], s['groups'], 4, d)
    back = [ws('backward weight')] + ([ws('backward data')] if s['xgrad'] else [])
    return dict(forward=ws('forward'), backward=tuple(max(b[i] for b in back) for i in range(2)))

def conv_child(specs:list, benchmark:bool)->list:
    "Run in a fresh process: each convolution's forward and backward alone; the allocated peak beyond what they return, in bytes."
    torch.backends.cudnn.benchmark = benchmark
    out = []
    for s in specs:
        conv, x = _conv(s).cuda(), torch.randn(s['x'], device='cuda', requires_grad=s['xgrad'])
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); a0 = torch.cuda.memory_allocated()
        y = conv(x)
        torch.cuda.synchronize()
        fwd = torch.cuda.max_memory_allocated() - a0 - y.untyped_storage().nbytes()
        g = torch.randn_like(y)
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); a0 = torch.cuda.memory_allocated()
        y.backward(g)
        torch.cuda.synchronize()
        grads = sum(t.grad.untyped_storage().nbytes() for t in (x, *conv.parameters()) if t.grad is not None)
        out.append([fwd, torch.cuda.max_memory_allocated() - a0 - grads])
        del conv, x, y, g
    return out

def rnn_child(name:str, bs:int)->dict:
    "Run in a fresh process: the bytes autograd saves for the family's RNN on the card (weights and its input left out), and the largest uint8 one (cuDNN's reserve space)."
    model, (x, _) = make(name, bs)
    model, x = model.cuda(), x.cuda()
    rnn = next(m for m in model.modules() if isinstance(m, nn.RNNBase))
    seen = {}
    h = rnn.register_forward_pre_hook(lambda mod, args: seen.setdefault('input', args[0]))
    model(x); h.remove()
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()} | {seen['input'].untyped_storage().data_ptr()}
    saved = {}
    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip: saved[st.data_ptr()] = (st.nbytes(), t.dtype == torch.uint8)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t): rnn(seen['input'])
    return dict(saved=sum(n for n, _ in saved.values()), reserve=max((n for n, u in saved.values() if u), default=0))

def workspaces(models, dry_run:bool=False, gpu:str='rtx 3060'):
    "Print every distinct convolution's workspace measured with benchmark off and on next to the model, then the RNNs' saved bytes."
    mib = lambda b: f"{b/2**20:9.2f}"
    print("Convolutions: MiB beyond the outputs (forward | backward); model: heuristics' engine and bound (with benchmark on, the first call's buffer)")
    print(f"{'family':<13}{'input':<22}{'w':<18}{'off fwd':>9}{'off bwd':>9}{'on fwd':>9}{'on bwd':>9}{'heur fwd':>9}{'heur bwd':>9}{'bound fwd':>10}{'bound bwd':>10}")
    for name in models:
        specs = conv_specs(name, ALL[name][2][0])
        if not specs: continue
        off = on = [[None, None]] * len(specs)
        if not dry_run: off, on = in_child('--conv-child', [specs, False]), in_child('--conv-child', [specs, True])
        for s, o, b in zip(specs, off, on):
            m = conv_model(s)
            meas = ''.join(f"{'-':>9}" if v is None else mib(v) for v in (*o, *b))
            w = 'x'.join(map(str, [s['c_out'], s['c_in'] // s['groups'], *s['kernel']]))
            print(f"{name:<13}{str(tuple(s['x'])):<22}{w:<18}{meas}"
                  f"{mib(m['forward'][0])}{mib(m['backward'][0])} {mib(m['forward'][1])} {mib(m['backward'][1])}")
    from netlite_nb.budget import plan_memory
    print("\nRNNs: MiB autograd saves for the RNN module (without its weights and input): measured on the card, and in the trace")
    for name in models:
        model, batch = make(name, ALL[name][2][0])
        rnn = next((n for n, m in model.named_modules() if isinstance(m, nn.RNNBase)), None)
        if rnn is None: continue
        traced = plan_memory(model, batch, device_or_gpu=gpu if dry_run else 'cuda').by_module.get(rnn, 0)
        got = None if dry_run else in_child('--rnn-child', [name, ALL[name][2][0]])
        print(f"{name:<13}saved {'-' if got is None else mib(got['saved'])} (reserve space {'-' if got is None else mib(got['reserve'])}), traced {mib(traced)}")

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--child', help=argparse.SUPPRESS)
    ap.add_argument('--conv-child', help=argparse.SUPPRESS)
    ap.add_argument('--rnn-child', help=argparse.SUPPRESS)
    ap.add_argument('--set', choices=list(SETS), default='families', help="which of the CPU bench's rounds of models (default: the fourteen families)")
    ap.add_argument('--models', nargs='+', metavar='MODEL', help="a part of the set (default: all of it)")
    ap.add_argument('--benchmark', choices=list(MODES), default='both', help='torch.backends.cudnn.benchmark for the measured runs and their plans')
    ap.add_argument('--workspaces', action='store_true', help="each convolution's cuDNN workspace and each RNN's saved bytes next to the model")
    ap.add_argument('--dry-run', action='store_true', help='no GPU: build and plan every case for --gpu, measure nothing')
    ap.add_argument('--gpu', default='rtx 3060', help='the catalogue GPU a dry run plans for')
    ap.add_argument('--tolerance', type=float, default=0.10, help='largest |error| of a case that passes')
    a = ap.parse_args(argv)
    if a.child: print(json.dumps(cuda_steps(*json.loads(a.child)))); return 0
    a.models = a.models or list(SETS[a.set])
    if unknown := [m for m in a.models if m not in SETS[a.set]]: ap.error(f"not in --set {a.set}: {', '.join(unknown)} (it has {', '.join(SETS[a.set])})")
    if a.conv_child: print(json.dumps(conv_child(*json.loads(a.conv_child)))); return 0
    if a.rnn_child: print(json.dumps(rnn_child(*json.loads(a.rnn_child)))); return 0
    if not a.dry_run and not torch.cuda.is_available():
        print("No CUDA device here: nothing measured. Run this on a machine with a GPU, or add --dry-run to build and plan every case.")
        return 0
    print(f"dry run: plans for {a.gpu}, nothing measured" if a.dry_run else
          f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    if a.workspaces: workspaces(a.models, a.dry_run, a.gpu); return 0
    errs = accuracy(a.models, MODES[a.benchmark], a.dry_run, a.gpu, a.tolerance)
    return 1 if any(abs(e) > a.tolerance for e in errs) else 0

if __name__ == '__main__': sys.exit(main())
