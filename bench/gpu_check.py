"""The CUDA paths of netlite_nb on a real card, in one command: `python bench/gpu_check.py [--quick]`.

Nothing here can be checked on a CPU-only machine, so this is kept ready for the moment a GPU is at hand. It prints one
table row per check (what was measured, what it should be, ok) and exits 1 when any check fails, 2 when there is no CUDA
device (nothing was checked, which is not a pass). The checks:

- probe: NVML's total and free memory against `torch.cuda.mem_get_info`, and `device_memory` against `torch.cuda`;
- allocator settings: a strategy's `alloc_conf` (expandable segments) applied before CUDA starts, seen in the
  allocator's own snapshot (in a fresh process: the settings are read when CUDA starts);
- planner: `plan_memory(..., device_or_gpu='cuda')`'s reserved bytes against `torch.cuda.max_memory_reserved` after two
  real training steps (target within ±10 %), through bench/budget_cuda.py — three of its families with cudnn.benchmark off
  and the encoder-decoder with it on, each in a fresh process so one model's cached blocks do not count for the next
  (`python bench/budget_cuda.py` runs every family);
- precision: a Trainer step in bf16 and fp16 autocast (with GradScaler for fp16): the forward really computes in the
  low dtype, the loss stays finite and falls, the scaler is on only for fp16;
- out of memory: `torch.cuda.set_per_process_memory_fraction` makes a small budget, the Trainer's first micro-batch
  raises a real `torch.OutOfMemoryError`, and the run recovers (smaller micro-batch or checkpointing) and finishes
  every optimizer step;
- dashboard: `LiveDashboard`'s VRAM readings during that run against `torch.cuda.memory_reserved` right after;
- offload (chapter 03a): for each lever (optimizer state, state and gradients, the step inside backward, saved activations,
  half-precision weights on the card with fp32 masters on the host, weights streamed from the host block by block),
  in a fresh process: the planned reserved bytes against `torch.cuda.max_memory_reserved` after two real steps (±10 %), the
  weights against the ordinary step's (within 1e-5; the half-precision masters within 1e-2), and the measured extra step time against the plan's estimate.
"""
import argparse, json, os, subprocess, sys, textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ROWS = []

def row(name, measured, expected, ok):
    ROWS.append((name, str(measured), str(expected), bool(ok)))
    print(f"{'ok ' if ok else 'BAD'}  {name}: {measured}  (expected {expected})", flush=True)

def in_fresh_process(code:str)->dict:
    "Run `code` in a new Python (CUDA not yet started there); it prints one JSON line, which is returned."
    r = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, 'PYTHONPATH': str(ROOT)}, timeout=600)
    if r.returncode: raise RuntimeError(f"child failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])

def check_probe():
    import torch
    from netlite_nb.probe import probe, device_memory
    hw = probe()
    g = next((g for g in hw.gpus if g.backend == 'cuda'), None)
    free, total = torch.cuda.mem_get_info()
    row('probe finds the CUDA card with NVML', g and f"{g.name} via {g.source}", 'a GPU read by nvml', g is not None and g.source == 'nvml')
    if g is None: return
    row('probe total memory vs mem_get_info', f"{g.total_memory / 2**30:.2f} GiB", f"{total / 2**30:.2f} GiB ±2%", abs(g.total_memory - total) <= 0.02 * total)
    r = device_memory('cuda')
    row('device_memory total vs mem_get_info', f"{r.total / 2**30:.2f} GiB", f"{total / 2**30:.2f} GiB ±2%", abs(r.total - total) <= 0.02 * total)
    row('device_memory reserved vs torch.cuda', r.reserved, torch.cuda.memory_reserved(), r.reserved == torch.cuda.memory_reserved())
    # NVML's used memory is the whole card's (other processes too): at least what this process reserved
    row('NVML used >= reserved', r.used, f">= {r.reserved}", r.used is not None and r.used >= r.reserved)

def check_alloc_conf():
    out = in_fresh_process("""
        import json, torch
        from netlite_nb.strategies import load_strategy, apply_allocator_settings
        s = load_strategy('gtx_1050_ti')
        note = apply_allocator_settings(s)
        x = torch.empty(64 * 2**20, device='cuda')
        segs = torch.cuda.memory_snapshot()
        print(json.dumps({'conf': s.alloc_conf, 'note': note, 'expandable': any(sg.get('is_expandable') for sg in segs)}))
    """)
    row("strategy alloc_conf applied before CUDA starts", out['note'], 'applied (...) before CUDA started', 'before CUDA started' in out['note'])
    want = 'expandable_segments:True' in (out['conf'] or '')
    row('allocator snapshot shows expandable segments', out['expandable'], want, out['expandable'] == want)

def check_planner(quick:bool):
    "Three families of bench/budget_cuda.py (its plan and its fresh-process measurement), cudnn.benchmark off, and the conv net with it on."
    sys.path.insert(0, str(ROOT / 'bench'))
    import budget_cuda as C
    for name, bm in (('resnet18', False), ('encdec', False), ('lstm', False), ('encdec', True)):
        bs = C.FAMILIES[name][2][0 if quick else 1]
        p, m = C.planned(name, bs, bm), C.measured(name, bs, bm)
        err = C.error(p['reserved'], m['reserved'])
        row(f"planner reserved, {name} batch {bs}, cudnn.benchmark {'on' if bm else 'off'}",
            f"{p['reserved'] / 2**20:.1f} MiB planned, {m['reserved'] / 2**20:.1f} MiB measured ({err:+.1%})", 'within ±10%', abs(err) <= 0.10)

def _loaders(n, bs):
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 28, 28, generator=g); y = (x.mean((1, 2, 3)) > 0).long() + 2 * (x[:, :, :14].mean((1, 2, 3)) > 0).long()
    return DataLoader(TensorDataset(x, y), bs, shuffle=True, generator=g), DataLoader(TensorDataset(x[:256], y[:256]), 256)

