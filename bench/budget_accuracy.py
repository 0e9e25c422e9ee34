"""How close is `plan_memory` to a real step? Predicted peak (on the 'cpu' target) vs. the measured peak of a fresh process.

    python bench/budget_accuracy.py                 # accuracy table: 3 models x 3 batch sizes
    python bench/budget_accuracy.py --set families  # any set of bench/sets/ (default, families, variants, ... eleventh); rows stored in bench/results/budget_accuracy/
    python bench/budget_accuracy.py --families      # the same on 14 model families the package does not ship, 2 batch sizes each
                                                    # (--models lstm mha to run a part; --calibrate adds the calibrated plan)
    python bench/budget_accuracy.py --unseen        # the same on 5 models none of the planner was built or checked on
    python bench/budget_accuracy.py --variants      # the same on 14 variants of the families (one thing changed each), one batch size each
    python bench/budget_accuracy.py --fifth         # the same on a fifth round of 9 models brought last, and packed sequences at full length (--brought, --fourth: the earlier rounds)
    python bench/budget_accuracy.py --eighth        # the same on ten of autograd's shapes (a Function saving on ctx, in-place ops on views, orthogonal weights, cumprod...)
    python bench/budget_accuracy.py --tenth         # the same on torchvision's segmentation (dict outputs, auxiliary heads), video, Swin and EfficientNetV2 models
    python bench/budget_accuracy.py --ninth         # the same on users' losses and tricks: an OCR net's CTC loss, a PINN's second derivatives, a WGAN-GP critic
    python bench/budget_accuracy.py --seventh       # the same on a seventh round of 13 models (images and per-pixel labels out, LMs, graphs, point clouds...; --sixth: the one before)
    python bench/budget_accuracy.py --optimizers    # 4 families trained by 15 optimizers users bring (fused, foreach, Adagrad, Adafactor, ASGD...)
    python bench/budget_accuracy.py --budgets       # max_batch_size at 0.5/1/2 GiB budgets, checked by measurement
                                                    # (--models cnn transformer --gib 0.5 1 to run a part)
    python bench/budget_accuracy.py --real-budgets  # the same at the unscaled 2/4/8 GiB, for the CNN and the transformer
    python bench/budget_accuracy.py --kernels       # each kernel family's scratch (convolutions, LSTM) measured, next to the planner's model
    python bench/budget_accuracy.py --budgets --families --gib 0.5 1   # max_batch_size on every family, checked by measurement
    python bench/budget_accuracy.py --gemm          # the CPU kernel workspace a tensor trace cannot see, next to the planner's model
    python bench/budget_accuracy.py --repeat mlp 4200 3   # how well one measurement repeats
    python bench/budget_accuracy.py --heap gru 32   # the trace's allocations through glibc and through the planner's GlibcHeap; what warm-up holes hide
    python bench/budget_accuracy.py --histories gru 32 12  # a few small blocks left in the heap before the steps: the measurement and the plan's replay, per history
    python bench/budget_accuracy.py --calibration-lines mobilenet_v2_32px 32   # each convolution at the full batch next to calibration's lines
    python bench/budget_accuracy.py --phases gru 32 # each phase's measured high-water mark next to the plan's live bytes and their GlibcHeap replay
    python bench/budget_accuracy.py --malloc-trace gru 32   # the same, with every C library call of the real steps replayed through GlibcHeap (needs cc)
    python bench/budget_accuracy.py --families --glibc-defaults   # measured and planned with glibc's own settings, as a user's process runs
    python bench/budget_accuracy.py --families --glibc heap       # ... with the threshold fixed at glibc's 32 MiB limit and no trimming
    python bench/budget_accuracy.py --families --glibc fixed-late # ... with glibc's own at start, a messy heap, then fix_glibc_thresholds() in the process
    python bench/budget_accuracy.py --families --glibc set-late   # ... the same without filling the heap's free chunks: why fix_glibc_thresholds fills them
    python bench/budget_accuracy.py --speed mobilenet_v2 16 3      # one step's time under each of those glibc settings, paired fresh processes
    (--threads 2 measures with two threads instead of one; --full-warmup warms up at the full batch, so what the kernels keep
     is already in the baseline and the measured steps hold tensors only; --warmup-holes leaves the warm-up's freed heap in place,
     the protocol before the autograd graph was planned)

CPU measurement: each case runs in a fresh `python` process with glibc told to serve every allocation above 64 KiB with its own
mmap (MALLOC_MMAP_THRESHOLD_ fixed, which also stops glibc raising the threshold as blocks are freed) and one arena
(MALLOC_ARENA_MAX=1), so a freed tensor's pages go back to the OS at once and the resident set tracks live tensors. The process
warms up the kernels on a small batch (loading their code), hands MKL's cached matmul buffers back (mkl_free_buffers, so the
measured steps allocate their workspace as a real run's first full-size step does) and glibc's freed heap (malloc_trim, so the
measured steps' autograd graph and small tensors grow the heap as a real first step's do, instead of filling the warm-up's holes),
then resets the kernel's RSS high-water mark
(/proc/self/clear_refs) and runs the same two training steps the planner traces. Measured peak = peak RSS - RSS before the
steps + bytes of the tensors already alive then (weights, buffers, batch), which the planner counts too.
"""
import argparse, functools, itertools, json, math, os, platform, re, shutil, subprocess, sys, time
from unittest import mock
from pathlib import Path
import torch, torch.utils._python_dispatch
from torch import nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's netlite_nb, not whichever one is installed
ENV = dict(MALLOC_MMAP_THRESHOLD_='65536', MALLOC_ARENA_MAX='1', MALLOC_TRIM_THRESHOLD_='0', OMP_NUM_THREADS='1')
GLIBC = {  # glibc settings a process can run with: the bench's; glibc's own (a user's process); the threshold fixed at glibc's 32 MiB limit, never trimmed
    'bench': {k: v for k, v in ENV.items() if k.startswith('MALLOC_')}, 'defaults': {},
    'heap': dict(MALLOC_MMAP_THRESHOLD_=str(32 * 2**20), MALLOC_TRIM_THRESHOLD_=str(2**40), MALLOC_ARENA_MAX='1'),
    'fixed-late': dict(BENCH_FIX_LATE='1'),  # glibc's own at start, a messy heap made under them (`messy_heap`), then `fix_glibc_thresholds()`
    'set-late': dict(BENCH_FIX_LATE='thresholds')}  # ... then only the thresholds set (mallopt) and the free heap handed back: the heap's free chunks stay
HOLES = False  # --warmup-holes: measure as before the autograd graph was planned (the warm-up's freed heap left in place)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/sets, when imported from elsewhere (tests, budget_cuda.py)
from sets import SETS, ALL, TARGETS, LOSSES, TOKENS, MODULES  # the models, one file a round: bench/sets/NAME.py, chosen by --set NAME
MODELS, FAMILIES, VARIANTS, UNSEEN, BROUGHT, FOURTH, FIFTH, SIXTH, SEVENTH, EIGHTH, NINTH, TENTH, ELEVENTH, TWELFTH = SETS.values()  # the rounds' old names

def make(name, bs, seed=0):
    f, shape, _ = ALL[name]
    torch.manual_seed(seed)
    if name in TOKENS:
        ids, labels = TOKENS[name]
        return f(), (torch.randint(0, ids, (bs, *shape)), torch.randint(0, labels, (bs, *shape) if labels == ids else (bs,)))
    x = torch.randn(bs, *shape)
    return f(), (x, TARGETS[name](bs) if name in TARGETS else torch.randint(0, 10, (bs,)))

def _loss(name):
    "The loss the measured steps and the plans use: the model's own (LOSSES) or the planner's default (cross-entropy, MSE for images)."
    from netlite_nb.memory.trace import default_loss
    return LOSSES.get(name, default_loss)

def process_rss()->int:
    with open('/proc/self/statm') as f: return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')

def _hwm()->int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM'): return int(line.split()[1]) * 1024

def _precision()->str: return os.environ.get('BENCH_PRECISION', 'fp32')  # --precision: the measured steps' and the plans'

OPTIMIZERS = {  # --optimizers: what users pass, each a callable params -> optimizer that the measured steps and the plans both get
    'adamw': lambda p: torch.optim.AdamW(p, lr=1e-3),
    'sgd_nesterov': lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4),
    'sgd_foreach': lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, foreach=True),
    'adam_amsgrad': lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True),
    'adam_foreach': lambda p: torch.optim.Adam(p, lr=1e-3, foreach=True),
    'adamw_fused': lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
    'rmsprop_centered': lambda p: torch.optim.RMSprop(p, lr=1e-3, centered=True, momentum=0.9),
    'adagrad': lambda p: torch.optim.Adagrad(p, lr=1e-2),  # its state exists from the constructor on
    'adamax': lambda p: torch.optim.Adamax(p, lr=1e-3),
    'nadam': lambda p: torch.optim.NAdam(p, lr=1e-3),
    'radam': lambda p: torch.optim.RAdam(p, lr=1e-3, decoupled_weight_decay=True, weight_decay=0.01),
    'adadelta': lambda p: torch.optim.Adadelta(p),
    'adafactor': lambda p: torch.optim.Adafactor(p, lr=1e-2),  # reads step counts and norms with .item()
    'asgd': lambda p: torch.optim.ASGD(p, lr=1e-2),  # reads eta and mu with .item()
    'rprop': lambda p: torch.optim.Rprop(p)}

def _optimizer():
    "The measured steps' optimizer (--optimizers sets BENCH_OPTIMIZER in the measuring children): AdamW otherwise."
    return OPTIMIZERS[os.environ.get('BENCH_OPTIMIZER', 'adamw')]

def _autocast():
    "The measured steps' autocast: CPU bf16 mixed precision with --precision bf16, nothing otherwise."
    return torch.autocast('cpu', dtype=torch.bfloat16, enabled=_precision() == 'bf16')

class _NothingMode(torch.utils._python_dispatch.TorchDispatchMode):
    "A dispatch mode that does nothing: under it autograd adds second gradients out of place, as it did under the planner's tracker (`BENCH_DISPATCH_MODE=1`)."
    def __torch_dispatch__(self, func, types, args=(), kwargs=None): return func(*args, **(kwargs or {}))

