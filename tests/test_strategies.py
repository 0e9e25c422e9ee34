"Chapter 06 checks: every shipped profile validates, loose names, faked probes, planner sizing (with a stand-in planner), what a strategy changes in the run (model transform, allocator settings), run configurations."
import copy, dataclasses, math, os, types
from pathlib import Path
from unittest import mock
import pytest, torch, yaml
import netlite_nb.strategies as S
from netlite_nb.budget import BudgetTooSmallError
from netlite_nb.layers import CheckpointedSequential, ChunkedFFN
from netlite_nb.probe import FakeNVML, GPUInfo, gpu_catalogue, lookup_gpu, probe
from netlite_nb.strategies import (ConfigError, RunConfig, Strategy, UnknownStrategyError, apply_allocator_settings, list_strategies,
                                   load_config, load_strategy, pick_strategy, save_config, strategy_for_gpu, strategy_table)

PROFILE_DIR = Path(__file__).parent.parent / 'netlite_nb' / 'strategies'
no_smi = dict(smi_which=lambda name: None)
GB = 2**30


def fake_probe(*gpus):
    return probe(nvml=FakeNVML(list(gpus)), **no_smi)


def usable(hw):
    "The same machine as if this PyTorch build could drive its first GPU (as a cu126 build on a real GTX 1050 Ti would)."
    hw.gpus[0].usable = True
    hw.device = f"cuda:{hw.gpus[0].index}"
    return hw


# --- the shipped profiles ---------------------------------------------------------------------------------------

REQUIRED = {'name', 'title', 'device', 'budget_fraction', 'precision', 'micro_batch', 'accum_steps', 'checkpointing',
            'chunk_size', 'optimizer', 'lr', 'num_workers', 'pin_memory', 'persistent_workers', 'prefetch_factor',
            'cudnn_benchmark', 'alloc_conf', 'auto_recover_oom', 'gpu', 'notes'}


@pytest.mark.parametrize('path', sorted(PROFILE_DIR.glob('*.yaml')), ids=lambda p: p.stem)
def test_every_yaml_loads_and_validates(path):
    raw = yaml.safe_load(path.read_text())
    assert REQUIRED <= set(raw), f"{path.name} lacks {REQUIRED - set(raw)}"
    assert raw['name'] == path.stem
    s = load_strategy(path.stem)
    assert s.device in ('cuda', 'mps', 'xpu', 'cpu') and s.precision in ('fp32', 'fp16', 'bf16')
    assert 0 < s.budget_fraction <= 1 and s.micro_batch >= 1 and s.accum_steps >= 1 and 1e-5 <= s.lr <= 1e-1
    assert isinstance(s.pin_memory, bool) and isinstance(s.cudnn_benchmark, bool) and isinstance(s.auto_recover_oom, bool)
    assert s.checkpointing in (None, 'auto') or (isinstance(s.checkpointing, int) and s.checkpointing >= 1)
    assert len(s.notes) > 80, "notes explain the choices"
    if s.device == 'cpu':
        assert s.memory_gb is None and s.budget_bytes is None and not s.pin_memory and s.num_workers == 0
    else:
        g = lookup_gpu(s.gpu)
        assert 'memory_gb' not in raw, "memory comes from the catalogue, not the YAML"
        assert s.memory_gb == g.memory_gb and s.budget_bytes == int(g.memory_gb * GB * s.budget_fraction)
        if s.precision == 'bf16': assert g.bf16_native
        if s.precision == 'fp16': assert g.fp16_fast
        if g.memory_gb <= 8 and g.vendor == 'nvidia': assert s.alloc_conf == 'expandable_segments:True'
    for m in s.matches: lookup_gpu(m)
    assert Strategy.from_dict(s.to_dict()) == s


def test_the_issue_s_hardware_is_covered():
    names = set(list_strategies())
    assert len(names) >= 12
    for card in ['Intel HD Graphics 4000', 'Intel UHD Graphics 620', 'Intel Iris Xe Graphics', 'Radeon RX 550', 'Radeon RX 6600',
                 'GeForce GTX 1050 Ti', 'GeForce GTX 1060 6GB', 'GeForce GTX 1660', 'GeForce RTX 2060', 'GeForce RTX 3050 Laptop',
                 'GeForce RTX 3060', 'GeForce RTX 4060 Laptop', 'GeForce RTX 4090', 'Apple M2']:
        s = load_strategy(card)
        assert s.gpu == card, (card, s.name)
    assert 'cpu' in names
    table = strategy_table()
    assert all(f"`{n}`" in table for n in names) and table.count('\n') == len(names) + 1


def test_precision_policy_by_architecture():
    assert load_strategy('gtx_1050_ti').precision == 'fp32'       # Pascal: fp16 at 1/64 rate
    assert load_strategy('gtx_1060_6gb').precision == 'fp32'
    assert load_strategy('rtx_2060').precision == 'fp16'          # Turing: fp16 + GradScaler
    assert load_strategy('gtx_1660').precision == 'fp16'
    assert load_strategy('rtx_3060_12gb').precision == 'bf16'     # Ampere+: bf16
    assert load_strategy('rtx_4090').precision == 'bf16'
    assert load_strategy('amd_rx_550').device == 'cpu'            # gfx803: no ROCm
    assert load_strategy('intel_hd_4000').device == load_strategy('intel_uhd_620').device == 'cpu'
    assert load_strategy('intel_iris_xe').device == 'xpu' and load_strategy('apple_m').device == 'mps'


