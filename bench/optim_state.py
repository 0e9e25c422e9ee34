"""Chapter 03's AdamW8bit against torch.optim.AdamW (and bitsandbytes where installed): step time, state bytes per parameter, accuracy on the MNIST sample.

Same model, initial weights, batch order, schedule (cosine from lr 2e-3, weight decay 0.01) for every optimizer;
final validation accuracy averaged over seeds.

    python bench/optim_state.py                  # 3 seeds x 4 optimizers, 5 epochs
    python bench/optim_state.py --seeds 0 --epochs 2
    python bench/optim_state.py --step-only      # just the step-time table (~1 minute)
    OMP_NUM_THREADS=1 python bench/optim_state.py --step-only   # the same on one thread
    python bench/optim_state.py --chunks         # AdamW8bit's step time by chunk size
"""
from __future__ import annotations
import argparse, math, os, statistics, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from netlite_nb.data import mnist_sample
from netlite_nb import optim
from netlite_nb.optim import AdamW8bit, state_bytes

OPTIMIZERS = {
    'torch.optim.AdamW': lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.01),
    'AdamW8bit': lambda p, lr: AdamW8bit(p, lr=lr, weight_decay=0.01),
    'AdamW8bit(min_8bit_size=0)': lambda p, lr: AdamW8bit(p, lr=lr, weight_decay=0.01, min_8bit_size=0),
    "AdamW8bit(first_moment='fp16')": lambda p, lr: AdamW8bit(p, lr=lr, weight_decay=0.01, first_moment='fp16'),
}


def _as_xy(ds):
    if isinstance(ds, (tuple, list)) and len(ds) == 2 and isinstance(ds[0], torch.Tensor): return ds
    if hasattr(ds, 'tensors'): return ds.tensors[:2]
    xs, ys = zip(*[ds[i] for i in range(len(ds))])
    return torch.stack(xs), torch.as_tensor(ys)


def load_data():
    "((x, y) train, (x, y) valid, source): chapter 04's embedded MNIST sample."
    tr, va = mnist_sample()
    return _as_xy(tr), _as_xy(va), 'netlite_nb.data.mnist_sample()'


def small_cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10))


def train(make_opt, data, seed, epochs=5, bs=64, lr=2e-3):
    "Final validation accuracy, the per-step training losses, state bytes/param and mean optimizer-step time."
    (xt, yt), (xv, yv) = data
    torch.manual_seed(seed)
    model = small_cnn()
    opt = make_opt(model.parameters(), lr)
    steps = epochs * math.ceil(len(yt) / bs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    g = torch.Generator().manual_seed(seed)
    losses, t_step = [], 0.0
    for _ in range(epochs):
        for idx in torch.randperm(len(yt), generator=g).split(bs):
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad(); loss.backward()
            t0 = time.perf_counter(); opt.step(); t_step += time.perf_counter() - t0
            sched.step(); losses.append(loss.item())
    model.eval()
    with torch.no_grad(): acc = (model(xv).argmax(1) == yv).float().mean().item()
    return acc, losses, state_bytes(opt) / sum(p.numel() for p in model.parameters()), t_step / steps


def accuracy_table(seeds=(0, 1, 2), epochs=5, data=None):
    "The comparison as a printable table (the chapter runs it with one seed)."
    tr, va, src = data or load_data()
    rows, base = [], None
    for name, make in OPTIMIZERS.items():
        res = [train(make, (tr, va), s, epochs) for s in seeds]
        accs = [r[0] * 100 for r in res]
        mean = statistics.mean(accs)
        base = mean if base is None else base
        rows.append((name, mean, statistics.pstdev(accs), mean - base, res[0][2], statistics.mean(r[3] for r in res) * 1e3,
                     statistics.mean(statistics.mean(r[1][-20:]) for r in res)))
    out = [f"data: {src}; small CNN, {epochs} epochs, batch 64, cosine lr 2e-3, seeds {list(seeds)}",
           f"{'optimizer':32s} {'valid acc %':>11s} {'± std':>6s} {'Δ pp':>6s} {'state B/param':>13s} {'step ms':>8s} {'final loss':>10s}"]
    out += [f"{n:32s} {m:11.2f} {s:6.2f} {d:+6.2f} {b:13.3f} {t:8.2f} {l:10.4f}" for n, m, s, d, b, t, l in rows]
    return '\n'.join(out)


def large_tensor_state():
    "State bytes per parameter on a model made of large tensors."
    out = []
    for name, make in OPTIMIZERS.items():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))
        o = make(m.parameters(), 1e-3)
        m(torch.randn(4, 2048)).sum().backward(); o.step()
        out.append(f"{name:32s} {state_bytes(o) / sum(p.numel() for p in m.parameters()):.3f} bytes/param")
    return '\n'.join(["state on 2 x Linear(2048, 2048) (8.4M parameters, biases included):"] + out)


def _bnb_adamw8bit():
    try: import bitsandbytes
    except Exception: return None
    return lambda p, lr: bitsandbytes.optim.AdamW8bit(p, lr=lr, weight_decay=0.01)


class _PlainAdamW8bit(AdamW8bit):
    "AdamW8bit stepping the plain way (chapter 03's `_adamw_8bit_reference`: whole tensor, fresh temporaries), for comparison."
    def _update_8bit(self, p, st, group, step_size, bc2_sqrt): optim._adamw_8bit_reference(p, st, group, step_size, bc2_sqrt)


