"""Chapter 03a's offloads on this CPU and planned for catalogue cards; writes bench/results/offload/<machine>.json.

On the CPU (the host is the device, so nothing is saved; what is measured is the cost of the mechanism itself):
  - step time of each offload against the ordinary AdamW step: `--repeats` paired rounds, each config timed for `--steps`
    steps right after the plain one, the median of the per-round ratios (the machine may be shared: only ratios measured
    side by side mean anything);
  - whether each ends at the plain step's weights, bit for bit;
  - the planner's host rows (optimizer state, saved activations) against the bytes the real mechanisms hold.
Planned (no GPU needed): for each card, the largest GPT-style model (4 blocks, width d, sequence 256, batch 8, AdamW) that fits
with the best plan without the offload levers (8-bit AdamW state and checkpointing; on cards with bf16 arithmetic also bf16 weights)
and with them (half-precision weights on the card, fp32 masters, AdamW state (fp32 or 8-bit, whichever plan fits) and gradients on the host,
checkpointed segments' inputs in host memory; on cards with bf16 arithmetic also bf16 weights with stochastic rounding and 8-bit state on
the host, with no fp32 masters; and the weights streamed from the host block by block, each block checkpointed, with gradients and 8-bit
state on the host), each with its estimated compute and offload time per step (`step_seconds`, `offload_seconds`). The GPU figures are estimates until `bench/gpu_check.py` runs on a card.
The plans with the levers are made for stated hosts (`--hosts`, GiB of RAM), not this machine: what the offloads hold on the host
(pinned and pageable, with the pinned allocator's rounding) must fit `host_budget(ram)`, as the card's bytes must fit the card.

    python bench/offload.py [--repeats 5] [--steps 5] [--cards 'gtx 1050 ti' 'gtx 1650' 'rtx 3060'] [--hosts 32 64 128] [--reuse-without]
"""
import argparse, copy, json, math, os, platform, statistics, sys, time
os.environ.setdefault('OMP_NUM_THREADS', '1')
import torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from budget_accuracy import machine, _git, _slug, save_result, ROOT
from netlite_nb.budget import plan_memory
from netlite_nb.memory.trace import resolve_target
from netlite_nb.layers import memory_transform
from netlite_nb.memory.trace import make_optimizer
from netlite_nb.optim import bf16_weights, state_bytes
from netlite_nb.offload import (HostOptimizer, StepInBackward, half_weights_bf16, half_weights_fp16, host_budget, offload_activations, offload_hooks,
                                offload_seconds, step_seconds, stream_weights, stream_weights_checkpointed)
from netlite_nb.memory.trace import is_host_resident
from netlite_nb.probe import lookup_gpu

class Block(nn.Module):
    def __init__(self, d, heads=4):
        super().__init__(); self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.att, self.ffn = nn.MultiheadAttention(d, heads, batch_first=True), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x):
        h = self.ln1(x); x = x + self.att(h, h, h, need_weights=False)[0]
        return x + self.ffn(self.ln2(x))

def gpt(d, blocks=4, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(*[Block(d) for _ in range(blocks)])

CONFIGS = {  # name -> (optimizer, model transform)
    'plain adamw': ('adamw', None), 'adamw-offload': ('adamw-offload', None), 'adamw-offload-grads': ('adamw-offload-grads', None),
    'adamw-in-backward': ('adamw-in-backward', None), 'activations to host': ('adamw', offload_activations),
    'stream weights': ('adamw', stream_weights)}

def run_steps(name, steps, d, seq, batch, seed=1):
    "Train `steps` steps of config `name` from the same weights and data; (seconds, final weights)."
    opt_name, tf = CONFIGS[name]
    m = gpt(d); m = tf(m) if tf else m
    opt = make_optimizer(opt_name, m.parameters())
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(batch, seq, d, generator=g) for _ in range(steps + 1)]
    def one(x): F.mse_loss(m(x), x).backward(); opt.step(); opt.zero_grad()
    one(xs[0])  # warm-up: state allocated, kernels chosen
    t = time.perf_counter()
    for x in xs[1:]: one(x)
    return time.perf_counter() - t, [p.detach().clone() for p in m.parameters()]