def test_every_catalogue_gpu_gets_a_consistent_strategy():
    for g in gpu_catalogue():
        s = strategy_for_gpu(g)
        if s.precision == 'bf16': assert g.bf16_native, g.name
        if s.precision == 'fp16': assert g.fp16_fast, g.name
        if s.device != 'cpu': assert s.memory_gb == g.memory_gb, g.name
        assert s.reason


# --- names ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('name,expected', [
    ('gtx_1050_ti', 'gtx_1050_ti'), ('GTX 1050 Ti', 'gtx_1050_ti'), ('1050ti', 'gtx_1050_ti'),
    ('NVIDIA GeForce GTX 1050 Ti', 'gtx_1050_ti'), ('rtx3060', 'rtx_3060_12gb'), ('RTX 3060 12GB', 'rtx_3060_12gb'),
    ('NVIDIA GeForce RTX 4060 Laptop GPU', 'rtx_4060_laptop'), ('rtx 3050 laptop', 'rtx_3050_laptop'),
    ('Intel(R) Iris(R) Xe Graphics', 'intel_iris_xe'), ('uhd 620', 'intel_uhd_620'), ('rx 6600', 'amd_rx_6600'),
    ('Radeon RX 550', 'amd_rx_550'), ('apple', 'apple_m'), ('CPU', 'cpu'), ('4090', 'rtx_4090'),
])
def test_loose_names(name, expected):
    assert load_strategy(name).name == expected


def test_gpus_without_a_profile_get_the_nearest_with_their_own_memory():
    s = load_strategy('GTX 1070')
    assert (s.name, s.gpu, s.memory_gb, s.precision) == ('gtx_1070', 'GeForce GTX 1070', 8, 'fp32')
    assert 'gtx_1060_6gb' in s.reason and 'gtx_1060_6gb' in s.title
    assert load_strategy('rtx 5090').memory_gb == 32 and load_strategy('rtx 5090').precision == 'bf16'
    t4 = load_strategy('tesla t4')
    assert (t4.memory_gb, t4.precision, t4.alloc_conf) == (16, 'fp16', 'expandable_segments:True')  # the Turing profile's
    assert load_strategy('rx 580').device == 'cpu'                       # Polaris, like the RX 550
    assert load_strategy('rx 7900 xtx').precision == 'fp16' and load_strategy('rx 7900 xtx').memory_gb == 24
    assert load_strategy('apple m3 pro').memory_gb == 18


def test_unknown_names_list_the_closest():
    with pytest.raises(UnknownStrategyError, match='rtx_3060_12gb'): load_strategy('rtx_306_12gb')
    with pytest.raises(UnknownStrategyError, match='gtx_1050_ti'): load_strategy('gtx_1505_ti')
    with pytest.raises(UnknownStrategyError, match='intel_hd_4000'): load_strategy('intel_hd_400')
    with pytest.raises(LookupError, match='list_strategies'): load_strategy('Voodoo 3')


def test_overrides_are_validated():
    assert load_strategy('gtx_1050_ti', micro_batch=8).micro_batch == 8
    with pytest.raises(ConfigError, match="strategy.micro_batch"): load_strategy('cpu', micro_bach=8)
    with pytest.raises(ConfigError, match='no native bf16'): load_strategy('gtx_1050_ti', precision='bf16')
    with pytest.raises(ConfigError, match='budget_fraction'): load_strategy('cpu', budget_fraction=0)
    with pytest.raises(ConfigError, match='alloc_conf'): load_strategy('rtx_2060', alloc_conf='expandable segments')
    with pytest.raises(ConfigError, match='lr'): load_strategy('cpu', lr=-1.0)


# --- pick_strategy with faked probes ----------------------------------------------------------------------------

def test_pick_for_a_gtx_1050_ti():
    hw = fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1)))
    if not hw.gpus[0].usable:                          # this machine's PyTorch cannot drive Pascal (or any GPU)
        s = pick_strategy(hw)
        assert s.name == 'cpu' and s.device == 'cpu' and 'for_gpu=True' in s.reason
        r = pick_strategy(hw, for_gpu=True)             # planned for the card, run on the CPU
        assert (r.name, r.gpu, r.memory_gb, r.device, r.precision) == ('gtx_1050_ti', 'GeForce GTX 1050 Ti', 4, 'cpu', 'fp32')
        assert r.budget_bytes == int(4 * GB * 0.8) and r.optimizer == 'adamw8bit' and r.alloc_conf is None
    s = pick_strategy(usable(hw))
    assert (s.name, s.device, s.precision, s.memory_gb) == ('gtx_1050_ti', 'cuda', 'fp32', 4)
    assert s.alloc_conf == 'expandable_segments:True' and s.num_workers <= max(0, (hw.cpu.physical_cores or 1) - 1)


def test_the_1050_ti_keeps_its_8bit_optimizer_state():
    hw = usable(fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1))))
    assert pick_strategy(hw).optimizer == 'adamw8bit'
    assert load_strategy('gtx_1050_ti').optimizer == 'adamw8bit'    # the profile itself describes the card


def test_optimizer_names_are_chapter_01_s():
    from netlite_nb.memory.trace import OPTIMIZERS
    assert {'adamw', 'adamw8bit', 'sgd'} <= set(OPTIMIZERS)          # chapter 03 registered its 8-bit AdamW
    with pytest.raises(ConfigError, match='optimizer must be one of'): load_strategy('cpu', optimizer='lion')
    with pytest.raises(ConfigError, match='checkpointing is null'): Strategy('x', checkpointing=True)