class _ChunkedAdamW8bit(AdamW8bit):
    "AdamW8bit with its chunk forced to `chunk` values, for the sweep."
    def __init__(self, params, chunk, **kw): super().__init__(params, **kw); self.chunk = chunk
    def step(self, closure=None):
        sized, optim._chunk_values = optim._chunk_values, lambda device, block_size: self.chunk
        try: return super().step(closure)
        finally: optim._chunk_values = sized


def _paired(makers, repeats, size):
    "Each optimizer's step on its own copy of one size x size weight, in turn, `repeats` rounds: {name: [seconds]} and the optimizers."
    torch.manual_seed(0)
    w0 = torch.randn(size, size) * 0.02
    grads = [torch.randn(size, size) * 1e-3 for _ in range(3)]
    ws = {n: nn.Parameter(w0.clone()) for n in makers}
    opts = {n: make([ws[n]], 1e-3) for n, make in makers.items()}
    times = {n: [] for n in makers}
    for r in range(repeats + 1):
        for n, o in opts.items():  # interleaved, so a change in the machine's load hits every optimizer alike
            ws[n].grad = grads[r % 3]
            t0 = time.perf_counter(); o.step(); dt = time.perf_counter() - t0
            if r: times[n].append(dt)  # the first round creates the state
    return times, opts


def _ratio_cols(ts, base):
    "Median step ms, and the median and quartiles of the per-round ratio to the base's step in the same round."
    q = statistics.quantiles([t / b for t, b in zip(ts, base)], n=4, method='inclusive')
    return f"{statistics.median(ts) * 1e3:9.1f} {q[1]:8.2f} {q[0]:6.2f}–{q[2]:<5.2f}"


def step_time(repeats=15, size=2048):
    "One size x size weight: each optimizer's step in turn, `repeats` rounds; median step time and ratio to AdamW's (quartiles)."
    makers = {'torch.optim.AdamW': OPTIMIZERS['torch.optim.AdamW'], 'AdamW8bit (netlite_nb)': OPTIMIZERS['AdamW8bit'],
              'AdamW8bit, plain step': lambda p, lr: _PlainAdamW8bit(p, lr=lr, weight_decay=0.01)}
    if _bnb_adamw8bit(): makers['bitsandbytes.optim.AdamW8bit'] = _bnb_adamw8bit()
    times, opts = _paired(makers, repeats, size)
    base = times['torch.optim.AdamW']
    out = [f"step on one {size}x{size} fp32 weight ({size * size / 1e6:.1f}M parameters), {repeats} interleaved rounds, "
           f"{torch.get_num_threads()} thread(s), chunk {optim._chunk_values(torch.device('cpu'), 256)} values:",
           f"{'optimizer':32s} {'median ms':>9s} {'× AdamW':>8s} {'quartiles':>11s} {'state B/param':>13s}"]
    for n, ts in times.items():
        out.append(f"{n:32s} {_ratio_cols(ts, base)} {state_bytes(opts[n]) / size**2:13.3f}")
    if not _bnb_adamw8bit(): out.append('(bitsandbytes not installed: pip install -e ".[bnb]" to compare with it)')
    return '\n'.join(out)


def chunk_sweep(repeats=7, size=2048, chunks=tuple(2**k for k in range(12, 23, 2))):
    "AdamW8bit's step with the chunk forced to each size, against AdamW in the same rounds: what the chunk size costs."
    makers = {'torch.optim.AdamW': OPTIMIZERS['torch.optim.AdamW']}
    makers.update({c: (lambda c: lambda p, lr: _ChunkedAdamW8bit(p, c, lr=lr, weight_decay=0.01))(c) for c in chunks})
    times, _ = _paired(makers, repeats, size)
    out = [f"AdamW8bit's step by chunk size, one {size}x{size} weight, {repeats} interleaved rounds, {torch.get_num_threads()} thread(s) "
           f"(chosen here: {optim._chunk_values(torch.device('cpu'), 256)}):",
           f"{'chunk (values, KiB touched)':32s} {'median ms':>9s} {'× AdamW':>8s} {'quartiles':>11s}"]
    for c in chunks:
        out.append(f"{f'{c} ({c * optim._CHUNK_BYTES_PER_VALUE // 1024} KiB)':32s} {_ratio_cols(times[c], times['torch.optim.AdamW'])}")
    return '\n'.join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--seeds', default='0,1,2')
    ap.add_argument('--epochs', type=int, default=5)
    ap.add_argument('--threads', type=int, default=None, help="PyTorch's threads (default: its own choice, which follows OMP_NUM_THREADS)")
    ap.add_argument('--rounds', type=int, default=15, help='interleaved rounds of the step-time table')
    ap.add_argument('--step-only', action='store_true', help='only the step-time table')
    ap.add_argument('--chunks', action='store_true', help="only the step time by chunk size")
    a = ap.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)\n")
    if a.chunks: print(chunk_sweep()); return
    print(step_time(a.rounds), '\n')
    if a.step_only: return
    print(large_tensor_state(), '\n')
    t0 = time.perf_counter()
    print(accuracy_table([int(s) for s in a.seeds.split(',')], a.epochs))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == '__main__':
    main()