def check_precision():
    import torch
    from netlite_nb.models import create_model
    from netlite_nb.train import Trainer
    from netlite_nb.probe import bf16_is_native
    cc = '.'.join(map(str, torch.cuda.get_device_capability()))
    for prec in ('bf16', 'fp16'):
        if prec == 'bf16' and not bf16_is_native(cc): row('bf16 autocast', f'skipped: compute capability {cc}', 'cc >= 8.0', True); continue
        m = create_model('netlite_tiny', num_classes=4)
        seen = []
        h = m.head.register_forward_hook(lambda mod, a, o: seen.append(o.dtype)) if hasattr(m, 'head') else None
        t = Trainer(m, _loaders(2048, 128), device='cuda', precision=prec, progress=False, verbose=False, log_every=1, lr=3e-3)
        t.fit(2)
        if h: h.remove()
        losses = [r['loss'] for r in t.history if 'loss' in r]
        want = {'bf16': torch.bfloat16, 'fp16': torch.float16}[prec]
        row(f'{prec}: forward computes in {want}', seen[:1], [want], bool(seen) and seen[0] == want)
        first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3   # means of three records: one step's loss is noisy
        row(f'{prec}: loss finite and falling', f"{first:.3f} -> {last:.3f}", 'finite, lower',
            all(map(lambda v: v == v and abs(v) != float('inf'), losses)) and last < first)
        row(f'{prec}: GradScaler enabled', t.scaler.is_enabled(), prec == 'fp16', t.scaler.is_enabled() == (prec == 'fp16'))

def check_oom_and_dashboard():
    import torch
    from netlite_nb.models import create_model
    from netlite_nb.train import Trainer
    from netlite_nb.live import LiveDashboard
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    base = torch.cuda.memory_reserved()
    budget = base + 1536 * 2**20   # room for the model and a modest batch, far less than a batch of 4096 needs
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    try:
        dash = LiveDashboard(mode='text', interval=0.0)
        m = create_model('resnet', num_classes=4, in_channels=1, image_size=28)
        t = Trainer(m, _loaders(8192, 4096), device='cuda', precision='fp32', progress=False, verbose=False, log_every=1,
                    callbacks=[dash], plan=False, accum_steps=1)
        t.fit(1)
        row('a real torch.OutOfMemoryError was raised and reported', len(t.oom_reports), '>= 1', len(t.oom_reports) >= 1)
        row('the run recovered and finished every step', t.step, 2, t.step == 2)
        row('micro-batch after recovery', t.micro_batch, '< 4096 (or checkpointing on)', t.micro_batch < 4096 or t.state.checkpointing)
        now = torch.cuda.memory_reserved()
        r = dash.reading
        row('dashboard VRAM reading is torch.cuda.memory_reserved', r and r.reserved, now, r is not None and r.reserved == now)
        row('dashboard peak <= budget', f"{dash.peak / 2**20:.0f} MiB", f"<= {budget / 2**20:.0f} MiB", dash.peak <= budget)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)