def test_pick_for_an_rtx_3060_uses_the_probed_memory():
    hw = usable(fake_probe(('NVIDIA GeForce RTX 3060', 12 * GB - 200 * 2**20, (8, 6))))
    s = pick_strategy(hw)
    assert (s.name, s.device, s.precision) == ('rtx_3060_12gb', 'cuda', 'bf16')
    assert s.memory_gb == pytest.approx(12 - 200 / 1024) and 'as found' in s.reason


def test_pick_for_a_gpu_without_a_profile():
    hw = usable(fake_probe(('NVIDIA GeForce GTX 1070', 8 * GB, (6, 1))))
    s = pick_strategy(hw)
    assert (s.name, s.memory_gb, s.precision) == ('gtx_1070', 8, 'fp32') and 'gtx_1060_6gb' in s.reason


def test_pick_for_a_gpu_missing_from_the_catalogue():
    hw = usable(fake_probe(('NVIDIA Future GPU 9000', 20 * GB, (10, 0))))
    s = pick_strategy(hw)
    assert s.device == 'cuda' and s.precision == 'bf16' and s.memory_gb == 20 and s.gpu is None


def with_gpu(gpu:GPUInfo, device:str):
    "A probe of this machine as if it had `gpu`, usable through `device` (Apple, Intel XPU and ROCm are found through torch)."
    hw = fake_probe()
    hw.gpus, hw.device = [gpu], device
    return hw


def test_pick_on_apple_silicon_uses_the_metal_limit():
    m2 = GPUInfo(name='Apple M2 Pro', vendor='apple', backend='mps', total_memory=21 * GB, shared_memory=True, catalogue='Apple M2 Pro')
    s = pick_strategy(with_gpu(m2, 'mps'))
    assert (s.name, s.device, s.memory_gb, s.precision, s.pin_memory) == ('apple_m2_pro', 'mps', 21, 'fp32', False)
    m5 = GPUInfo(name='Apple M5', vendor='apple', backend='mps', total_memory=24 * GB, shared_memory=True)   # not in the catalogue
    s = pick_strategy(with_gpu(m5, 'mps'))
    assert (s.name, s.device, s.memory_gb) == ('apple_m5', 'mps', 24) and 'apple_m' in s.reason


def test_pick_on_intel_xpu_and_amd_rocm():
    xe = GPUInfo(name='Intel(R) Iris(R) Xe Graphics', vendor='intel', backend='xpu', total_memory=7 * GB, shared_memory=True,
                 catalogue='Intel Iris Xe Graphics')
    s = pick_strategy(with_gpu(xe, 'xpu:0'))
    assert (s.name, s.device, s.memory_gb, s.budget_fraction) == ('intel_iris_xe', 'xpu', 7, 0.6)
    arc = GPUInfo(name='Intel(R) Arc(TM) A770 Graphics', vendor='intel', backend='xpu', total_memory=16 * GB, catalogue='Intel Arc A770')
    s = pick_strategy(with_gpu(arc, 'xpu:0'))
    assert (s.device, s.precision, s.memory_gb) == ('xpu', 'bf16', 16) and 'intel_arc' in s.reason
    rx = GPUInfo(name='AMD Radeon RX 6600', vendor='amd', backend='cuda', total_memory=8 * GB, fp16_fast=True, bf16_native=False,
                 catalogue='Radeon RX 6600')
    s = pick_strategy(with_gpu(rx, 'cuda:0'))
    assert (s.name, s.device, s.precision) == ('amd_rx_6600', 'cuda', 'fp16')


def test_pick_with_no_gpu():
    hw = fake_probe()
    s = pick_strategy(hw)
    assert (s.name, s.device, s.budget_bytes) == ('cpu', 'cpu', None)
    assert pick_strategy(hw, for_gpu=True).name == 'cpu'


def test_pick_prefers_a_dedicated_card_for_planning():
    hw = fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1)), ('NVIDIA GeForce RTX 3060', 12 * GB, (8, 6)))
    if hw.device == 'cpu': assert pick_strategy(hw, for_gpu=True).name == 'rtx_3060_12gb'


# --- planner sizing, with a stand-in for chapter 01 -------------------------------------------------------------

def checkpoint_k(model, transform):
    "The checkpointing `transform` puts into a copy of `model` (None: none), found the way the planner's trace would meet it."
    if transform is None: return None
    m = transform(copy.deepcopy(model))
    return next((c.k for c in m.modules() if isinstance(c, CheckpointedSequential)), None)


class FakePlanner:
    "Answers like chapter 01: `per_sample` bytes each, a quarter with checkpointing, after `fixed` bytes of weights and state."
    def __init__(self, per_sample, fixed=100 * 2**20):
        self.per_sample, self.fixed, self.calls = per_sample, fixed, []
    def max_batch_size(self, model, sample, budget=None, device_or_gpu=None, max_batch=2**16, loss_fn=None, optimizer='adamw',
                       precision='fp32', transform=None):
        ck = checkpoint_k(model, transform)
        self.calls.append(dict(budget=budget, precision=precision, optimizer=optimizer, checkpointing=ck, device=device_or_gpu,
                               transform=getattr(transform, '__name__', None)))
        n = (budget - self.fixed) // (self.per_sample // (4 if ck else 1))
        if n < 1: raise BudgetTooSmallError(f"Even a batch of 1 needs more than {budget} bytes. What would fit: bf16")
        return min(n, max_batch)
    def plan_memory(self, model, batch, loss_fn=None, optimizer='adamw', precision='fp32', micro_batch=None, device_or_gpu=None,
                    budget=None, transform=None):
        return types.SimpleNamespace(batch_size=batch[0].shape[0], micro_batch=micro_batch, checkpointing=checkpoint_k(model, transform),
                                     precision=precision, transform=getattr(transform, '__name__', None))