def _steps(model, opt, x, y, n=2, loss_fn=F.cross_entropy):
    import contextlib
    with _NothingMode() if os.environ.get('BENCH_DISPATCH_MODE') else contextlib.nullcontext(): _plain_steps(model, opt, x, y, n, loss_fn)

def _plain_steps(model, opt, x, y, n, loss_fn):
    for _ in range(n):
        with _autocast():
            out = model(x)  # held through backward, as a loop that also computes accuracy does (and as the planner traces)
            loss = loss_fn(out, y)
        loss.backward()
        del out, loss
        opt.step()
        opt.zero_grad(set_to_none=True)

from netlite_nb.memory.cpu import free_blas_buffers  # hands MKL's cached matmul buffers back (mkl_free_buffers)

_KEPT = []  # the small tensors `messy_heap` keeps: they pin its holes in place, as a notebook's losses and results do

def _fix_late():
    "In a `--glibc fixed-late` child: a notebook's process, its heap made under glibc's own settings, then the thresholds fixed in it."
    how = os.environ.get('BENCH_FIX_LATE')
    if not how: return
    from netlite_nb.memory import heap
    _KEPT.extend(heap.messy_heap())
    if how == 'thresholds': heap.plug_heap = lambda threshold: 0  # what fix_glibc_thresholds does, less filling the free chunks
    heap.fix_glibc_thresholds()

def measure(name, bs, full_warmup=False, holes=False, history=0)->int:
    """Run in a fresh process: the measured peak bytes of two AdamW training steps (full_warmup: what kernels keep is already there;
    holes: the warm-up's freed heap is left in place, where the measured steps' small objects reuse it instead of growing the heap;
    history: the planner's `heap_history(seed)`, up to 40 small blocks left alive in the heap just before the steps)."""
    import ctypes, gc
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', '1')))
    _fix_late()
    model, (x, y) = make(name, bs)
    warm = _optimizer()(model.parameters())
    w = slice(None) if full_warmup else slice(2)
    _steps(model, warm, x[w], y[w], 1, _loss(name))  # load kernels, fault in code pages
    del warm
    for p in model.parameters(): p.grad = None
    torch.manual_seed(1)
    opt = _optimizer()(model.parameters())
    gc.collect()
    if not full_warmup: free_blas_buffers()  # the warm-up's small GEMMs left buffers; a real run's first step is full-size
    if not holes: ctypes.CDLL(None).malloc_trim(0)  # a real first step finds no freed heap of an earlier step to put its graph in
    if history:
        from netlite_nb.memory.heap import heap_history, libc_handle
        heap_history(libc_handle().malloc, history)  # never freed: they stay in the heap through the steps
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]  # Adagrad's, made by its constructor
    alive = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers(), x, y, *state])
    base, code = process_rss(), _file_backed()
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')  # reset the RSS high-water mark
    _steps(model, opt, x, y, 2, _loss(name))
    _CODE_PAGES.append(_file_backed() - code)  # what of the growth is code the steps faulted in (`--code-pages`)
    return _hwm() - base + alive

_CODE_PAGES = []

def _file_backed()->int:
    "Resident bytes of this process that are file-backed (code and other mapped files): what the kernel can drop and read again."
    d = {}
    with open('/proc/self/smaps_rollup') as f:
        for line in f:
            k, *v = line.split()
            if k in ('Rss:', 'Anonymous:'): d[k] = int(v[0]) * 1024
    return d['Rss:'] - d['Anonymous:']

def code_pages_child(name, bs)->list:
    "Run in a fresh process: `measure`'s peak, and how much of the measured steps' resident growth is file-backed pages they faulted in."
    return [measure(name, bs), _CODE_PAGES[-1]]

def code_pages_report(cases):
    "For each case: the measured peak and the file-backed pages (the math libraries' code) the measured steps faulted in."
    for name, bs in cases:
        m, f = run_child('--code-pages-child', [name, bs])
        print(f"{name} at batch {bs}: measured {m/2**20:.2f} MiB, of which {f/2**20:.2f} MiB file-backed pages faulted in during the steps", flush=True)

def measured(name, bs, full_warmup=False, holes=None, history=0)->int:
    holes = HOLES if holes is None else holes
    out = subprocess.run([sys.executable, __file__, '--measure', name, str(bs), *(['full'] if full_warmup else []), *(['holes'] if holes else []),
                          *([f'history={history}'] if history else [])],
                         env={**os.environ, **ENV, 'PYTHONPATH': str(ROOT)}, capture_output=True, text=True, check=True)
    *_, code, peak = out.stdout.split()
    CODE_PAGES[(name, bs)] = int(code)
    return int(peak)

CODE_PAGES = {}  # (model, batch) -> file-backed bytes (code) its last measured steps faulted in: in the peak, in no plan by design

def _as_measured():
    "Plan for the processes that `measured` runs: glibc's settings are theirs (the planner's model of glibc reads them from the environment)."
    return mock.patch.dict(os.environ, {k: v for k, v in ENV.items() if k.startswith('MALLOC_')})

def predicted(name, bs, device_or_gpu='cpu', **kw)->int:
    "The planner's peak; on the 'cpu' target it includes the CPU kernel workspace, with device_or_gpu=None it is tensors only."
    from netlite_nb.budget import plan_memory
    model, batch = make(name, bs)
    opt = OPTIMIZERS[os.environ['BENCH_OPTIMIZER']] if 'BENCH_OPTIMIZER' in os.environ else 'adamw'  # the same AdamW by name
    with _as_measured(): return plan_memory(model, batch, LOSSES.get(name), optimizer=opt, precision=_precision(), device_or_gpu=device_or_gpu, **kw).peak

RESULTS = ROOT / 'bench' / 'results' / 'budget_accuracy'  # one JSON file per (set, machine, options); the book renders its tables from them

def machine()->dict:
    "What a result was measured on: the CPU (model, vendor, ISA: the kernels oneDNN and MKL pick follow it), and the GPU and driver where present."
    try: info = Path('/proc/cpuinfo').read_text()
    except OSError: info = ''
    field = lambda k: next((l.split(':', 1)[1].strip() for l in info.splitlines() if l.split(':')[0].strip() == k), '')
    flags = set(field('flags').split())
    cap = torch.backends.cpu.get_cpu_capability()  # the vector ISA PyTorch's kernels run on (AMX shows in isa_flags)
    isa = {'AVX512': 'AVX-512', 'DEFAULT': platform.machine()}.get(cap, cap)
    gpu = driver = None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
        smi = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'], capture_output=True, text=True) if shutil.which('nvidia-smi') else None
        driver = smi.stdout.split('\n')[0].strip() if smi and smi.returncode == 0 else None
    return dict(cpu=field('model name') or platform.processor() or platform.machine(),
                cpu_vendor={'GenuineIntel': 'Intel', 'AuthenticAMD': 'AMD'}.get(field('vendor_id'), field('vendor_id') or None), isa=isa,
                isa_flags=sorted(f for f in flags if f in ('avx2', 'avx512f', 'avx512_bf16', 'avx512_vnni', 'avx512_fp16', 'amx_tile', 'amx_bf16', 'amx_int8')),
                torch_cpu_capability=cap, cores=os.cpu_count(), gpu=gpu, gpu_driver=driver)

def _git(*args)->str:
    out = subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ''

def _slug(s:str)->str: return re.sub(r'[^a-z0-9]+', '-', re.sub(r'\((r|tm)\)|\bcpu\b|@.*', '', s.lower())).strip('-')

def result_path(set_name:str, mach:dict, options:dict, out:Path=RESULTS)->Path:
    "The file of one (set, machine, options): e.g. families.intel-avx2-xeon-e5-2680-v4.default.json."
    who = '-'.join(_slug(x) for x in (mach['cpu_vendor'] or '', mach['isa'], mach['cpu'].replace(mach['cpu_vendor'] or '', ''), mach['gpu'] or '') if x)
    changed = [k.replace('_', '-') + ('' if v is True else f"-{'-'.join(map(str, v)) if isinstance(v, list) else v}")
               for k, v in options.items() if v not in (False, None) and v != OPTIONS.get(k)]
    return out / f"{set_name}.{who}.{'_'.join(map(_slug, changed)) or 'default'}.json"

OPTIONS = dict(threads=1, precision='fp32', glibc='bench', full_warmup=False, warmup_holes=False, calibrate=False, models=None, budgets=None)  # the defaults

def save_result(path:Path, result:dict):
    "Write `result` as JSON to `path` atomically (a temporary file beside it, then os.replace): a reader never sees half a file."
    import tempfile
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix='.tmp')
    try:
        with os.fdopen(fd, 'w') as f: json.dump(result, f, indent=1); f.write('\n')
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp); raise

def new_result(set_name:str, options:dict)->dict:
    "A result's tags: the set, the options it ran with, the machine, torch, the date and the commit (dirty: tracked files differed from it)."
    return dict(bench='budget_accuracy', set=set_name, measured_on='cpu', options={**OPTIONS, **options}, machine=machine(),
                torch=torch.__version__, python=platform.python_version(), date=time.strftime('%Y-%m-%dT%H:%M:%S%z'),
                commit=_git('rev-parse', '--short=10', 'HEAD') or None, dirty=bool(_git('status', '--porcelain', '--untracked-files=no')),
                source='bench/budget_accuracy.py', complete=False, seconds=0.0, rows=[])

