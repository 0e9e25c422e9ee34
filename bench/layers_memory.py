"""Chapter 02's memory-saving layers against plain PyTorch, measured in one run.

For each technique: bytes saved for backward (saved-tensor hooks, distinct storages, parameters excluded), the peak
of tensors allocated during one forward+backward step (a dispatch-mode tracker, any device), the time ratio, and for
the headline cases the peak RSS increase of a fresh process running one step (``--no-rss`` skips those).

    python bench/layers_memory.py            # the issue's shapes; a few minutes on 2 CPU cores
    python bench/layers_memory.py --small    # quick shapes
"""
from __future__ import annotations
import argparse, copy, json, os, resource, subprocess, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from netlite_nb.layers import (ChunkedFFN, BitReLU, BitDropout, chunked_linear_cross_entropy, checkpoint_every,
                               convert_model, compare_steps, MemoryComparison)


def shapes(small):
    return dict(ffn=(2048, 256) if small else (8192, 512), ce=(1024, 128, 8192) if small else (4096, 256, 32768),
                act=(256, 1024) if small else (2048, 2048), deep=(16, 256, 512) if small else (32, 512, 2048))


def build(case, small):
    "(fn, inputs, params) for the plain and netlite versions of `case`."
    torch.manual_seed(0)
    s = shapes(small)
    if case == 'ffn':
        n, d = s['ffn']
        plain = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        ours = ChunkedFFN.from_sequential(copy.deepcopy(plain))
        x = torch.randn(n, d, requires_grad=True)
        def fwd_chunked(x, chunk=max(1, n // 16)): return torch.cat([plain(x[i:i + chunk]) for i in range(0, n, chunk)])
        return {'Sequential(Linear,GELU,Linear)': (plain, (x,), list(plain.parameters())),
                'chunked forward, no recompute': (fwd_chunked, (x,), list(plain.parameters())),
                'ChunkedFFN': (ours, (x,), list(ours.parameters()))}
    if case == 'ce':
        n, d, v = s['ce']
        head = nn.Linear(d, v)
        x, y = torch.randn(n, d, requires_grad=True), torch.randint(0, v, (n,))
        return {'F.cross_entropy(linear(x), y)': (lambda x: F.cross_entropy(head(x), y), (x,), list(head.parameters())),
                'chunked_linear_cross_entropy': (lambda x: chunked_linear_cross_entropy(x, head.weight, head.bias, y), (x,), list(head.parameters()))}
    if case == 'relu':
        n, d = s['act']
        x = torch.randn(n, d, requires_grad=True)
        return {'ReLU (alone)': (lambda t: F.relu(t * 1), (x,), []), 'BitReLU (alone)': (lambda t: BitReLU()(t * 1), (x,), [])}
    if case == 'dropout':
        n, d = s['act']
        x = torch.randn(n, d, requires_grad=True)
        return {'Dropout(0.1) (alone)': (lambda t: F.dropout(t * 1, 0.1), (x,), []),
                'BitDropout(0.1) (alone)': (lambda t: BitDropout(0.1)(t * 1), (x,), [])}
    if case == 'mlp':
        n, d = s['act']
        plain = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Dropout(0.1), nn.Linear(d, d))
        ours = convert_model(copy.deepcopy(plain), ffn=False)
        x = torch.randn(n, d, requires_grad=True)
        return {'Linear→ReLU→Dropout→Linear': (plain, (x,), list(plain.parameters())),
                'with BitReLU, BitDropout': (ours, (x,), list(ours.parameters()))}
    if case == 'checkpoint':
        depth, w, n = s['deep']
        layers = []
        for _ in range(depth): layers += [nn.Linear(w, w), nn.BatchNorm1d(w), nn.ReLU()]
        plain = nn.Sequential(*layers)
        ours = checkpoint_every(copy.deepcopy(plain))
        x = torch.randn(n, w, requires_grad=True)
        return {f'{depth}×(Linear,BN,ReLU)': (plain, (x,), list(plain.parameters())),
                f'checkpoint_every (k={ours.segment_size})': (ours, (x,), list(ours.parameters()))}
    if case == 'cnn':
        def cnn(): return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
                                 nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                                 nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
        plain = cnn(); ours = convert_model(copy.deepcopy(plain), checkpoint=True)
        x = torch.randn(64 if small else 256, 1, 28, 28, requires_grad=True)
        return {'small CNN': (plain, (x,), list(plain.parameters())),
                'convert_model(checkpoint=True)': (ours, (x,), list(ours.parameters()))}
    raise ValueError(case)


CASES = ['ffn', 'ce', 'relu', 'dropout', 'mlp', 'checkpoint', 'cnn']
RSS_CASES = ['ffn', 'ce', 'checkpoint']


def rss_child(case, index, small):
    "Run in a fresh process: peak RSS growth (bytes) of one training step of implementation `index` of `case`."
    import psutil
    # warm up at the quick shapes: thread pools, BLAS buffers and lazy kernels are not the layer's memory
    wfn, wins, _ = list(build(case, True).values())[index]
    wfn(*wins).sum().backward()
    fn, ins, ps = list(build(case, small).values())[index]
    before = psutil.Process().memory_info().rss
    fn(*ins).sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    print(json.dumps(max(0, peak - before)))


def rss(case, index, small):
    out = subprocess.run([sys.executable, __file__, '--rss-child', case, str(index), '--threads', str(torch.get_num_threads())] + (['--small'] if small else []),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--small', action='store_true', help='quick shapes')
    ap.add_argument('--no-rss', action='store_true', help='skip the fresh-process peak-RSS runs')
    ap.add_argument('--cases', default=','.join(CASES))
    ap.add_argument('--repeats', type=int, default=2)
    ap.add_argument('--threads', type=int, default=1,
                    help='intra-op threads (default 1: on a shared machine, thread barriers make multi-threaded timings noise)')
    ap.add_argument('--rss-child', nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.rss_child: return rss_child(a.rss_child[0], int(a.rss_child[1]), a.small)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, shapes {shapes(a.small)}\n")
    for case in a.cases.split(','):
        t0 = time.perf_counter()
        cases = build(case, a.small)
        cmp = compare_steps(cases, repeats=a.repeats)
        print(f"== {case}  ({time.perf_counter() - t0:.0f} s)")
        print(cmp)
        if case in RSS_CASES and not (a.no_rss or a.small):  # at the quick shapes the warm-up is the step itself
            r = [rss(case, i, a.small) for i in range(len(cases))]
            print('fresh-process peak RSS growth: ' + ', '.join(f"{n}: {b/2**20:,.0f} MB ({b/max(r[0], 1):.3f}×)" for n, b in zip(cases, r)))
        print()


if __name__ == '__main__':
    main()