@pytest.fixture
def planner(monkeypatch):
    def install(per_sample, **kw):
        fake = FakePlanner(per_sample, **kw)
        monkeypatch.setattr(S, 'max_batch_size', fake.max_batch_size)
        monkeypatch.setattr(S, 'plan_memory', fake.plan_memory)
        return fake
    return install


MODEL = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))   # modules to checkpoint
SAMPLE = (torch.randn(2, 4), torch.tensor([0, 1]))


def test_planner_raises_the_micro_batch_when_the_model_is_small(planner):
    fake = planner(per_sample=2**20)
    hw = usable(fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1))))
    s = pick_strategy(hw, model=MODEL, sample=SAMPLE)
    assert (s.micro_batch, s.accum_steps, s.checkpointing) == (128, 1, None)   # profile said 32 x 4; 128 fits
    assert fake.calls[0]['budget'] == int(4 * GB * 0.8) and fake.calls[0]['optimizer'] == 'adamw8bit'
    assert isinstance(fake.calls[0]['device'], GPUInfo) and (s.plan.micro_batch, s.plan.batch_size) == (128, 128)


def test_planner_splits_into_accumulation_when_memory_is_short(planner):
    planner(per_sample=100 * 2**20)                      # 3.2 GiB - 100 MiB -> 31 samples
    hw = usable(fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1))))
    s = pick_strategy(hw, model=MODEL, sample=SAMPLE)
    assert s.micro_batch <= 31 and s.micro_batch * s.accum_steps == 128 and (s.micro_batch, s.accum_steps) == (16, 8)
    assert s.checkpointing is None and 'micro-batch 16 × 8' in s.reason and s.plan.batch_size == 128
    s = pick_strategy(hw, model=MODEL, sample=SAMPLE, batch_size=96)
    assert s.micro_batch * s.accum_steps == 96 and s.micro_batch <= 31


def test_planner_turns_on_checkpointing_only_when_needed(planner):
    fake = planner(per_sample=700 * 2**20)               # 4 without checkpointing, 18 with it
    hw = usable(fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1))))
    s = pick_strategy(hw, model=MODEL, sample=SAMPLE)
    assert s.checkpointing == 1 and s.micro_batch <= 18 and s.micro_batch * s.accum_steps == 128
    assert [c['checkpointing'] for c in fake.calls] == [None, 1] and 'checkpointing is on' in s.reason
    s = pick_strategy(hw, model=MODEL, sample=SAMPLE, min_micro_batch=4)
    assert s.checkpointing is None and s.micro_batch == 4 and s.accum_steps == 32


def test_the_plan_traces_the_model_as_the_run_will_change_it(planner):
    fake = planner(per_sample=700 * 2**20)
    hw = usable(fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1))))
    s = pick_strategy(hw, model=MODEL, sample=SAMPLE)
    assert s.plan.checkpointing == 1 and s.plan.transform == s.model_transform().__name__
    assert s.plan.transform == 'activation checkpointing (1 module per segment) + chunked FFN (1024 rows)'
    assert [c['transform'] for c in fake.calls] == ['chunked FFN (1024 rows)', s.plan.transform]   # the profile's chunking, every time
    fake.calls.clear()
    s = pick_strategy(hw, model=MODEL, sample=SAMPLE, min_micro_batch=4)
    assert s.plan.checkpointing is None and s.plan.transform == 'chunked FFN (1024 rows)'
    fixed = load_strategy('cpu', checkpointing=2)                   # a number: planned with it, never switched off
    fake.calls.clear()
    s = pick_strategy(fake_probe(), model=MODEL, sample=SAMPLE, budget=8 * GB)
    assert s.checkpointing is None and fake.calls[0]['transform'] is None          # the cpu profile changes nothing
    assert S._size_with_planner(fixed, MODEL, SAMPLE, fake_probe(), 'cpu', 'fp32', None, 128, 2**30, 8).plan.checkpointing == 2


def test_when_nothing_fits_the_planner_s_error_explains(planner):
    planner(per_sample=16 * GB)                          # not one sample, even checkpointed
    hw = usable(fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1))))
    with pytest.raises(ValueError, match='What would fit'): pick_strategy(hw, model=MODEL, sample=SAMPLE)


def test_a_model_without_blocks_is_not_checkpointed(planner):
    fake = planner(per_sample=700 * 2**20)
    hw = usable(fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1))))
    s = pick_strategy(hw, model=torch.nn.Linear(4, 2), sample=SAMPLE)   # convert_model finds no nn.Sequential to checkpoint
    assert s.checkpointing is None and (s.micro_batch, s.accum_steps) == (4, 32)
    assert [c['checkpointing'] for c in fake.calls] == [None, None]