_OFFLOAD_CHILD = """
    import json, time, torch, torch.nn as nn, torch.nn.functional as F
    from netlite_nb.budget import plan_memory
    from netlite_nb.memory.trace import make_optimizer
    from netlite_nb.offload import half_weights_bf16, half_weights_fp16, offload_activations, offload_transform, stream_weights_checkpointed
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)) for _ in range(4)]).cuda()
    opt_name, act, half, stream = {opt!r}, {act!r}, {half!r}, {stream!r}
    half = half and (half_weights_bf16 if torch.cuda.is_bf16_supported(including_emulation=False) else half_weights_fp16)
    tfs = [t for t in (half, stream_weights_checkpointed if stream else None, offload_activations if act else None) if t]
    x = torch.randn(16, 256, 2048, device='cuda')
    plan = plan_memory(model, (x, x), loss_fn=F.mse_loss, optimizer=opt_name, transform=offload_transform(tfs), device_or_gpu='cuda')
    for t in tfs: model = t(model)  # checkpointing (with streamed weights) wraps the blocks in a new top module
    opt = make_optimizer(opt_name, model.parameters())
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(4):
        torch.cuda.synchronize(); t = time.perf_counter()
        F.mse_loss(model(x), x).backward(); opt.step(); opt.zero_grad()
        torch.cuda.synchronize(); times.append(time.perf_counter() - t)
    ws = list(opt.host.values()) if half else list(model.parameters())  # half weights: compare the fp32 masters
    print(json.dumps(dict(planned=plan.reserved, measured=torch.cuda.max_memory_reserved(), step=min(times[1:]),
                          estimate=plan.host.get('offload time per step'), weights=[p.detach().double().sum().item() for p in ws])))
"""

def check_offload():
    "Each offload lever on this card: device memory against its plan, the same weights as the ordinary step, the step time."
    base = in_fresh_process(_OFFLOAD_CHILD.format(opt='adamw', act=False, half=False, stream=False))
    for opt, act, half, stream in (('adamw-offload', False, False, False), ('adamw-offload-grads', False, False, False), ('adamw-in-backward', False, False, False),
                                   ('adamw', True, False, False), ('adamw-offload-grads', False, True, False), ('adamw', False, False, True)):
        name = opt + (' + activations to host' if act else '') + (' + half-precision weights on the card' if half else '') + (' + weights streamed from the host' if stream else '')
        out = in_fresh_process(_OFFLOAD_CHILD.format(opt=opt, act=act, half=half, stream=stream))
        err = (out['planned'] - out['measured']) / out['measured']
        row(f"offload {name}: planned reserved", f"{out['planned'] / 2**20:.0f} MiB planned, {out['measured'] / 2**20:.0f} MiB measured ({err:+.1%})", 'within ±10%', abs(err) <= 0.10)
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(out['weights'], base['weights']))
        tol = 1e-2 if half else 1e-5  # half weights: the forward sees weights rounded to 8-11 bits, so only a sanity bound on the masters
        row(f"offload {name}: weights vs the ordinary step", f"{diff:.1e} largest relative difference of a weight sum", f'<= {tol:g}', diff <= tol)
        row(f"offload {name}: step time", f"{out['step'] / base['step']:.2f}x the ordinary step ({out['step'] * 1e3:.0f} ms)",
            f"plan's estimate: {out['estimate'] or 'no offload time'} extra", True)  # recorded for the chapter, not a pass/fail

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='the smaller batch of each family in the planner check')
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("No CUDA device: nothing was checked (exit 2). Run this on a machine with an NVIDIA GPU.")
        return 2
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
    for check in (check_probe, check_alloc_conf, lambda: check_planner(args.quick), check_precision, check_oom_and_dashboard, check_offload):
        try: check()
        except Exception as e: row(getattr(check, '__name__', 'planner'), f"raised {type(e).__name__}: {str(e)[:300]}", 'no error', False)
    w = max(len(n) for n, *_ in ROWS)
    print('\n' + '\n'.join(f"{n:<{w}}  {'ok ' if ok else 'BAD'}  {m}  [{e}]" for n, m, e, ok in ROWS))
    bad = [n for n, *_, ok in ROWS if not ok]
    print(f"\n{len(ROWS) - len(bad)} of {len(ROWS)} checks passed" + (f"; failed: {', '.join(bad)}" if bad else ''))
    return 1 if bad else 0

if __name__ == '__main__': sys.exit(main())