def cpu_steps(repeats, steps, d=128, seq=64, batch=8):
    ratios, equal = {k: [] for k in CONFIGS if k != 'plain adamw'}, {}
    for _ in range(repeats):
        base, wb = run_steps('plain adamw', steps, d, seq, batch)
        for k in ratios:
            t, w = run_steps(k, steps, d, seq, batch)
            ratios[k].append(t / base)
            equal[k] = all(torch.equal(a, b) for a, b in zip(wb, w))
    return {k: dict(time_ratio=round(statistics.median(v), 3), ratios=[round(r, 3) for r in v], weights_equal=equal[k]) for k, v in ratios.items()}

def host_terms(d=128, seq=64, batch=8):
    "The plan's host rows for a CUDA card (whose attention kernels save what the CPU's fused ones do) against what the real mechanisms hold on this CPU."
    b = (torch.empty(batch, seq, d, device='meta'), torch.empty(batch, seq, d, device='meta'))
    plan = plan_memory(gpt(d), b, loss_fn=F.mse_loss, optimizer='adamw-offload', transform=offload_activations, device_or_gpu='rtx 3060')
    m = gpt(d); opt = HostOptimizer(m.parameters(), 'adamw')
    held, (pack, unpack) = [], offload_hooks(False)
    def spy(t):
        out = pack(t)
        if out is not t: held.append(out[1].numel() * out[1].element_size())
        return out
    x = torch.randn(batch, seq, d)
    with torch.autograd.graph.saved_tensors_hooks(spy, unpack): out = m(x)
    F.mse_loss(out, x).backward(); opt.step()
    return dict(saved_activations=dict(planned=plan.host['host: saved activations (pinned)'], measured=sum(held)),
                optimizer_state=dict(planned=plan.host['host: optimizer state (pageable)'], measured=state_bytes(opt.inner)), **streamed_terms(d, seq, batch))

def streamed_terms(d=128, seq=64, batch=8):
    "The plan's rows for streamed weights on a CUDA card against a real streamed step on this CPU: host weights, gradients, optimizer state, and bus bytes (copies made plus gradients)."
    b = (torch.empty(batch, seq, d, device='meta'), torch.empty(batch, seq, d, device='meta'))
    plan = plan_memory(gpt(d), b, loss_fn=F.mse_loss, optimizer='adamw', transform=stream_weights_checkpointed, device_or_gpu='rtx 3060')
    m = stream_weights_checkpointed(gpt(d)); opt = make_optimizer('adamw', m.parameters())
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)
    copies = []  # each block's weights as its layers see them, once per forward and recompute: the copies the hooks made
    for blk in m: blk.register_forward_pre_hook(lambda mod, a: copies.append(nbytes(p for p in mod.parameters() if not is_host_resident(p))))
    x = torch.randn(batch, seq, d)
    F.mse_loss(m(x), x).backward()
    host = [p for p in m.parameters() if is_host_resident(p)]
    grads = nbytes(p.grad for p in host)
    opt.step()
    return dict(streamed_weights=dict(planned=plan.host['host: streamed weights (pinned)'], measured=nbytes(host)),
                streamed_gradients=dict(planned=plan.host['host: streamed gradients (pageable)'], measured=grads),
                streamed_optimizer_state=dict(planned=plan.host['host: optimizer state (pageable)'], measured=state_bytes(opt)),
                streamed_bus_per_step=dict(planned=plan.host['bus per step'], measured=sum(copies) + grads))

def fits(card, d, options, seq, batch, host=None):
    "The best (smallest) plan among `options` (optimizer, precision, transform) for width `d` on `card` with `host` bytes of host budget: (fits, plan, model, batch)."
    b = (torch.empty(batch, seq, d, device='meta'), torch.empty(batch, seq, d, device='meta'))
    with torch.device('meta'): model = gpt(d)  # shapes only: a plan never reads the weights, and a 3-billion-parameter model would not fit here
    plans = [plan_memory(model, b, loss_fn=F.mse_loss, device_or_gpu=card, optimizer=o, precision=p, transform=t, host_budget=host) for o, p, t in options]
    best = min(plans, key=lambda p: (not p.fits, p.total))
    return best.fits, best, model, b

def _bisect(ok, lo, hi):
    "The largest multiple of 128 in [lo, hi) for which `ok` holds, given ok(lo) and not ok(hi)."
    while hi - lo > 128:
        mid = (lo + hi) // 2 // 128 * 128
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo

def _bracket(card, ok, bytes_per_param):
    "(lo, hi) around the width whose weights, gradients and state take `card` at `bytes_per_param`: ok(lo), not ok(hi)."
    guess = int(math.sqrt(lookup_gpu(card).memory_bytes / bytes_per_param / 48))  # a block has about 12 d² weights; 4 blocks
    lo, hi = max(128, int(guess * 0.6) // 128 * 128), int(guess * 1.4) // 128 * 128 + 128
    while not ok(lo):  # the host, not the card, may bound it: halve down
        if lo == 128: raise RuntimeError(f"{card}: not even width 128 fits")
        lo, hi = max(128, lo // 2 // 128 * 128), lo
    while ok(hi): lo, hi = hi, hi * 2  # the weights off the card too: far more fits than the card's bytes per parameter say
    return lo, hi

def largest(card, options, seq, batch, bytes_per_param, proxy=None, host=None):
    """The largest width (a multiple of 128) whose best plan among `options` fits `card`, that plan and its estimated time.
    With `proxy` (options that are cheaper to plan: chapter 03's 8-bit step is traced chunk by chunk, minutes a plan at these sizes),
    the proxy plans find the boundary, corrected by the bytes per parameter the real options save over the proxy at one width
    (optimizer state: proportional to the parameters); real plans then confirm it: the width fits and the next one does not.
    `host`: the bytes of host memory the offloads may hold (`host_budget`), checked like the card's."""
    ok = lambda d, opts=options: fits(card, d, opts, seq, batch, host)[0]
    if proxy is None: d = _bisect(ok, *_bracket(card, ok, bytes_per_param))
    else:
        dp = _bisect(lambda d: ok(d, proxy), *_bracket(card, lambda d: ok(d, proxy), bytes_per_param * 1.6))
        real, cheap = fits(card, dp, options, seq, batch)[1], fits(card, dp, proxy, seq, batch)[1]
        saved = (cheap.total - real.total) / real.params
        def predicted(d):
            p = fits(card, d, proxy, seq, batch)[1]
            return p.total - saved * p.params <= p.budget
        d = _bisect(predicted, dp, 2 * dp)
        if ok(d):
            while ok(d + 128): d += 128
        else:
            while not ok(d): d -= 128
    _, plan, model, b = fits(card, d, options, seq, batch, host)
    nxt = fits(card, d + 128, options, seq, batch, host)[1]  # what the next width runs out of: the card, the host, or both
    stopped_by = [k for k, full in (('card', nxt.total > nxt.budget), ('host', nxt.host_fits is False)) if full]
    target = resolve_target(card)
    compute, how_compute = step_seconds(model, b, target)
    bus, traffic = plan.host.get('bus per step', 0), plan.host.get('host traffic per step', 0)
    offload, how_offload = offload_seconds(bus, traffic, target)
    return dict(width=d, params=plan.params, total=plan.total, how=f"{plan.optimizer}, {plan.precision}, {plan.transform or 'no transform'}",
                bus_bytes=bus, host_traffic_bytes=traffic, host_held_bytes=plan.host_held, host_budget=plan.host_budget,
                host_rows={k: v for k, v in plan.host.items() if k.startswith('host:')}, stopped_by=stopped_by,
                compute_s=round(compute, 4), offload_s=round(offload if bus or traffic else 0.0, 4), how_compute=how_compute,
                how_offload=how_offload if bus or traffic else 'nothing offloaded', **_stamp())

def _stamp():
    "When and at which commit a row was planned (rows of several runs share one file)."
    return dict(date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), commit=_git('rev-parse', '--short=10', 'HEAD') or None)

def largest_models(cards, hosts_gib, seq=256, batch=8, stored=None):
    "Per card: the largest model without the levers (taken from `stored` rows, which hold nothing on the host, when given) and with them on each host."
    ck = memory_transform(True)
    out = []
    for card in cards:
        spec = lookup_gpu(card)
        # without the levers, the smallest plan of each kind for a model whose weights dominate: 8-bit state and checkpointing, fp32
        # (autocast would add half-precision copies of the weights), or, where the card computes in bf16, bf16 weights with stochastic
        # rounding (chapter 03), whose weights and gradients take 2 bytes instead of 4 and so always plan smaller
        bf = _named(lambda m: ck(bf16_weights(m)), 'bf16_weights + checkpointing')
        without, proxy = ([('adamw8bit-bf16sr', 'bf16', bf)], [('adamw-bf16sr', 'bf16', bf)]) if spec.bf16_native else ([('adamw8bit', 'fp32', ck)], [('adamw', 'fp32', ck)])
        # with them: half-precision weights on the card (fp16 where bf16 is emulated), fp32 masters, state and gradients on the host,
        # the checkpointed segments' inputs in host memory
        half = half_weights_bf16 if spec.bf16_native else half_weights_fp16
        # and the host's share of it kept smaller by 8-bit AdamW state there (2 bytes a parameter instead of 8), where the host bounds the model
        tf = _named(lambda m: offload_activations(ck(half(m))), f"{half.__name__} + checkpointing + offload_activations")
        with_ = [('adamw-offload-grads', 'fp32', tf), ('adamw8bit-offload-grads', 'fp32', tf)]
        if spec.bf16_native:  # bf16 weights rounded stochastically on the host: no fp32 masters (2 bytes a parameter there instead of 4)
            with_.append(('adamw8bit-bf16sr-offload-grads', 'bf16', _named(lambda m: offload_activations(ck(bf16_weights(m))), 'bf16_weights + checkpointing + offload_activations')))
        # and the weights off the card too: streamed from the host block by block, checkpointed; gradients and 8-bit state on the host
        with_.append(('adamw8bit-bf16sr', 'bf16', _named(lambda m: stream_weights_checkpointed(bf16_weights(m)), 'bf16_weights + stream_weights + checkpointing'))
                     if spec.bf16_native else ('adamw8bit', 'fp32', _named(stream_weights_checkpointed, 'stream_weights + checkpointing')))
        old = (stored or {}).get(spec.name)
        wo = dict(old, reused=True) if old else largest(card, without, seq, batch, 6 if spec.bf16_native else 10, proxy)
        # the host is the user's, not this machine: each stated RAM size gets its own row, planned against `host_budget(ram)`
        by_host = {f"{h:g} GiB": dict(host_ram=int(h * 2**30), **largest(card, with_, seq, batch, 2.5, host=host_budget(int(h * 2**30)))) for h in hosts_gib}
        out.append(dict(gpu=spec.name, without=wo, with_host=by_host))
        print(out[-1], flush=True)
    return out

def _named(f, name):
    f.__name__ = name
    return f

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--repeats', type=int, default=5); ap.add_argument('--steps', type=int, default=5)
    ap.add_argument('--cards', nargs='*', default=['gtx 1050 ti', 'gtx 1650', 'rtx 3060'])
    ap.add_argument('--hosts', nargs='*', type=float, default=[32, 64, 128], help="the host RAM sizes (GiB) to plan the offloads for")
    ap.add_argument('--reuse-without', action='store_true', help="take each card's plan without the levers from the stored result (it holds nothing on the host, so the host does not change it)")
    ap.add_argument('--part', choices=['all', 'cpu', 'cards'], default='all', help="measure on this CPU, plan the cards, or both; the other part of this machine's last result is kept")
    a = ap.parse_args()
    torch.set_num_threads(1)
    mach, t0, load0 = machine(), time.time(), os.getloadavg()
    who = '-'.join(_slug(x) for x in (mach['cpu_vendor'] or '', mach['isa'], mach['cpu'].replace(mach['cpu_vendor'] or '', '')) if x)
    path = ROOT / 'bench' / 'results' / 'offload' / f"{who}.json"
    stamp = lambda: dict(date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), commit=_git('rev-parse', '--short=10', 'HEAD') or None, torch=torch.__version__,
                         load_average=[round(load0[0], 1), round(os.getloadavg()[0], 1)], seconds=round(time.time() - t0))
    part = {}
    if a.part in ('all', 'cpu'):
        part['cpu_steps'] = cpu_steps(a.repeats, a.steps); print(part['cpu_steps'], flush=True)
        part['host_terms'] = host_terms(); print(part['host_terms'], flush=True)
        part['cpu'] = dict(repeats=a.repeats, steps=a.steps, **stamp())
    if a.part in ('all', 'cards'):
        old = json.loads(path.read_text()) if path.exists() else {}
        stored = {g['gpu']: g['without'] for g in old.get('largest', [])} if a.reuse_without else None
        part['largest'] = largest_models(a.cards, a.hosts, stored=stored)
        part['cards'] = dict(seq=256, batch=8, blocks=4, hosts_gib=a.hosts, **stamp())
    res = json.loads(path.read_text()) if path.exists() else {}  # read just before writing: the other part may have finished meanwhile
    if 'largest' in part and res.get('largest'):  # one card's process at a time may write: keep the other cards' rows
        mine = {g['gpu'] for g in part['largest']}
        part['largest'] = [g for g in res['largest'] if g['gpu'] not in mine] + part['largest']
    res.update(bench='offload', machine=mach, python=platform.python_version(), **part, **stamp())
    save_result(path, res)