def test_planner_on_the_cpu_uses_available_ram(planner):
    fake = planner(per_sample=2**20)
    hw = fake_probe()
    s = pick_strategy(hw, model=MODEL, sample=SAMPLE)
    assert fake.calls[0]['budget'] == int(hw.memory.available * 0.5) and fake.calls[0]['device'] == 'cpu'
    assert (s.micro_batch, s.accum_steps) == (128, 1)


def test_rehearsal_plans_with_the_card_s_precision(planner):
    fake = planner(per_sample=2**20)
    hw = fake_probe(('NVIDIA GeForce RTX 3060', 12 * GB, (8, 6)))
    if hw.device != 'cpu': pytest.skip('this PyTorch drives the card')
    s = pick_strategy(hw, model=MODEL, sample=SAMPLE, for_gpu=True)
    assert fake.calls[0]['precision'] == 'bf16' and s.precision == 'fp32' and s.device == 'cpu'


# --- what a strategy changes in the run -------------------------------------------------------------------------

def ffn_net():
    nn = torch.nn
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)),
                         nn.Dropout(0.1), nn.Linear(32, 10))


def test_model_transform_applies_checkpointing_and_chunking_only():
    t = load_strategy('gtx_1050_ti', checkpointing=2).model_transform()
    assert t.__name__ == 'activation checkpointing (2 modules per segment) + chunked FFN (1024 rows)'
    m = t(ffn_net())
    assert type(m) is CheckpointedSequential and m.k == 2
    assert type(m[2]) is ChunkedFFN and m[2].chunk_size == 1024
    assert type(m[1]) is torch.nn.ReLU and type(m[3]) is torch.nn.Dropout     # bit-packing is the user's choice, not the card's
    assert list(m.state_dict()) == list(ffn_net().state_dict())
    assert load_strategy('cpu', checkpointing=3).model_transform().keywords == dict(
        relu=False, ffn=False, dropout=False, checkpoint=3, chunk_size=None)   # what chapter 07's recovery applies, with k
    assert [type(c) for c in load_strategy('rtx_2060').model_transform()(ffn_net())] == \
           [torch.nn.Linear, torch.nn.ReLU, ChunkedFFN, torch.nn.Dropout, torch.nn.Linear]   # 'auto' undecided: chunking only


def test_model_transform_is_none_when_nothing_changes():
    for name in list_strategies():
        s = load_strategy(name)
        assert (s.model_transform() is None) == (s.chunk_size is None), name      # 'auto' or null checkpointing adds nothing yet
    assert load_strategy('cpu').model_transform() is None
    assert load_strategy('cpu', checkpointing=1).model_transform().__name__ == 'activation checkpointing (1 module per segment)'


@pytest.fixture
def cuda(monkeypatch):
    "This process as if CUDA were available (started or not); what reaches the allocator is recorded, the environment restored after."
    def install(available=True, started=False, environ=None):
        calls = []
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: available)
        monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: started)
        monkeypatch.setattr(torch._C, '_accelerator_setAllocatorSettings', calls.append, raising=False)
        for v in S._ALLOC_ENV: os.environ.pop(v, None)
        os.environ.update(environ or {})
        return calls
    with mock.patch.dict(os.environ): yield install


def test_allocator_settings_before_cuda_starts(cuda):
    calls = cuda(started=False)
    note = apply_allocator_settings(load_strategy('gtx_1050_ti'))
    assert os.environ['PYTORCH_ALLOC_CONF'] == 'expandable_segments:True' and 'PYTORCH_CUDA_ALLOC_CONF' not in os.environ
    assert calls == ['expandable_segments:True'] and 'before CUDA started' in note


def test_allocator_settings_after_cuda_started(cuda):
    calls = cuda(started=True)
    note = apply_allocator_settings(load_strategy('rtx_4060_laptop'))
    assert calls == ['expandable_segments:True'] and 'PYTORCH_ALLOC_CONF' not in os.environ and 'after CUDA had started' in note


def test_the_user_s_allocator_settings_win(cuda):
    calls = cuda(environ={'PYTORCH_ALLOC_CONF': 'max_split_size_mb:64,expandable_segments:False'})
    apply_allocator_settings(load_strategy('gtx_1050_ti'))
    assert os.environ['PYTORCH_ALLOC_CONF'] == calls[0] == 'expandable_segments:False,max_split_size_mb:64'
    calls = cuda(environ={'PYTORCH_CUDA_ALLOC_CONF': 'max_split_size_mb:64'})          # PyTorch prefers the older name when set
    apply_allocator_settings(load_strategy('gtx_1050_ti'))
    assert os.environ['PYTORCH_CUDA_ALLOC_CONF'] == calls[0] == 'expandable_segments:True,max_split_size_mb:64'
    assert 'PYTORCH_ALLOC_CONF' not in os.environ


def test_allocator_settings_never_raise(cuda, monkeypatch):
    calls = cuda(available=False)
    assert 'CUDA is not available' in apply_allocator_settings(load_strategy('gtx_1050_ti')) and calls == []
    assert not set(S._ALLOC_ENV) & set(os.environ)
    cuda()
    def refuse(conf): raise RuntimeError("Allocator backend parsed at runtime != allocator backend parsed at load time")
    monkeypatch.setattr(torch._C, '_accelerator_setAllocatorSettings', refuse, raising=False)
    note = apply_allocator_settings(load_strategy('gtx_1050_ti'))
    assert 'PyTorch refused them' in note and 'parsed at load time' in note and 'PYTORCH_ALLOC_CONF' not in os.environ
    assert 'trains on cpu' in apply_allocator_settings(load_strategy('gtx_1050_ti', device='cpu'))
    assert apply_allocator_settings(load_strategy('rtx_3060_12gb')) == ''          # the profile asks for nothing