def accuracy_table(full_warmup=False, models=MODELS, calibrate=False, set_name=None, options=None, out=RESULTS):
    """Predicted vs measured peak for each model at its batch sizes; then the plan without the CPU kernel workspace (tensors only),
    and with calibrate: the plan calibrated on this machine, from an empty cache filled first by `calibrate_all`.
    With set_name, the rows are also stored (`result_path`), rewritten after each row: complete is true once every case ran."""
    import tempfile
    from netlite_nb.memory import cpu
    t0 = time.time()
    if set_name:
        result = new_result(set_name, {**(options or {}), 'full_warmup': full_warmup, 'calibrate': calibrate})
        path = result_path(set_name, result['machine'], result['options'], out)
    if calibrate:  # an empty cache of our own: what a first calibrated plan costs on this machine
        torch.set_num_threads(int(ENV['OMP_NUM_THREADS']))  # calibration measures at the asking process's thread count: the measured ones'
        os.environ['XDG_CACHE_HOME'] = tempfile.mkdtemp()
        cpu.calibration_cache.cache_clear()
        calibrate_all(models)
    w = max([13, *(len(k) + 1 for k in models)])  # the name column
    print(f"{'model':<{w}}{'batch':>6}{'predicted':>12}{'measured':>12}{'error':>8}  {'tensors only: error':>20}" + ('  calibrated: error' if calibrate else ''))
    errs, cerrs, secs = [], [], 0.0
    for name, (_, _, sizes) in models.items():
        for bs in sizes:
            p, t, m = predicted(name, bs), predicted(name, bs, None), measured(name, bs, full_warmup)
            errs.append((p - m) / m)
            row = dict(model=name, batch=bs, measured=m, planned=p, error_pct=round(100 * errs[-1], 2), tensors_only=t, code_pages=CODE_PAGES.get((name, bs)))
            line = f"{name:<{w}}{bs:>6}{p/2**20:>10.1f}Mi{m/2**20:>10.1f}Mi{100*errs[-1]:>+7.1f}%  {(t - m)/2**20:>+10.1f} MiB{100*(t - m)/m:>+7.1f}%"
            if calibrate:
                c = predicted(name, bs, calibrate=True)  # every shape is in the cache already (`calibrate_all`)
                cerrs.append((c - m) / m)
                row.update(calibrated=c, calibrated_error_pct=round(100 * cerrs[-1], 2))
                line += f"  {c/2**20:>9.1f}Mi{100*cerrs[-1]:>+7.1f}%"
            print(line, flush=True)
            if set_name:
                result['rows'].append(row)
                result['seconds'] = round(time.time() - t0, 1)
                save_result(path, result)
    print(f"max |error| {100*max(abs(e) for e in errs):.1f}%" + (f"; calibrated {100*max(abs(e) for e in cerrs):.1f}%" if calibrate else ''))
    if set_name:
        result.update(complete=True, seconds=round(time.time() - t0, 1))
        save_result(path, result)
        print(f"stored: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")

def optimizers_table(names, cases):
    "Predicted vs measured peak of each case, trained by each optimizer of `names` (measured and planned alike, `OPTIMIZERS`)."
    print(f"{'optimizer':<18}{'model':<10}{'batch':>6}{'predicted':>12}{'measured':>12}{'error':>8}")
    errs = []
    for o in names:
        os.environ['BENCH_OPTIMIZER'] = o  # the plans read it, and the measuring children inherit it
        for name, bs in cases:
            p, m = predicted(name, bs), measured(name, bs)
            errs.append((p - m) / m)
            print(f"{o:<18}{name:<10}{bs:>6}{p/2**20:>10.1f}Mi{m/2**20:>10.1f}Mi{100*errs[-1]:>+7.1f}%", flush=True)
    del os.environ['BENCH_OPTIMIZER']
    print(f"error {100*min(errs):+.1f} ... {100*max(errs):+.1f}%")