@pytest.mark.skipif(not hasattr(torch._C, '_accelerator_getAllocatorSettings'), reason='PyTorch < 2.10 cannot read the settings back')
def test_allocator_settings_reach_this_pytorch(monkeypatch):
    "The private call the settings go through exists in this PyTorch and takes the profile's string (CUDA faked as started)."
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: True)
    before = torch._C._accelerator_getAllocatorSettings()
    try:
        assert 'applied after CUDA had started' in apply_allocator_settings(load_strategy('gtx_1050_ti'))
        assert torch._C._accelerator_getAllocatorSettings() == 'expandable_segments:True'
    finally: torch._C._accelerator_setAllocatorSettings(before)


# --- run configurations -----------------------------------------------------------------------------------------

def test_defaults_and_merge_over_the_strategy():
    cfg = load_config({'strategy': 'gtx_1050_ti'})
    assert isinstance(cfg, RunConfig)
    assert (cfg.model.name, cfg.data.name, cfg.data.batch_size, cfg.optim.name, cfg.optim.lr) == ('netlite_tiny', 'mnist_sample', 128, 'adamw8bit', 1e-3)
    cfg = load_config({'strategy': {'name': 'gtx_1050_ti', 'micro_batch': 16}, 'optim': {'name': 'adamw', 'lr': 0.002}})
    assert (cfg.strategy.micro_batch, cfg.strategy.accum_steps, cfg.data.batch_size) == (16, 8, 128)   # same effective batch
    assert (cfg.strategy.optimizer, cfg.strategy.lr) == ('adamw', 0.002)                               # the strategy follows optim
    cfg = load_config({'strategy': {'name': 'gtx_1050_ti', 'micro_batch': 16, 'accum_steps': 2}})
    assert cfg.data.batch_size == 32


def test_dotted_overrides():
    cfg = load_config({'strategy': 'rtx_3060_12gb', 'train': {'epochs': 2}},
                      overrides=['data.batch_size=64', 'train.epochs=7', 'train.ema=0.999', 'optim.lr=3e-4',
                                 'model.kwargs.width=32', 'export.quantize=int8', 'train.grad_clip=null', 'data.augment=true'])
    assert (cfg.data.batch_size, cfg.strategy.micro_batch, cfg.strategy.accum_steps) == (64, 64, 1)
    assert (cfg.train.epochs, cfg.train.ema, cfg.optim.lr, cfg.train.grad_clip, cfg.data.augment) == (7, 0.999, 3e-4, None, True)
    assert cfg.model.kwargs == {'width': 32} and cfg.export.quantize == 'int8'
    cfg = load_config({'strategy': 'rtx_3060_12gb'}, overrides=['strategy=gtx_1050_ti', 'strategy.micro_batch=8'])
    assert (cfg.strategy.name, cfg.strategy.micro_batch, cfg.strategy.accum_steps) == ('gtx_1050_ti', 8, 16)
    assert load_config(None, ['strategy=cpu', 'data.batch_size=100']).strategy.micro_batch * \
           load_config(None, ['strategy=cpu', 'data.batch_size=100']).strategy.accum_steps == 100


@pytest.mark.parametrize('cfg,overrides,message', [
    ({'strategy': 'cpu', 'data': {'batchsize': 64}}, [], "Did you mean 'data.batch_size'"),
    ({'strategy': 'cpu', 'optimizer': {'lr': 1}}, [], "Did you mean 'optim'"),
    ({'strategy': {'name': 'cpu', 'precison': 'bf16'}}, [], "Did you mean 'strategy.precision'"),
    ({'strategy': 'cpu'}, ['train.epoch=3'], "Did you mean 'train.epochs'"),
    ({'strategy': 'cpu'}, ['schedule.warmpu=10'], "Did you mean 'schedule.warmup'"),
    ({'strategy': 'cpu', 'train': {'epochs': 'three'}}, [], 'train.epochs must be int'),
    ({'strategy': 'cpu', 'data': {'name': 'imagenet'}}, [], 'data.name must be one of'),
    ({'strategy': 'cpu', 'data': {'name': 'folder'}}, [], 'data.root'),
    ({'strategy': 'cpu', 'train': {'epochs': None}}, [], 'train.epochs or train.steps'),
    ({'strategy': 'cpu', 'train': {'ema': 1.5}}, [], 'train.ema'),
    ({'strategy': 'cpu', 'export': {'quantize': 'int4'}}, [], 'export.quantize'),
    ({'strategy': 'cpu'}, ['data.batch_size'], 'key=value'),
    ({'strategy': 'cpu'}, ['data.batch_size.x=1'], 'is a value, not a section'),
    ({'strategy': 'gtx_1050_ti'}, ['strategy.precision=bf16'], 'no native bf16'),
])
def test_bad_configurations(cfg, overrides, message):
    with pytest.raises(ConfigError, match=message.replace('(', r'\(').replace('.', r'\.')): load_config(cfg, overrides)


def test_unknown_strategy_in_a_config():
    with pytest.raises(UnknownStrategyError, match='gtx_1050_ti'): load_config({'strategy': 'gtx_1505_ti'})


def test_auto_uses_the_given_probe():
    cfg = load_config({'strategy': 'auto'}, hw=fake_probe())
    assert cfg.strategy.name == 'cpu' and 'CPU' in cfg.strategy.reason


def test_round_trip(tmp_path):
    src = tmp_path / 'run.yaml'
    src.write_text("strategy: {name: rtx_4060_laptop, micro_batch: 32}\nmodel: {name: resnet, kwargs: {width: 16}}\n"
                   "data: {name: cifar10, root: data, augment: true}\ntrain: {epochs: 10, early_stopping: 3}\n")
    cfg = load_config(src, overrides=['optim.weight_decay=0.05'])
    out = save_config(cfg, tmp_path / 'runs' / 'resolved.yaml')
    again = load_config(out)
    assert again == cfg and again.to_dict() == cfg.to_dict()
    assert yaml.safe_load(out.read_text())['strategy']['micro_batch'] == 32
    assert (again.strategy.accum_steps, again.data.batch_size, again.optim.weight_decay) == (4, 128, 0.05)
    derived = load_config({'strategy': 'gtx 1070'})              # a derived strategy round-trips by its name too
    assert load_config(save_config(derived, tmp_path / 'd.yaml')) == derived


def test_save_config_writes_plain_mappings_atomically(tmp_path, monkeypatch):
    path = save_config({'run': {'strategy': 'cpu'}, 'micro_batch': 32}, tmp_path / 'config.yaml')
    assert yaml.safe_load(path.read_text()) == {'run': {'strategy': 'cpu'}, 'micro_batch': 32}
    import netlite_nb.strategies as S
    def crash(src, dst): raise KeyboardInterrupt
    monkeypatch.setattr(S.os, 'replace', crash)
    with pytest.raises(KeyboardInterrupt): save_config({'micro_batch': 64}, path)
    assert yaml.safe_load(path.read_text())['micro_batch'] == 32            # the previous file is intact
    with pytest.raises(TypeError): save_config(['not', 'a', 'config'], tmp_path / 'x.yaml')


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match='No run configuration'): load_config(tmp_path / 'nope.yaml')


def test_with_chapter_01_s_planner():
    "Cross-chapter: the real planner sizes a CNN for the 1050 Ti; the fake above checks the logic alone."
    from netlite_nb import budget
    nn = torch.nn
    block = lambda: nn.Sequential(nn.Conv2d(128, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU())
    cnn = nn.Sequential(nn.Conv2d(3, 128, 3, padding=1), nn.ReLU(), *[block() for _ in range(8)],
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    sample = (torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,)))
    hw = fake_probe(('NVIDIA GeForce GTX 1050 Ti', 4 * GB, (6, 1)))
    s = pick_strategy(hw, model=cnn, sample=sample, for_gpu=True)
    assert s.effective_batch == 128 and 1 < s.accum_steps and s.plan is not None
    assert s.plan.fits and s.plan.total <= s.budget_bytes and s.plan.micro_batch == s.micro_batch
    m = 4 * s.micro_batch          # split_batch keeps micro-batches above half of what fits, so 4x cannot fit
    bigger = budget.plan_memory(cnn, (torch.empty(m, 3, 64, 64, device='meta'), torch.empty(m, dtype=torch.long, device='meta')),
                                optimizer=s.optimizer, device_or_gpu=hw.gpus[0], budget=s.budget_bytes, transform=s.model_transform())
    assert not bigger.fits


def test_an_unknown_strategy_names_the_python_and_the_cli_lists():
    with pytest.raises(UnknownStrategyError) as e: load_strategy('Voodoo 3')
    msg = str(e.value)
    assert 'list_strategies()' in msg and '`netlite train --list-strategies`' in msg and '`netlite plan --gpu list`' in msg
    assert e.value.query == 'Voodoo 3'
    with pytest.raises(UnknownStrategyError) as e: load_strategy('rtx_306_12gb')
    assert 'rtx_3060_12gb' in e.value.hint and e.value.hint in str(e.value)


def test_lora_bias_is_a_config_key_and_is_checked():
    from netlite_nb.strategies import load_config
    base = {'model': {'name': 'mlp'}, 'data': {'name': 'mnist_sample'}, 'train': {'epochs': 1}}
    assert load_config({**base, 'lora': {'bias': 'lora_only'}}).lora.bias == 'lora_only'
    assert load_config(base).lora.bias == 'none'
    with pytest.raises(ConfigError, match="Did you mean 'all'"): load_config({**base, 'lora': {'bias': 'al'}})
    assert load_config({**base, 'lora': {'base_bits': 4, 'quant_type': 'fp4'}}).lora.base_bits == 4
    for bad, says in (({'base_bits': 3}, 'base_bits must be 4, 8 or null'), ({'quant_type': 'int4'}, "quant_type 'nf4' or 'fp4'"),
                      ({'double_quant': 'yes'}, 'double_quant must be bool')):
        with pytest.raises(ConfigError, match=says): load_config({**base, 'lora': bad})


@pytest.mark.parametrize('value, match', [('activation', "Did you mean 'activations'"), (['activations', 'optimizer'], "'optimizer'"), (3, 'train.offload must be list or str or null')])
def test_run_config_offload_key_is_checked(value, match):
    with pytest.raises(ConfigError, match=match): load_config({'train': {'offload': value}})