def calibration_lines(name, bs):
    """Each convolution of one case, measured and read off the lines calibration draws: at the batch, the line through a quarter and a
    half of it (what calibration did before) next to the measurement; at twice the batch, the furthest a measurement now serves,
    the line through half and all of it (what it does) next to the measurement. Rows where either line is 256 KiB off."""
    from netlite_nb.memory.trace import trace_step
    from netlite_nb.memory.cpu import measure_conv_scratch
    model, batch = make(name, bs)
    specs = []
    trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu', measured={}, missing=specs, steps=1)
    convs = list({json.dumps(s): s for s in specs if s[0] != 'matmul'}.values())
    q, h = max(1, bs // 4), max(2, bs // 2)
    got = measure_conv_scratch(convs, (q, h, bs, 2 * bs))
    at = lambda x, b1, m1, b2, m2: m2 + (m2 - m1) / (b2 - b1) * (x - b2)
    mi = lambda n: f"{n/2**20:7.2f}"
    print(f"{name}: convolution scratch in MiB. At batch {bs}: measured | line through {q} and {h}.   At {2 * bs}: measured | line through {h} and {bs}")
    ratios = {'old': [], 'new': []}
    for s, (m1, m2, m3, m4) in zip(convs, got):
        old, new = at(bs, q, m1, h, m2), at(2 * bs, h, m2, bs, m3)
        if m3 > 2**18: ratios['old'].append(old / m3)
        if m4 > 2**18: ratios['new'].append(new / m4)
        if max(abs(m3 - old), abs(m4 - new)) > 2**18:
            print(f"  {json.dumps(s[:7])[:76]:<78}{mi(m3)} |{mi(old)}      {mi(m4)} |{mi(new)}")
    print(f"  {len(convs)} convolutions; line / measurement where the measurement is above 256 KiB: "
          f"before {min(ratios['old']):.2f}-{max(ratios['old']):.2f}, now {min(ratios['new']):.2f}-{max(ratios['new']):.2f}")

def calibrate_all(models):
    """Measure every kernel shape the calibrated plans of `models` need, in one child process (one torch import, not one a plan):
    trace one step of each case to collect the shapes the cache lacks, then `calibrate_kernels` on all of them. Prints what it cost."""
    from netlite_nb.memory.trace import trace_step
    from netlite_nb.memory.cpu import calibrate_kernels, calibration_cache
    t0, specs = time.time(), []
    for name, (_, _, sizes) in models.items():
        for bs in sizes:
            model, batch = make(name, bs)
            trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu', measured=calibration_cache(), missing=specs, steps=1)  # step 2 runs the same shapes
    t1 = time.time()
    table = calibrate_kernels(specs)
    print(f"calibration from an empty cache: {len(table)} kernel shapes measured in one child process in {time.time() - t1:.0f} s, "
          f"after {t1 - t0:.0f} s of tracing to find them ({len(specs)} kernel calls)", flush=True)

def kernels_child(specs:list, threads:int=1)->list:
    "Run in a fresh process: the resident bytes each kernel adds beyond its outputs, in order (kept buffers show up once)."
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    # load the code first: a small matmul and a small convolution forward and backward, then hand MKL's buffers back
    torch.randn(8, 8) @ torch.randn(8, 8)
    for k, g in ((3, 1), (1, 1), (3, 4)):  # plain, pointwise and depthwise convolutions have kernels of their own
        F.conv2d(torch.randn(2, 4, 8, 8, requires_grad=True), torch.randn(4, 4 // g, k, k, requires_grad=True), padding=k // 2, groups=g).sum().backward()
    free_blas_buffers()
    out = []
    for kind, *shape in specs:
        if kind == 'mm':
            M, K, N = shape
            a, b = torch.randn(M, K), torch.randn(K, N)
            r0 = process_rss(); c = a @ b
            out.append(process_rss() - r0 - c.nbytes)
            del a, b, c
        else:  # 'conv': batch, channels, size, out channels, kernel size, groups; forward, then backward
            B, C, H, O, k, g = shape
            x, w = torch.randn(B, C, H, H, requires_grad=True), torch.randn(O, C // g, k, k, requires_grad=True)
            r0 = process_rss(); y = F.conv2d(x, w, padding=k // 2, groups=g)
            out.append(process_rss() - r0 - y.nbytes)
            # a scalar's backward, as in training (backward(gradient=...) imports modules the first time: megabytes of Python objects)
            r0 = process_rss(); y.sum().backward()
            out.append(process_rss() - r0 - x.grad.nbytes - w.grad.nbytes)
            del x, w, y
    return out

def run_kernels(specs, threads=1)->list:
    out = subprocess.run([sys.executable, __file__, '--kernels-child', json.dumps([specs, threads])],
                         env={**os.environ, **ENV, 'OMP_NUM_THREADS': str(threads), 'PYTHONPATH': str(ROOT)}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.split('\n')[-2])

def gemm_report():
    "Measure what the CPU workspace model of `plan_memory` rests on, each number next to the model's."
    from netlite_nb.memory.cpu import cpu_workspace_bytes, MKL_BLOCKING
    mi = lambda n: f"{n/2**20:6.2f}"
    mm = lambda M, K, N: ('matmul', 1, M, K, N, 'torch.float32')
    from netlite_nb.memory.cpu import run_in_child, mkl_isa
    isa = torch.backends.cpu.get_cpu_capability()
    print(f"1. One fp32 matmul (M x K) @ (K x N), MKL's buffers handed back before each: resident MiB beyond its output "
          f"(this CPU: {isa}; model: the {mkl_isa()} row)")
    print(f"{'M':>6}{'K':>6}{'N':>7}  measured  model")
    shapes = [(256, 4096, 4096), (384, 4096, 4096), (392, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096),
              (1, 4096, 4096), (2, 4096, 4096), (4, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096), (300, 4096, 4096),
              (1024, 64, 4096), (1024, 128, 4096), (1024, 192, 4096), (1024, 200, 4096), (1024, 256, 4096), (1024, 384, 4096),
              (1024, 400, 4096), (1024, 512, 4096), (1024, 640, 4096), (1024, 784, 4096),
              (1024, 4096, 10), (1024, 4096, 32), (1024, 4096, 64), (1024, 4096, 128), (1024, 4096, 176), (1024, 4096, 192), (1024, 4096, 1024),
              (1024, 4096, 6144), (1024, 4096, 6400), (1024, 4096, 6656), (1024, 4096, 8192), (1024, 4096, 16384),
              (32, 128, 384), (384, 2048, 64), (2048, 64, 384), (2048, 256, 2000), (128, 128, 128)]
    got = run_in_child('_measure_matmuls', [['matmul', 1, M, K, N, 'float32'] for M, K, N in shapes])
    for (M, K, N), g in zip(shapes, got):
        print(f"{M:>6}{K:>6}{N:>7}  {mi(g)}    {mi(cpu_workspace_bytes([mm(M, K, N)]))}", flush=True)
    big, small = [1024, 4096, 4096], [1024, 4096, 1024]
    again = run_kernels([['mm', *big], ['mm', *big]])
    print(f"2. Kept, not transient: the same 1024x4096 @ 4096x4096 matmul twice in one process adds {mi(again[0])} then {mi(again[1])} MiB")
    for seq in ([big, small], [small, big]):
        got = run_kernels([['mm', *s] for s in seq])
        model = [cpu_workspace_bytes([mm(*s) for s in seq[:i+1]]) - cpu_workspace_bytes([mm(*s) for s in seq[:i]]) for i in range(2)]
        print(f"3. {' then '.join('x'.join(map(str, s)) for s in seq)}: adds {mi(got[0])} + {mi(got[1])} MiB (model {mi(model[0])} + {mi(model[1])}):"
              " a smaller matmul reuses the buffer, a larger one gets a new one and the old one stays", flush=True)
    convs = [[16, 32, 64, 32, 3, 32], [16, 32, 64, 64, 1, 1], [16, 64, 32, 64, 3, 64], [16, 64, 32, 128, 1, 1],
             [16, 128, 16, 128, 3, 128], [16, 128, 16, 256, 1, 1], [8, 3, 64, 32, 3, 1], [32, 64, 32, 128, 1, 1]]
    skinny = [[256, 4096, 10], [512, 4096, 10], [10, 1024, 4096], [10, 512, 1024], [128, 256, 256], [256, 784, 1024], [64, 1024, 1024], [96, 512, 2048]]
    got = run_kernels([['conv', *c] for c in convs] + [['mm', *s] for s in skinny])
    nc, ns = 2 * len(convs), len(skinny)
    g = MKL_BLOCKING[mkl_isa()]
    print(f"4. Kernel state per shape: {len(convs)} convolutions (forward and backward: {nc} kernels) add {mi(sum(got[:nc]))} MiB: "
          f"{sum(got[:nc])/nc/2**10:.0f} KiB per kernel (model {g['state']/2**10:.0f} KiB); {ns} smaller matmuls add {mi(sum(got[nc:]))} MiB "
          f"(model {mi(cpu_workspace_bytes([mm(*s) for s in skinny]))}); all together {sum(got)/(nc+ns)/2**10:.0f} KiB per kernel")
    one, two = run_kernels([['mm', *big]], 1)[0], run_kernels([['mm', *big]], 2)[0]
    print(f"5. Threads (not modelled): the 1024x4096 @ 4096x4096 matmul adds {mi(one)} MiB with one thread, {mi(two)} with two")
    from netlite_nb.memory.cpu import ONEDNN_MATMUL_STATE, onednn_lowp
    how = onednn_lowp('torch.bfloat16')
    if how is None: print("6. bf16 matmuls do not run on oneDNN here (MKL's rule above)"); return
    specs = [['onednn_matmul', 1, M, K, N, 'bfloat16', lay] for M, K, N in [(2048, 256, 768), (2048, 1024, 256), (256, 2048, 1024), (16, 256, 10), (8192, 512, 512), (128, 4096, 1000)]
             for lay in ('NT+', 'NN', 'TN')] + [['onednn_matmul', 64, 128, 64, 128, 'bfloat16', 'NN'], ['onednn_matmul', 64, 128, 128, 64, 'bfloat16', 'NT']]
    if onednn_lowp('torch.float16'):  # fp16 on oneDNN too (AMX-FP16, AVX512_FP16): the same rule
        specs += [['onednn_matmul', 1, 2048, 256, 768, 'float16', 'NT+'], ['onednn_matmul', 1, 768, 2048, 256, 'float16', 'TN']]
    got = run_in_child('_measure_onednn', specs)
    print(f"6. bf16 matmuls run on oneDNN ({how}): heap KiB each new primitive keeps (shape, layout; + a bias), model {ONEDNN_MATMUL_STATE[how] // 1024}:")
    print('  ' + '; '.join(f"{'x'.join(map(str, s[2:5]))}{'' if s[1] == 1 else f' (batch {s[1]})'}{' fp16' if s[5] == 'float16' else ''} {s[6]}: {g // 1024}" for s, g in zip(specs, got)))
    print(f"  median {sorted(got)[len(got) // 2] // 1024} KiB, {min(got) // 1024}-{max(got) // 1024}")

def _conv_rows(rows):
    "Each (label, forward args, output, backward args) measured in fresh processes, one per batch size, printed next to the model."
    from netlite_nb.memory.cpu import conv_key, cpu_conv_scratch, measure_conv_scratch
    mi = lambda n: f"{n/2**20:7.2f}"
    specs, model = [], []
    for _, fa, y, ba in rows:
        for f, a, o in ((torch.ops.aten.convolution.default, fa, y), (torch.ops.aten.convolution_backward.default, ba, None)):
            specs.append(conv_key(f, a)[1]); model.append(cpu_conv_scratch(f, a, o))
    got = {}
    for B in {sp[-1] for sp in specs}:
        mine = [i for i, sp in enumerate(specs) if sp[-1] == B]
        got.update(zip(mine, (r[0] for r in measure_conv_scratch([specs[i] for i in mine], (B,)))))
    for i, (label, *_) in enumerate(rows):
        print(f"{label:<52}{mi(got[2*i])} |{mi(got[2*i+1])}  {mi(model[2*i])} |{mi(model[2*i+1])}", flush=True)

def kernels_report():
    "Each kernel family's scratch measured in fresh processes, next to the planner's model; shapes the model was not read off included."
    from netlite_nb.memory.cpu import run_in_child, lstm_brgemm, lstm_workspace, onednn_lowp
    mi = lambda n: f"{n/2**20:7.2f}"
    print("1. Convolutions (oneDNN blocked copies; im2col for PyTorch's fallback): scratch MiB beyond the outputs, forward | backward")
    print(f"{'batch x in x size -> out, kernel, stride, groups':<52}{'measured':>18}{'model':>18}")
    convs = [(32, 64, 64, 32, 3, 1, 1), (32, 32, 64, 64, 3, 1, 1), (32, 96, 64, 32, 3, 1, 1), (32, 12, 64, 24, 3, 1, 1), (16, 3, 64, 32, 4, 4, 1),
             (32, 64, 64, 128, 3, 2, 1), (32, 64, 64, 64, 3, 2, 64), (32, 3, 64, 64, 7, 2, 1), (16, 64, 32, 128, 1, 1, 1),
             (8, 64, 32, 64, 3, 1, 1), (8, 128, 16, 32, 1, 1, 1), (16, 512, 2, 512, 3, 1, 1),  # ResNet-18's deepest, at 64x64
             (32, 64, 64, 128, 1, 2, 1), (32, 128, 32, 128, 3, 2, 4), (32, 128, 32, 128, 3, 2, 32),  # strided: a downsampling 1x1; groups of 32 and of 4 channels
             (8, 256, 64, 10, 1, 1, 1), (2, 256, 64, 10, 1, 1, 1),  # a segmentation head, 1x1 to 10 channels: PyTorch's own kernel (Slow2d)
             (16, 3, 64, 32, 1, 1, 1), (16, 3, 32, 64, 1, 1, 1)]  # a 1x1 from an image's channels (a lifting layer): its weights' gradient copies them blocked
    A, rows = torch.ops.aten, []
    for B, C, S, O, k, st, g in convs:
        x, w = torch.empty(B, C, S, S, device='meta'), torch.empty(O, C // g, k, k, device='meta')
        fa = (x, w, None, [st, st], [k // 2] * 2, [1, 1], False, [0, 0], g)
        y = A.convolution(*fa)
        rows.append((f'{B} x {C} x {S}x{S} -> {O}, {k}x{k}, /{st}, g{g}', fa, y, (y, x, w, [O], [st, st], [k // 2] * 2, [1, 1], False, [0, 0], g, [C != 3, True, False])))
    _conv_rows(rows)
    print("1b. Transposed convolutions (oneDNN, a plain convolution's passes from output to input): scratch MiB, forward | backward")
    ups = [(32, 128, 16, 64, 2, 2, 0, 0, 1), (32, 64, 32, 32, 4, 2, 1, 0, 1), (32, 64, 32, 32, 3, 2, 1, 1, 1), (32, 64, 32, 64, 3, 1, 1, 0, 1),
           (32, 64, 32, 64, 4, 2, 1, 0, 4), (32, 64, 32, 64, 4, 2, 1, 0, 64), (32, 32, 64, 3, 4, 2, 1, 0, 1),  # groups of 16; depthwise; to RGB
           (32, 24, 31, 4, 3, 2, 0, 0, 1), (32, 24, 31, 12, 3, 2, 0, 0, 1), (64, 100, 1, 256, 4, 1, 0, 0, 1),  # few channels; a generator's first layer
           (16, 16, 128, 10, 3, 1, 1, 0, 1), (16, 16, 128, 12, 3, 1, 1, 0, 1), (16, 16, 128, 3, 3, 1, 1, 0, 1), (32, 48, 33, 24, 3, 1, 1, 0, 1)]  # unstrided, to few channels
    rows = []
    for B, C, S, O, k, st, p, op, g in ups:
        x, w = torch.empty(B, C, S, S, device='meta'), torch.empty(C, O // g, k, k, device='meta')
        fa = (x, w, None, [st, st], [p, p], [1, 1], True, [op, op], g)
        y = A.convolution(*fa)
        rows.append((f'{B} x {C} x {S}x{S} -> {O}, {k}x{k}, x{st}, g{g}', fa, y, (y, x, w, [O], [st, st], [p, p], [1, 1], True, [op, op], g, [S > 1, True, False])))
    _conv_rows(rows)
    print("1c. Channels-last convolutions (NHWC: oneDNN copies no activations; a depthwise kernel wider than 3 pads its weights' gradient): scratch MiB, forward | backward")
    cls = [(16, 64, 16, 64, 7, 1, 64), (32, 64, 32, 64, 7, 1, 64), (16, 128, 16, 128, 5, 1, 128), (16, 64, 16, 64, 3, 1, 64),
           (16, 64, 32, 64, 3, 1, 1), (16, 64, 32, 128, 3, 2, 1), (16, 64, 32, 128, 1, 1, 1), (16, 32, 32, 64, 2, 2, 1),
           (16, 512, 2, 512, 3, 1, 1), (16, 512, 2, 512, 3, 1, 1, 'w_cl'), (16, 64, 32, 128, 3, 2, 1, 'w_cl')]  # weights channels-last too (a converted model), or not (ATen copies them)
    rows = []
    for B, C, S, O, k, st, g, *wl in cls:
        x, w = torch.empty(B, C, S, S, device='meta').contiguous(memory_format=torch.channels_last), torch.empty(O, C // g, k, k, device='meta')
        if wl: w = w.contiguous(memory_format=torch.channels_last)
        pad = k // 2 if st == 1 else 0
        fa = (x, w, None, [st, st], [pad, pad], [1, 1], False, [0, 0], g)
        y = A.convolution(*fa).contiguous(memory_format=torch.channels_last)
        rows.append((f'{B} x {C} x {S}x{S} -> {O}, {k}x{k}, /{st}, g{g}{", weights NHWC" if wl else ""}', fa, y, (y, x, w, [O], [st, st], [pad, pad], [1, 1], False, [0, 0], g, [True, True, False])))
    _conv_rows(rows)
    print("1d. bf16 convolutions (oneDNN accumulates the destination in fp32: the output in forward, the input's gradient in backward): scratch MiB, forward | backward")
    rows = []
    for B, C, S, O, k, st, g in [(8, 96, 64, 32, 3, 1, 1), (8, 64, 32, 64, 3, 1, 1), (8, 32, 64, 64, 3, 1, 1), (8, 64, 32, 128, 3, 2, 1), (8, 128, 16, 128, 3, 1, 1),
                                 (8, 64, 16, 256, 1, 1, 1), (8, 3, 64, 32, 3, 1, 1), (32, 64, 64, 32, 3, 1, 1), (16, 64, 32, 64, 3, 1, 64), (16, 256, 8, 512, 3, 2, 1)]:
        x, w = torch.empty(B, C, S, S, device='meta', dtype=torch.bfloat16), torch.empty(O, C // g, k, k, device='meta', dtype=torch.bfloat16)
        fa = (x, w, None, [st, st], [k // 2] * 2, [1, 1], False, [0, 0], g)
        y = A.convolution(*fa)
        rows.append((f'{B} x {C} x {S}x{S} -> {O}, {k}x{k}, /{st}, g{g}', fa, y, (y, x, w, [O], [st, st], [k // 2] * 2, [1, 1], False, [0, 0], g, [C != 3, True, False])))
    _conv_rows(rows)
    print("2. LSTM layers (oneDNN's op): MiB of workspace resident after forward (mincore), forward scratch, backward scratch")
    shapes = [[64, 32, 64, 128], [128, 32, 64, 128], [64, 32, 64, 256], [64, 32, 256, 128], [100, 64, 32, 100], [64, 128, 64, 128],
              [64, 32, 512, 128], [64, 32, 64, 128, 'reverse'], [64, 32, 256, 128, 'reverse']]  # wider inputs; a bidirectional layer's second direction
    if onednn_lowp('torch.bfloat16'):  # where oneDNN runs no bf16, PyTorch takes its own kernels
        shapes += [[64, 32, 64, 128, 'bf16'], [64, 128, 64, 128, 'bf16'], [64, 32, 256, 128, 'bf16'], [64, 32, 64, 128, 'reverse', 'bf16'], [32, 16, 64, 384, 'bf16']]
    res = run_in_child('_measure_lstms', [['lstm', T, B, I, H, 'reverse' in rest, 'bfloat16' if 'bf16' in rest else 'float32'] for T, B, I, H, *rest in shapes])
    for sh, r in zip(shapes, res):
        rev, bf = 'reverse' in sh[4:], 'bf16' in sh[4:]
        m = lstm_workspace(*sh[:2], sh[3], sh[2], reverse=rev, itemsize=2 if bf else 4, brgemm=bf and lstm_brgemm(torch.bfloat16))
        print(f"  steps {sh[0]}, batch {sh[1]}, {sh[2]} -> {sh[3]}{', reversed' if rev else ''}{', bf16' if bf else ''}: measured " + ' '.join(mi(v) for v in r) + "   model " + ' '.join(mi(v) for v in m), flush=True)
    print("3. Temporaries of dtypes (inputs brought to the common dtype, a half-precision mean, a bool or integer sum's int64 copy, dropout's mask), matrix_exp's buffers, F.fold/F.unfold's contiguous copies, convolutions of tensors in other layouts (with the convolution's own scratch), fused attention's accumulators, upsampling's channels-last copies, MKL's FFT copies, complex abs/angle: scratch MiB")
    from netlite_nb.memory.trace import CONVS
    from netlite_nb.memory.cpu import op_arg, attention_scratch, contiguous_copies, conv_layout_copies, cpu_conv_scratch, fft_scratch, matrix_exp_scratch, promotion_copies, upsample_copies
    t = lambda *shape, dt='float32': ['tensor', list(shape), dt]
    ops = [['add.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='bfloat16')]], ['add_.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='bfloat16')]],
           ['mul.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='bool')]], ['mul.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='int64')]],
           ['add.Tensor', [t(32, 128, 512), t(512, dt='bfloat16')]], ['where.self', [t(32, 128, 512, dt='bool'), t(32, 128, 512), t(32, 128, 512, dt='bfloat16')]],
           ['lt.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='bfloat16')]], ['mean.dim', [t(32, 128, 512, dt='bfloat16'), [-1]]],
           ['mean.dim', [t(32, 128, 512), [-1]]], ['native_dropout.default', [t(32, 128, 512), 0.1, True]], ['native_dropout.default', [t(32, 128, 512, dt='bfloat16'), 0.1, True]],
           ['sum.dim_IntList', [t(32, 64, 256, 16, dt='bool'), [-1], True]], ['sum.dim_IntList', [t(32, 128, 512, dt='uint8'), [1]]],  # counted in int64
           ['sum.dim_IntList', [t(32, 128, 512, dt='int32'), [-1]]], ['prod.dim_int', [t(32, 128, 512, dt='int32'), -1]],
           ['sum.dim_IntList', [t(32, 128, 512, dt='int64'), [-1]]], ['sum.dim_IntList', [t(32, 128, 512, dt='bfloat16'), [-1]]],  # no copy
           ['linalg_matrix_exp.default', [t(256, 256)]], ['linalg_matrix_exp.default', [t(512, 512)]], ['linalg_matrix_exp.default', [t(1024, 1024)]],  # compute_T18's buffers
           ['col2im.default', [t(64, 48, 1024) + ['T'], [64, 64], [4, 4], [1, 1], [1, 1], [2, 2]]], ['col2im.default', [t(64, 48, 1024), [64, 64], [4, 4], [1, 1], [1, 1], [2, 2]]],
           ['im2col.default', [t(64, 3, 64, 64) + ['T'], [4, 4], [1, 1], [1, 1], [2, 2]]], ['im2col.default', [t(64, 3, 64, 64), [4, 4], [1, 1], [1, 1], [2, 2]]]]  # F.fold/F.unfold: copies of inputs that are not contiguous
    conv = lambda x, w, d: ['convolution.default', [x, w, None, [1, 1], [1, 1], [d, d], False, [0, 0], 1]]  # a convolution's tensors in other layouts:
    ops += [conv(t(64, 64, 16, 16) + ['T01'], t(128, 64, 8, 8) + ['T01'], 2), conv(t(64, 64, 16, 16) + ['T01'], t(128, 64, 8, 8), 2),  # a double backward's
            conv(t(64, 64, 16, 16), t(128, 64, 8, 8) + ['T01'], 2), conv(t(64, 64, 16, 16), t(128, 64, 8, 8), 2),  # weight gradient swaps batch and channels
            conv(t(3, 64, 32, 32) + ['T01'], t(64, 64, 16, 16) + ['T01'], 2), conv(t(32, 64, 32, 32) + ['T'], t(64, 64, 3, 3), 1), conv(t(32, 64, 32, 32), t(64, 64, 3, 3), 1)]
    for B, C, H in [(8, 64, 32), (8, 32, 64), (8, 128, 16), (8, 3, 32), (16, 96, 32), (8, 64, 48)]:  # upsampling: output H + W at most 128, or more
        for dt in ('float32', 'bfloat16'):
            ops += [['upsample_nearest2d.default', [t(B, C, H, H, dt=dt), [2 * H, 2 * H], 2.0, 2.0]], ['upsample_bilinear2d.default', [t(B, C, H, H, dt=dt), [2 * H, 2 * H], False, 2.0, 2.0]]]
    for B, H, T, D in [(16, 4, 128, 64), (64, 4, 128, 64), (16, 4, 512, 64), (16, 8, 128, 32), (8, 4, 1024, 64), (16, 4, 128, 128)]:
        for dt in ('float32', 'bfloat16'):
            ops += [['_scaled_dot_product_flash_attention_for_cpu.default', [t(B, H, T, D, dt=dt)] * 3 + [0.0, False]],
                    ['_scaled_dot_product_flash_attention_for_cpu_backward.default', [t(B, H, T, D, dt=dt)] * 5 + [t(B, H, T), 0.0, False]]]
    ops += [['abs.default', [t(16, 129, 251, dt='complex64')]], ['angle.default', [t(16, 129, 251, dt='complex64')]], ['abs.default', [t(16, 64, 256, dt='complex128')]]]
    for B, C, H in [(16, 32, 32), (4, 64, 128)]:  # MKL's FFTs: over the innermost dimensions or not; the inverse real transform over one, two or three
        ops += [['_fft_r2c.default', [t(B, C, H, H), [2, 3], 0, True]], ['_fft_r2c.default', [t(B, C, H, H), [2], 0, True]], ['_fft_r2c.default', [t(B, C, H, H), [0], 0, True]],
                ['_fft_c2c.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [1, 2], 0, False]],
                ['_fft_c2r.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [3], 0, H]], ['_fft_c2r.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [2], 0, H]],
                ['_fft_c2r.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [2, 3], 0, H]], ['_fft_c2r.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [1, 2, 3], 0, H]],
                ['_fft_c2r.default', [t(B, C, H // 2 + 1, H, dt='complex64'), [3, 2], 0, H]], ['_fft_c2r.default', [t(B, C, H // 2 + 1, H, dt='complex64'), [1, 2], 0, H]]]
    for (op, args), g in zip(ops, run_in_child('_measure_ops', ops)):
        f, xs = functools.reduce(getattr, op.split('.'), torch.ops.aten), [op_arg(a, 'meta') for a in args]
        label = op.split('.')[0].replace('_scaled_dot_product_flash_attention_for_cpu', 'flash attention') + ' ' + ', '.join(f"{'x'.join(map(str, a[1]))} {a[2]}" for a in args if isinstance(a, list) and a[:1] == ['tensor'])[:60]
        dims = f' dims {args[1]}' if op.startswith('_fft') else ''
        print(f"  {label + dims:<78} measured {mi(g)}   model {mi(promotion_copies(f, xs) + attention_scratch(f, xs) + upsample_copies(f, xs, f(*xs)) + fft_scratch(f, xs) + contiguous_copies(f, xs) + matrix_exp_scratch(f, xs) + (cpu_conv_scratch(f, xs, f(*xs)) + conv_layout_copies(f, xs) if f in CONVS else 0))}", flush=True)

def run_child(flag, arg)->list:
    out = subprocess.run([sys.executable, __file__, flag, json.dumps(arg)], env={**os.environ, **ENV, 'PYTHONPATH': str(ROOT)},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.split('\n')[-2])

def budgets_table(models=tuple(MODELS), budgets=(0.5, 1, 2), next_up=True, set_name=None, options=None, out=RESULTS):
    """Solve max_batch_size on the CPU for each budget and measure the solved batch (and, with next_up, the next one up) in fresh
    processes. ok: the solved batch measures within the budget and uses at least 90 % of it. With set_name, the rows are stored
    as the accuracy table's are (one file per set, machine and budgets), each with the budget, the share of it used and the verdict."""
    from netlite_nb.budget import max_batch_size
    t_all = time.time()
    if set_name:
        result = new_result(set_name, {**(options or {}), 'budgets': list(budgets)})
        path = result_path(set_name, result['machine'], result['options'], out)
    print(f"{'model':<13}{'budget':>8}{'solved':>8}{'predicted@b':>13}{'measured@b':>12}{'used':>7}" + (f"{'measured@b+1':>14}{'per sample':>12}" if next_up else '') + "  ok")
    for name in models:
        for gb in budgets:
            t0, budget = time.time(), int(gb * 2**30)
            model, batch = make(name, 2)
            with _as_measured(): b = max_batch_size(model, batch, loss_fn=LOSSES.get(name), budget=budget, device_or_gpu='cpu', optimizer='adamw', precision=_precision())
            p0, m0 = predicted(name, b), measured(name, b)
            ok = 'NO: over budget' if m0 > budget else 'yes: the search stops at max_batch' if b == 2**16 else f"NO: uses {100*m0/budget:.0f}% < 90%" if m0 < 0.9 * budget else 'yes'
            line = f"{name:<13}{gb:>6.1f}Gi{b:>8}{p0/2**20:>11.1f}Mi{m0/2**20:>10.1f}Mi{100*m0/budget:>6.0f}%"
            if next_up:
                p1, m1 = predicted(name, b + 1), measured(name, b + 1)
                if ok == 'yes' and m1 <= budget:  # the solved batch fits but so does the next: how many samples of room were left
                    ok = f"yes; b+1 fits too: {(budget - m0)/2**20:.1f} MiB left = {int((budget - m0) / max(1, p1 - p0))} samples"
                line += f"{m1/2**20:>12.1f}Mi{(p1 - p0)/2**20:>10.3f}Mi"
            print(f"{line}  {ok}  ({time.time() - t0:.0f} s)", flush=True)
            if set_name:
                result['rows'].append(dict(model=name, batch=b, budget=budget, measured=m0, planned=p0, error_pct=round(100 * (p0 - m0) / m0, 2),
                                           used_pct=round(100 * m0 / budget, 1), ok=ok, seconds=round(time.time() - t0, 1)))
                result['seconds'] = round(time.time() - t_all, 1)
                save_result(path, result)
    if set_name:
        result.update(complete=True, seconds=round(time.time() - t_all, 1))
        save_result(path, result)
        print(f"stored: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")

def libc_handle():
    import ctypes
    libc = ctypes.CDLL(None)
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return libc

def replay_child(calls:list)->list:
    """Run in a fresh process: replay [bytes, align] (an allocation: posix_memalign when align > 16, else malloc; written) or [-1 - index]
    (a free) through glibc; the resident high-water mark's growth."""
    import ctypes
    libc, ptrs = libc_handle(), {}
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.malloc_trim(0)  # the free heap the import left would take allocations without growing the resident set
    base = process_rss()
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')
    for i, (n, *align) in enumerate(calls):
        if n < 0: libc.free(ptrs.pop(-n - 1)); continue
        if align[0] > 16: p = ctypes.c_void_p(); libc.posix_memalign(ctypes.byref(p), align[0], max(n, 1)); p = p.value
        else: p = libc.malloc(max(n, 1))
        libc.memset(p, 1, max(n, 1)); ptrs[i] = p
    return [_hwm() - base]

def _calls(tr, with_graph=True)->list:
    "The trace's allocations as the planner replays them (`heap_blocks`), for replay_child and `_model_peak`: [bytes, align] or [-1 - index]."
    from netlite_nb.memory.heap import heap_blocks
    index, calls = {}, []
    for sign, rec in tr.events:
        if rec.category == 'autograd graph' and not with_graph: continue
        if sign < 0: calls.extend([-j - 1] for j in index.pop(id(rec), ()))
        else:
            blocks = heap_blocks(rec, tr.graph)
            index[id(rec)] = range(len(calls), len(calls) + len(blocks))
            calls.extend([n, align] for n, align in blocks)
    return calls

def _residency(calls)->list[int]:
    "Calls ([bytes, align] or [-1 - index], as `_calls` writes them) through the planner's model of glibc, with the bench's settings: the bytes resident after each."
    from netlite_nb.memory.heap import GlibcHeap, glibc_settings
    with _as_measured(): h, keys, out = GlibcHeap(**glibc_settings()), {}, []
    for i, (n, *align) in enumerate(calls):
        if n < 0: h.free(keys.pop(-n - 1))
        else: keys[i] = h.malloc(n, align[0])
        out.append(h.rss())
    return out

def _model_peak(calls)->int:
    "The same calls through the planner's model of glibc, with the bench's settings: the most they keep resident."
    return max(_residency(calls), default=0)

def _replayed(calls)->int:
    out = subprocess.run([sys.executable, __file__, '--replay-child', '-'], input=json.dumps(calls), env={**os.environ, **ENV, 'PYTHONPATH': str(ROOT)},
                         capture_output=True, text=True, check=True)  # on stdin: too long for a command line
    return json.loads(out.stdout.split('\n')[-2])[0]

def heap_report(name, bs):
    """Where a step's memory beyond its tensors sits: the trace's allocations replayed through glibc and through the planner's model of it
    (tensors alone, then with the autograd graph's objects among them), the graph itself, and what the warm-up's freed heap hides."""
    from netlite_nb.memory.trace import GRAPH_KEY, trace_step
    model, batch = make(name, bs)
    tr = trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu').tracker
    mi = lambda n: f"{n/2**20:.2f} MiB"
    tensors = max(itertools.accumulate(s * r.nbytes for s, r in tr.events if r.category not in ('autograd graph', 'kernel scratch')))
    live = max(itertools.accumulate(s * r.nbytes for s, r in tr.events if r.category != 'kernel scratch'))
    alone, both = _calls(tr, with_graph=False), _calls(tr)
    print(f"{name} at batch {bs}: the trace's tensors peak at {mi(tensors)}; replayed through glibc (the bench's settings) they raise the "
          f"resident set by {mi(_replayed(alone))}, the planner's model of glibc says {mi(_model_peak(alone))}")
    print(f"  with the autograd graph's objects among them: {mi(live)} alive at the peak; glibc {mi(_replayed(both))}, the model {mi(_model_peak(both))}")
    graph = sum(r.nbytes for r in tr.allocs if r.category == 'autograd graph' and r.step == tr.step and r.born <= tr.peak_at and (r.died or 0) > tr.peak_at)
    nodes = sum(r.nbytes for r in trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu', measured={GRAPH_KEY: (1, 0, 0)}, steps=1).tracker.allocs
                if r.category == 'autograd graph')
    holes, trimmed = measured(name, bs, holes=True), measured(name, bs, holes=False)
    print(f"  {nodes} autograd nodes; the plan holds {mi(graph)} of graph at the tensors' peak. Measured with the warm-up's freed heap left in place "
          f"{mi(holes)}, handed back first (malloc_trim, the bench's protocol) {mi(trimmed)}: the holes hid {mi(trimmed - holes)}")

def phases_child(name, bs, out=None)->list:
    """Run in a fresh process (the bench's protocol): the high-water mark of each phase of each of the two measured steps, cleared before each.
    With `out`, under bench/malloc_trace.c (LD_PRELOAD): every C library call of the steps goes to `out`, each phase's first and last to `out`.json."""
    import ctypes, gc
    lib = ctypes.CDLL(None)
    torch.set_num_threads(1)
    model, (x, y) = make(name, bs)
    warm = _optimizer()(model.parameters())
    _steps(model, warm, x[:2], y[:2], 1, _loss(name))
    del warm
    for p in model.parameters(): p.grad = None
    torch.manual_seed(1)
    opt = _optimizer()(model.parameters())
    gc.collect(); free_blas_buffers(); lib.malloc_trim(0)
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]  # Adagrad's, made by its constructor
    alive = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers(), x, y, *state])
    if out:  # the tracer's buffer is touched before the baseline
        lib.mt_n.restype, lib.mt_open.argtypes = ctypes.c_uint64, [ctypes.c_char_p]
        if lib.mt_open(str(out).encode()) < 0: sys.exit(f"the tracer could not open {out}")
        lib.mt_on()
    calls = (lambda: int(lib.mt_n())) if out else (lambda: 0)
    base, hwm, marks = process_rss(), [], []
    def phase(f):
        with open('/proc/self/clear_refs', 'w') as fh: fh.write('5')
        first = calls(); r = f(); marks.append((first, calls()))
        hwm.append(_hwm() - base + alive); return r
    for _ in range(2):
        with _autocast():
            o = phase(lambda: model(x))
            loss = _loss(name)(o, y)
        phase(loss.backward)
        del o, loss
        phase(lambda: (opt.step(), opt.zero_grad(set_to_none=True)))
    if out and lib.mt_close(): sys.exit(f"the tracer could not write all its calls to {out}")
    if out: Path(f"{out}.json").write_text(json.dumps(dict(marks=marks, hwm=hwm, alive=alive)))
    return hwm

def _plan_phases(name, bs):
    "The plan of one case, and per (step, phase) its live bytes and their replay through `GlibcHeap` from the heap the plan replays from."
    from netlite_nb.budget import plan_memory
    from netlite_nb.memory.trace import trace_step
    from netlite_nb.memory.heap import glibc_peak, glibc_resident, heap_replays
    model, batch = make(name, bs)
    tr = trace_step(model, batch, LOSSES.get(name), optimizer='adamw', precision=_precision(), kernels='cpu').tracker
    best, heap = {}, {}
    with _as_measured():
        p = plan_memory(model, batch, LOSSES.get(name), optimizer='adamw', precision=_precision(), device_or_gpu='cpu')
        worst = max(heap_replays(), key=lambda r: glibc_peak(tr, *r)[0])  # the replay the plan keeps
        for i, live, resident in glibc_resident(tr, *worst):
            sign, rec = tr.events[i]
            if sign > 0: ph = (rec.step, 'forward' if rec.phase == 'loss' else rec.phase)
            best[ph], heap[ph] = max(best.get(ph, 0), live), max(heap.get(ph, 0), resident)
    kept = p.breakdown['CPU kernel workspace']
    return p, {k: v + kept for k, v in best.items()}, {k: v + kept for k, v in heap.items()}

_PHASES = [(s, f) for s in range(2) for f in ('forward', 'backward', 'optimizer')]

def phases_report(name, bs):
    """Where in the step a case's measurement and its plan part: each phase's measured high-water mark next to the plan's live bytes
    in that phase and to what they keep resident replayed through the planner's model of glibc (`GlibcHeap`)."""
    p, best, heap = _plan_phases(name, bs)
    got = run_child('--phases-child', [name, bs])
    print(f"{name} at batch {bs}: plan {p.peak/2**20:.2f} MiB. Per phase, measured high-water mark | the plan's live bytes (tensors, graph, kernel workspace) "
          "| the same replayed through the model of glibc:")
    for i, (step, phase) in enumerate(_PHASES):
        print(f"  step {step + 1} {phase:<9} {got[i]/2**20:8.2f} | {best.get((step, phase), 0)/2**20:8.2f} | {heap.get((step, phase), 0)/2**20:8.2f} MiB")

def _tracer()->Path:
    "bench/malloc_trace.c built into a shared library (once per source), for LD_PRELOAD."
    import hashlib, shutil, tempfile
    src = Path(__file__).with_name('malloc_trace.c')
    cc = shutil.which('cc') or shutil.which('gcc')
    if cc is None: sys.exit("--malloc-trace builds bench/malloc_trace.c and needs a C compiler (cc or gcc) on the PATH: none was found.")
    so = Path(tempfile.gettempdir()) / f"netlite_malloc_trace_{hashlib.sha1(src.read_bytes()).hexdigest()[:12]}.so"
    if not so.exists(): subprocess.run([cc, '-O2', '-shared', '-fPIC', '-o', str(so), str(src)], check=True)
    return so

def _replay_calls(calls, marks)->list:
    "The traced C library calls replayed through `GlibcHeap` from an empty heap: each phase's high-water mark of what they keep resident."
    if marks[-1][1] > len(calls): sys.exit(f"the tracer's file holds {len(calls)} calls, but the phases end at call {marks[-1][1]}")
    index, plan, at = {}, [], []  # pointer -> its allocation in `plan`; the traced calls as `_calls` writes them; where each traced call starts there
    for op, n, ptr, old in calls[:marks[-1][1]]:
        at.append(len(plan))
        kind = op & 0xff
        if kind in (2, 4) and (j := index.pop(ptr if kind == 2 else old, None)) is not None: plan.append([-j - 1])  # blocks from before the trace are unknown
        if kind != 2 and ptr: index[ptr] = len(plan); plan.append([n, op >> 8 if kind == 5 else 16])  # a null pointer: nothing was allocated
    after = _residency(plan)
    at.append(len(plan))
    # a phase's mark starts where the heap is before its first call, as clear_refs does, and rises with each of its calls
    return [max([after[at[first] - 1] if at[first] else 0, *after[at[first]:at[last]]]) for first, last in marks]

def malloc_trace_report(name, bs):
    """Every C library call of the two measured steps, traced (bench/malloc_trace.c, LD_PRELOAD) and replayed through `GlibcHeap`:
    next to each phase's measurement and the plan's replay of its own trace, it separates what the model of glibc gets wrong (the real
    calls replayed) from what the tensor trace lacks (the plan's calls)."""
    import shutil, tempfile
    from array import array
    so, out = _tracer(), Path(tempfile.mkdtemp()) / 'calls.bin'
    subprocess.run([sys.executable, __file__, '--phases-child', json.dumps([name, bs, str(out)])], stdout=subprocess.DEVNULL, env={**os.environ, **ENV, 'PYTHONPATH': str(ROOT),
                   'LD_PRELOAD': str(so)}, check=True)
    meta = json.loads(Path(f"{out}.json").read_text())
    words = array('Q', out.read_bytes())
    shutil.rmtree(out.parent)
    calls = [words[i:i + 4] for i in range(0, len(words), 4)]
    real = [r + meta['alive'] for r in _replay_calls(calls, meta['marks'])]
    p, best, heap = _plan_phases(name, bs)
    small = sum(1 for op, n, _, _ in calls if op & 0xff != 2 and n <= 1024)
    print(f"{name} at batch {bs}: plan {p.peak/2**20:.2f} MiB, measured {measured(name, bs)/2**20:.2f} MiB without the tracer; "
          f"from the first step's start to the second's end the process made {len(calls)} C library calls ({small} allocations of 1 KiB or less).")
    print("Per phase (MiB): measured high-water mark | the real calls replayed through GlibcHeap from an empty heap | the plan's own replay:")
    for i, (step, phase) in enumerate(_PHASES):
        print(f"  step {step + 1} {phase:<9} {meta['hwm'][i]/2**20:8.2f} | {real[i]/2**20:8.2f} | {heap.get((step, phase), 0)/2**20:8.2f}")

def histories_report(name, bs, n):
    """How much a few small blocks in the heap before a step move its peak: measured with each of the planner's `heap_history(seed)`
    left alive before the steps, next to the plan's replay from the same history; the plan keeps the highest of its first ones."""
    from netlite_nb.budget import plan_memory
    from netlite_nb.memory.trace import trace_step
    from netlite_nb.memory.heap import HEAP_HISTORIES, glibc_peak
    model, batch = make(name, bs)
    with _as_measured():
        p = plan_memory(model, batch, LOSSES.get(name), optimizer='adamw', device_or_gpu='cpu')
        tr = trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu').tracker
        kept = p.breakdown['CPU kernel workspace']
        rows = [(measured(name, bs, history=s), max(glibc_peak(tr, s, cut)[0] for cut in (False, True)) + kept) for s in range(n)]
    mi = lambda v: f"{v/2**20:.2f}"
    print(f"{name} at batch {bs}: plan {mi(p.peak)} MiB, the highest of the replays from histories 0-{HEAP_HISTORIES - 1}")
    print("  history   measured   replayed (MiB)")
    for s, (m, r) in enumerate(rows): print(f"  {s:>7} {mi(m):>10} {mi(r):>10}")
    ms = [m for m, _ in rows]
    print(f"  measured {mi(min(ms))}-{mi(max(ms))}; the plan is {100 * (p.peak - max(ms)) / max(ms):+.1f}% from the highest, {100 * (p.peak - min(ms)) / min(ms):+.1f}% from the lowest")

def step_time(name, bs, n=5)->float:
    "Run in a fresh process: the median seconds of `n` training steps at the full batch, after two that warm up."
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', '1')))
    _fix_late()
    model, (x, y) = make(name, bs)
    opt = _optimizer()(model.parameters())
    _steps(model, opt, x, y, 2, _loss(name))
    ts = []
    for _ in range(n):
        t = time.perf_counter(); _steps(model, opt, x, y, 1, _loss(name)); ts.append(time.perf_counter() - t)
    return sorted(ts)[n // 2]

def _glibc_env(setting:str)->dict:
    "This process's environment with glibc's malloc settings replaced by `GLIBC[setting]`."
    env = {k: v for k, v in os.environ.items() if not k.startswith('MALLOC_') and k != 'GLIBC_TUNABLES'}
    return {**env, **GLIBC[setting], 'OMP_NUM_THREADS': ENV['OMP_NUM_THREADS'], 'PYTHONPATH': str(ROOT)}

def speed_report(name, bs, n):
    """One step's time under each glibc setting of `GLIBC`: `n` rounds, each running every setting once in a fresh process, one after
    another (so load on the machine hits them alike); medians, and the median of each round's ratio to glibc's own settings."""
    secs = {k: [] for k in GLIBC}
    for _ in range(n):
        for k in GLIBC:
            out = subprocess.run([sys.executable, __file__, '--step-time', name, str(bs)], env=_glibc_env(k), capture_output=True, text=True, check=True)
            secs[k].append(float(out.stdout.split()[-1]))
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"{name} at batch {bs}, one training step (median of {n} paired rounds, each the median of 5 steps in a fresh process):")
    for k, v in secs.items():
        ratio = med([a / b for a, b in zip(v, secs['defaults'])])
        print(f"  {k:<{max(map(len, GLIBC))}} {med(v):7.3f} s   x{ratio:.2f} glibc's own   {' '.join(f'{t:.3f}' for t in v)}   {GLIBC[k] or '(no MALLOC_* setting)'}")

def repeat(name, bs, n):
    "Measure one case n times, to see how well a measurement repeats."
    ms = [measured(name, bs) / 2**20 for _ in range(n)]
    print(f"{name} batch {bs}: " + ', '.join(f"{m:.2f}" for m in ms) + f" MiB; spread {max(ms) - min(ms):.2f} MiB")

def _options(a)->dict:
    "The options of a stored result that change what is measured or planned (models: a part of the set, or None for all of it)."
    return dict(threads=a.threads, precision=a.precision or 'fp32', glibc=a.glibc, warmup_holes=a.warmup_holes, models=a.models)

def set_summary(name:str)->str:
    "The first sentence of a set's docstring, for its flag's help."
    return (MODULES[name].__doc__ or name).strip().split('\n\n')[0].replace('\n', ' ')

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--measure', nargs='+', help=argparse.SUPPRESS)
    ap.add_argument('--kernels-child', help=argparse.SUPPRESS)
    ap.add_argument('--set', choices=list(SETS), help="the set of models to measure, one file of bench/sets/ each (default: 'default', three models); "
                    "the accuracy table's rows are stored in bench/results/budget_accuracy/")
    ap.add_argument('--results', type=Path, default=RESULTS, help='the folder the accuracy table is stored in (default: bench/results/budget_accuracy)')
    for name in SETS:  # the old flags, one per set: `--families` is `--set families`
        if name != 'default': ap.add_argument(f'--{name}', action='store_const', dest='set', const=name, help=f'--set {name}: ' + set_summary(name))
    ap.add_argument('--optimizers', nargs='*', metavar='MODEL:BATCH', help='accuracy table with each optimizer of OPTIMIZERS (default cases: resnet18:16 gru:32 ln_mlp:64 tied_lm:16)')
    ap.add_argument('--calibrate', action='store_true', help='add a column: the plan calibrated on this machine (from an empty cache)')
    ap.add_argument('--budgets', action='store_true')
    ap.add_argument('--real-budgets', action='store_true', help="--budgets with the issue's unscaled 2, 4 and 8 GiB, for the CNN and the transformer")
    ap.add_argument('--models', nargs='+', help='models for --budgets (default: all three; cnn and transformer for --real-budgets)')
    ap.add_argument('--gib', nargs='+', type=float, default=[0.5, 1, 2], help='budgets in GiB for --budgets')
    ap.add_argument('--kernels', action='store_true', help='measure each kernel family\'s scratch (convolutions, LSTM) next to the model')
    ap.add_argument('--gemm', action='store_true', help='measure the CPU kernel workspace the planner models, next to the model')
    ap.add_argument('--heap', nargs=2, metavar=('MODEL', 'BATCH'), help="what glibc's heap and the autograd graph add to one case")
    ap.add_argument('--replay-child', help=argparse.SUPPRESS)
    ap.add_argument('--code-pages', nargs='+', metavar='MODEL:BATCH', help="how much of each case's measured peak is file-backed pages (code) its steps faulted in")
    ap.add_argument('--code-pages-child', help=argparse.SUPPRESS)
    ap.add_argument('--calibration-lines', nargs=2, metavar=('MODEL', 'BATCH'), help='each convolution at the full batch next to the lines calibration draws (now and before)')
    ap.add_argument('--phases', nargs=2, metavar=('MODEL', 'BATCH'), help="each phase's measured high-water mark next to the plan's")
    ap.add_argument('--phases-child', help=argparse.SUPPRESS)
    ap.add_argument('--malloc-trace', nargs=2, metavar=('MODEL', 'BATCH'), help="--phases, with every C library call of the real steps traced and replayed through GlibcHeap (needs cc)")
    ap.add_argument('--histories', nargs=3, metavar=('MODEL', 'BATCH', 'N'), help="measure one case from N heap histories (a few small blocks before the steps), next to the plan's replays")
    ap.add_argument('--repeat', nargs=3, metavar=('MODEL', 'BATCH', 'N'), help='measure one case N times')
    ap.add_argument('--warmup-holes', action='store_true', help="leave the warm-up's freed heap in place (the protocol before the autograd graph was planned)")
    ap.add_argument('--precision', choices=['fp32', 'bf16'], help="the measured steps run under CPU autocast to bf16, and the plans are made for it")
    ap.add_argument('--threads', type=int, default=1, help='threads of the measuring processes (the planner models one)')
    ap.add_argument('--glibc-defaults', action='store_true', help="measure and plan with no MALLOC_* settings: glibc raises its mmap threshold as mapped blocks are freed, "
                    "so tensors below 32 MiB come from the heap and its holes stay resident (the measurement then depends on the process's history)")
    ap.add_argument('--glibc', choices=list(GLIBC), default='bench', help="the glibc settings the measured processes and the plans get (see GLIBC)")
    ap.add_argument('--speed', nargs=3, metavar=('MODEL', 'BATCH', 'N'), help="one step's time under each glibc setting of GLIBC, N paired rounds of fresh processes")
    ap.add_argument('--step-time', nargs=2, help=argparse.SUPPRESS)
    ap.add_argument('--full-warmup', action='store_true', help='accuracy table with the warm-up step at the full batch, so kernels have allocated what they keep before the measured steps')
    a = ap.parse_args()
    import warnings
    from netlite_nb.budget import MovingThresholdWarning
    warnings.simplefilter('ignore', MovingThresholdWarning)  # the bench plans for the processes it starts (`_as_measured`), not for itself
    ENV['OMP_NUM_THREADS'] = str(a.threads)
    if a.precision: ENV['BENCH_PRECISION'] = os.environ['BENCH_PRECISION'] = a.precision  # the measuring children inherit it
    torch.set_num_threads(a.threads)  # plan for the thread count the measured processes run with: it changes PyTorch's kernel choice
    HOLES = a.warmup_holes
    if a.glibc_defaults: a.glibc = 'defaults'  # neither the measured processes nor the plans get a MALLOC_* setting
    if a.glibc != 'bench':  # the measured processes and the plans (`_as_measured`) get these settings and no others
        for k in [k for k in ENV if k.startswith('MALLOC_')]: del ENV[k]
        for k in [k for k in os.environ if k.startswith('MALLOC_') or k == 'GLIBC_TUNABLES']: del os.environ[k]
        ENV.update(GLIBC[a.glibc])
    if a.glibc in ('fixed-late', 'set-late') and not a.measure:  # the plans are made in a process that fixed its thresholds too
        from netlite_nb.memory.heap import fix_glibc_thresholds
        fix_glibc_thresholds()
    if a.measure:
        peak = measure(a.measure[0], int(a.measure[1]), 'full' in a.measure[2:], 'holes' in a.measure[2:], int(next((m[8:] for m in a.measure[2:] if m.startswith('history=')), 0)))
        print(_CODE_PAGES[-1], peak)  # `measured` reads both
    elif a.kernels_child: print(json.dumps(kernels_child(*json.loads(a.kernels_child))))
    elif a.replay_child: print(json.dumps(replay_child(json.load(sys.stdin))))
    elif a.code_pages_child: print(json.dumps(code_pages_child(*json.loads(a.code_pages_child))))
    elif a.code_pages: code_pages_report([(c.split(':')[0], int(c.split(':')[1])) for c in a.code_pages])
    elif a.heap: heap_report(a.heap[0], int(a.heap[1]))
    elif a.calibration_lines: calibration_lines(a.calibration_lines[0], int(a.calibration_lines[1]))
    elif a.phases: phases_report(a.phases[0], int(a.phases[1]))
    elif a.malloc_trace: malloc_trace_report(a.malloc_trace[0], int(a.malloc_trace[1]))
    elif a.phases_child: print(json.dumps(phases_child(*json.loads(a.phases_child))))
    elif a.kernels: kernels_report()
    elif a.optimizers is not None:
        optimizers_table(list(OPTIMIZERS), [(c.split(':')[0], int(c.split(':')[1])) for c in a.optimizers or ['resnet18:16', 'gru:32', 'ln_mlp:64', 'tied_lm:16']])
    elif a.set and not (a.set == 'default' and a.budgets):
        if unknown := [m for m in a.models or [] if m not in SETS[a.set]]: ap.error(f"not in --set {a.set}: {', '.join(unknown)} (it has {', '.join(SETS[a.set])})")
        models = {k: v for k, v in SETS[a.set].items() if not a.models or k in a.models}
        if a.budgets: budgets_table(list(models), a.gib, next_up=False, set_name=a.set, options=_options(a), out=a.results)  # the margin leaves room for b+1
        else: accuracy_table(a.full_warmup, models, a.calibrate, a.set, _options(a), a.results)
    elif a.budgets: budgets_table(a.models or list(MODELS), a.gib)
    elif a.real_budgets: budgets_table(a.models or ['cnn', 'transformer'], [2, 4, 8])
    elif a.gemm: gemm_report()
    elif a.histories: histories_report(a.histories[0], int(a.histories[1]), int(a.histories[2]))
    elif a.speed: speed_report(a.speed[0], int(a.speed[1]), int(a.speed[2]))
    elif a.step_time: print(step_time(a.step_time[0], int(a.step_time[1])))
    elif a.repeat: repeat(a.repeat[0], int(a.repeat[1]), int(a.repeat[2]))
    else: accuracy_table(a.full_warmup, {k: v for k, v in MODELS.items() if not a.models or k in a.models}, a.calibrate, 'default', _options(a), a.results)