def test_run_config_offload_key_takes_names_and_lists():
    assert load_config({'train': {'offload': 'activations'}}).train.offload == 'activations'
    assert load_config({'train': {'offload': ['fp16-weights', 'activations']}}).train.offload == ['fp16-weights', 'activations']
    assert load_config({}).train.offload == 'auto'                    # `strategy: auto`: the planner may add one when it sizes the run
    assert load_config({'strategy': 'cpu'}).train.offload is None     # no sizing, so 'auto' resolves to none at once
    assert load_config({'train': {'offload': 'none'}}).train.offload is None


# --- host offload chosen by the planner when nothing else fits (chapter 03a's levers) ------------------------------

def _too_big(d=1024):
    "Shapes only: two wide layers whose AdamW step, at one sample, is planned just over the budget below."
    with torch.device('meta'):
        return torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, 10))

BIG_SAMPLE = (torch.empty(2, 1024, device='meta'), torch.empty(2, dtype=torch.long, device='meta'))


@pytest.fixture(scope='module')
def gtx_1060():
    "A machine whose PyTorch drives a GTX 1060 6GB (profile: fp32, AdamW, `offload: auto`), and a budget one sample does not fit without offload."
    from netlite_nb.budget import plan_memory
    hw = usable(fake_probe(('NVIDIA GeForce GTX 1060 6GB', 6 * GB, (6, 1))))
    one = plan_memory(_too_big(), BIG_SAMPLE, optimizer='adamw', device_or_gpu=hw.gpus[0])
    return hw, int(one.total * 0.97)


def _offload_of(c):
    "(optimizer, train.offload names) of a `fit_to_budget` change, when it uses a chapter 03a offload."
    from netlite_nb.offload import IN_BACKWARD, OFFLOADS, STATE_OFFLOADED
    names = [n for n, f in OFFLOADS.items() if f.__name__ in (c.new_plan.transform or '')]
    opt = c.new_plan.optimizer
    return (opt, names) if names or opt.replace('_', '-') in STATE_OFFLOADED | IN_BACKWARD else None


def test_pick_strategy_takes_the_cheapest_offload_that_fits_when_nothing_else_does(gtx_1060):
    from netlite_nb.budget import fit_to_budget, plan_memory
    from netlite_nb.memory.trace import resize_batch
    hw, budget = gtx_1060
    s = pick_strategy(hw, model=_too_big(), sample=BIG_SAMPLE, batch_size=16, budget=budget)
    assert s.name == 'gtx_1060_6gb' and s.plan.fits and s.plan.total <= budget and s.effective_batch == 16
    assert 'without host offload' in s.reason and 'offload=None' in s.reason
    ranked = [o for c in fit_to_budget(_too_big(), resize_batch(BIG_SAMPLE, 16), budget=budget, device_or_gpu=hw.gpus[0], optimizer='adamw')
              if c.fits and (o := _offload_of(c))]
    assert ranked and (s.optimizer, s.offload) == ranked[0]          # fit_to_budget's first (cheapest) offload that fits
    from netlite_nb.offload import OFFLOADS
    assert s.plan.optimizer == s.optimizer and all(OFFLOADS[n].__name__ in s.plan.transform for n in s.offload)  # planned as the run trains
    clipped = pick_strategy(hw, model=_too_big(), sample=BIG_SAMPLE, batch_size=16, budget=budget, clip_grad=1.0)
    assert clipped.plan.fits and not clipped.optimizer.endswith('-in-backward')   # a global clip needs every gradient at once
    with pytest.raises(BudgetTooSmallError): pick_strategy(hw, model=_too_big(), sample=BIG_SAMPLE, batch_size=16, budget=budget, offload=None)
    assert pick_strategy(hw, model=_too_big(), sample=BIG_SAMPLE, batch_size=16, budget=8 * budget).offload == 'auto'  # fits: none taken


def test_a_run_config_takes_host_offload_records_it_and_can_forbid_it(gtx_1060, tmp_path):
    hw, budget = gtx_1060
    raw = {'strategy': {'name': 'auto', 'budget_fraction': budget / (6 * GB)}, 'data': {'batch_size': 16}}
    cfg = S.size_config(load_config(raw, hw=hw), _too_big(), BIG_SAMPLE, hw=hw)
    s, t = cfg.strategy, cfg.train
    assert t.grad_clip == 1.0 and s.plan.fits and not cfg.optim.name.endswith('-in-backward')   # the default clip rules it out
    assert cfg.optim.name == s.optimizer and cfg.optim.name.startswith('adamw') and cfg.optim.name != 'adamw'
    assert t.offload == (s.offload or None) and 'without host offload' in s.reason
    saved = yaml.safe_load(open(save_config(cfg, tmp_path / 'config.yaml')))
    assert saved['optim']['name'] == cfg.optim.name and saved['train']['offload'] == t.offload and 'host offload' in saved['strategy']['reason']
    again = load_config(tmp_path / 'config.yaml', hw=hw)             # the resolved file trains as it was sized, without re-planning
    assert (again.optim.name, again.train.offload, again.size_for_model) == (cfg.optim.name, t.offload, False)
    for forbid in ({'offload': 'none'}, {'offload': None}):
        with pytest.raises(BudgetTooSmallError):
            S.size_config(load_config({**raw, 'train': forbid}, hw=hw), _too_big(), BIG_SAMPLE, hw=hw)
