"Chapter 00 checks that need fakes or a subprocess: NVML answers for cards this machine does not have, nvidia-smi CSV, the CLI."
import json, re, shutil, subprocess, sys
from pathlib import Path
import pynvml, pytest, torch
from netlite_nb.probe import (FakeNVML, HardwareProfile, UnknownGPUError, parse_smi_csv, words_of, device_memory, gpu_catalogue,
                              lookup_gpu, probe)

FIXTURES = Path(__file__).parent / 'fixtures'
no_smi = dict(smi_which=lambda name: None)  # keep the real machine's nvidia-smi (if any) out of faked probes


def test_real_probe_is_cpu_only_here_and_creates_no_context():
    hw = probe()
    if not torch.cuda.is_available():
        assert hw.device == 'cpu' and 'CPU' in hw.reason
    assert not torch.cuda.is_initialized()
    json.loads(hw.to_json())


def test_gtx_1050_ti_through_nvml():
    hw = probe(nvml=FakeNVML([('NVIDIA GeForce GTX 1050 Ti', 4 * 2**30, (6, 1))], driver='560.94', cuda=12060), **no_smi)
    (g,) = hw.gpus
    assert (g.name, g.total_memory, g.compute_capability) == ('NVIDIA GeForce GTX 1050 Ti', 4 * 2**30, '6.1')
    assert g.fp16_fast is False and g.bf16_native is False          # Pascal: fp16 at 1/64 rate, bf16 emulated
    assert (g.driver_version, g.runtime_version, g.source) == ('560.94', '12.6', 'nvml')
    assert g.catalogue == 'GeForce GTX 1050 Ti' and g.arch == 'Pascal'
    if not torch.version.cuda or not torch.cuda.is_available():
        assert hw.device == 'cpu' and not g.usable and hw.notes    # this torch cannot drive it: the reason is recorded


def test_rtx_3060_bf16_native():
    hw = probe(nvml=FakeNVML([('NVIDIA GeForce RTX 3060', 12 * 2**30, (8, 6))]), **no_smi)
    (g,) = hw.gpus
    assert g.bf16_native is True and g.fp16_fast is True and g.compute_capability == '8.6'
    assert g.total_memory == 12 * 2**30 and g.free_memory == 12 * 2**30 - 300 * 2**20
    text, html = str(hw), hw._repr_html_()
    assert 'RTX 3060' in text and 'native bf16 yes' in text and '<table>' in html


def test_nvml_library_not_found_is_a_reason_not_an_exception():
    err = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    hw = probe(nvml=FakeNVML([], fail={'init': err}), **no_smi)
    assert hw.gpus == [] and hw.device == 'cpu'
    assert any('NVML unavailable' in n and 'LibraryNotFound' in n for n in hw.notes)


def test_wsl_not_supported_fields_fall_back_to_the_catalogue():
    err = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake = FakeNVML([('NVIDIA GeForce RTX 4060 Laptop GPU', 8 * 2**30, (8, 9))], fail={'memory': err, 'cuda': err})
    hw = probe(nvml=fake, **no_smi)
    (g,) = hw.gpus
    assert g.total_memory == lookup_gpu('RTX 4060 Laptop').memory_bytes and g.free_memory is None
    assert g.runtime_version is None and g.compute_capability == '8.9'
    assert any('NotSupported' in n for n in hw.notes) and any('catalogue' in n for n in hw.notes)


def test_no_permission_on_one_device_keeps_the_others():
    class Partial(FakeNVML):
        def nvmlDeviceGetHandleByIndex(self, i):
            if i == 0: raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
            return i
    hw = probe(nvml=Partial([('x', 1, (6, 1)), ('NVIDIA GeForce GTX 1060 6GB', 6 * 2**30, (6, 1))]), **no_smi)
    assert [g.name for g in hw.gpus] == ['NVIDIA GeForce GTX 1060 6GB']
    assert any('NoPermission' in n for n in hw.notes)


def test_nvidia_smi_fallback_from_captured_csv():
    text = (FIXTURES / 'nvidia_smi_query.csv').read_text()
    gpus = parse_smi_csv(text)
    assert [g.name for g in gpus] == ['NVIDIA GeForce GTX 1050 Ti', 'NVIDIA GeForce RTX 3060']
    assert gpus[0].total_memory == 4096 * 2**20 and gpus[0].compute_capability == '6.1' and not gpus[0].fp16_fast
    assert gpus[1].bf16_native and gpus[1].free_memory == 11815 * 2**20 and gpus[1].driver_version == '560.35.03'

    err = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    ran = []
    def run(cmd, **kw):
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=text, stderr='')
    hw = probe(nvml=FakeNVML([], fail={'init': err}), smi_run=run, smi_which=lambda n: '/usr/bin/nvidia-smi')
    assert ran and ran[0][0] == 'nvidia-smi' and [g.source for g in hw.gpus] == ['nvidia-smi'] * 2


def test_nvidia_smi_failure_is_recorded():
    err = pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    run = lambda cmd, **kw: subprocess.CompletedProcess(cmd, 9, stdout='', stderr='NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.')
    hw = probe(nvml=FakeNVML([], fail={'init': err}), smi_run=run, smi_which=lambda n: '/usr/bin/nvidia-smi')
    assert hw.gpus == [] and any('could not communicate' in n for n in hw.notes)


@pytest.mark.parametrize('query,name', [('1050 ti', 'GeForce GTX 1050 Ti'), ('GTX 1050', 'GeForce GTX 1050'),
    ('rtx 2060', 'GeForce RTX 2060'), ('NVIDIA GeForce RTX 3050 Laptop GPU', 'GeForce RTX 3050 Laptop'),
    ('RX 550', 'Radeon RX 550'), ('intel uhd 620', 'Intel UHD Graphics 620'), ('Apple M4', 'Apple M4')])
def test_catalogue_lookup(query, name):
    assert lookup_gpu(query).name == name


def smi_name(g)->str:
    "The name the vendor's own tools print for catalogue entry `g` (nvidia-smi/NVML, ROCm, the Intel driver, macOS)."
    n = g.name
    if g.vendor == 'nvidia':
        n = re.sub(r' Laptop$', ' Laptop GPU', n)           # 'NVIDIA GeForce RTX 4060 Laptop GPU'
        n = n.replace('RTX 5060 Ti 16GB', 'RTX 5060 Ti')    # the 8 GB and the 16 GB board share one name ('GTX 1060 6GB' keeps it)
        return n if n.startswith('Tesla') else f'NVIDIA {n}'  # data-centre cards print without the vendor: 'Tesla T4'
    if g.vendor == 'amd': return f'AMD {n}'                 # 'AMD Radeon RX 6600'
    if g.vendor == 'intel':                                 # 'Intel(R) Iris(R) Xe Graphics', 'Intel(R) Arc(TM) A770 Graphics'
        n = n.replace('Intel ', 'Intel(R) ').replace('Iris ', 'Iris(R) ')
        return re.sub(r'Arc (\w+)$', r'Arc(TM) \1 Graphics', n)
    return n                                                # 'Apple M2 Pro'


def short_forms(g)->set[str]:
    "How people write `g`: without vendor words ('rtx 2080 ti'), without the series ('2080 ti'), run together ('rtx2080ti')."
    w = words_of(g.name)
    spaced = ' '.join(w)
    return {spaced, ' '.join(x for x in w if x not in {'gtx', 'rtx', 'rx', 'arc', 'tesla'}), re.sub(r'(?<=[a-z]) (?=\d)|(?<=\d) (?=[a-z])', '', spaced)}


@pytest.mark.parametrize('g', gpu_catalogue(), ids=lambda g: g.name)
def test_every_catalogue_entry_is_found_by_its_names(g):
    for q in [g.name, smi_name(g), *short_forms(g)]:
        assert lookup_gpu(q) == g, (q, lookup_gpu(q).name)


def test_vendor_names_as_printed():
    names = {g.name: smi_name(g) for g in gpu_catalogue()}
    assert names['GeForce RTX 2080'] == 'NVIDIA GeForce RTX 2080' and names['GeForce GTX 1050 Ti'] == 'NVIDIA GeForce GTX 1050 Ti'
    assert names['Radeon RX 6600'] == 'AMD Radeon RX 6600' and names['Intel Iris Xe Graphics'] == 'Intel(R) Iris(R) Xe Graphics'
    assert names['Intel Arc A770'] == 'Intel(R) Arc(TM) A770 Graphics' and names['Apple M2 Pro'] == 'Apple M2 Pro'
    assert names['GeForce RTX 3050 Laptop'] == 'NVIDIA GeForce RTX 3050 Laptop GPU' and names['Tesla T4'] == 'Tesla T4'


@pytest.mark.parametrize('query,name', [('NVIDIA GeForce RTX 2080', 'GeForce RTX 2080'), ('2080', 'GeForce RTX 2080'),
    ('rtx 2080', 'GeForce RTX 2080'), ('2080 ti', 'GeForce RTX 2080 Ti'), ('1050 ti', 'GeForce GTX 1050 Ti'), ('t4', 'Tesla T4'),
    ('m2 pro', 'Apple M2 Pro'), ('iris xe', 'Intel Iris Xe Graphics'), ('a770', 'Intel Arc A770'), ('7900 xtx', 'Radeon RX 7900 XTX'),
    ('RTX 5060 Ti', 'GeForce RTX 5060 Ti 16GB'), ('GTX 1060 3GB', 'GeForce GTX 1060 3GB')])
def test_common_short_forms(query, name):
    assert lookup_gpu(query).name == name


@pytest.mark.parametrize('query,cards', [
    ('GTX 1060', ('GeForce GTX 1060 3GB', 'GeForce GTX 1060 6GB')),              # the one name the catalogue has twice
    ('NVIDIA GeForce GTX 1060', ('GeForce GTX 1060 3GB', 'GeForce GTX 1060 6GB')),
    ('1060', ('GeForce GTX 1060 3GB', 'GeForce GTX 1060 6GB'))])
def test_genuinely_ambiguous_names_say_which(query, cards):
    with pytest.raises(UnknownGPUError, match='ambiguous') as e:
        lookup_gpu(query)
    assert e.value.ambiguous and e.value.closest == cards


@pytest.mark.parametrize('query', ['RTX 2080 Super', 'RTX 4070 Super', 'RTX 3080 Ti', 'RX 6800', 'RTX 3060 8GB', 'Apple M2 Max'])
def test_a_word_of_the_name_is_never_implied(query):
    "A card the catalogue lacks is not its bigger sibling: an RTX 2080 Super is no RTX 2080, an RX 6800 no RX 6800 XT."
    with pytest.raises(UnknownGPUError, match='not in the catalogue') as e:
        lookup_gpu(query)
    assert not e.value.ambiguous and e.value.closest


def test_nvml_names_an_rtx_2080_as_itself():
    hw = probe(nvml=FakeNVML([('NVIDIA GeForce RTX 2080', 8 * 2**30, (7, 5))]), **no_smi)
    assert hw.gpus[0].catalogue == 'GeForce RTX 2080'


def test_unknown_gpu_lists_closest():
    with pytest.raises(UnknownGPUError, match='Closest: .*GeForce GTX 1080'):
        lookup_gpu('GTX 1080 Super')


def test_profile_json_round_trip():
    hw = probe(nvml=FakeNVML([('NVIDIA GeForce RTX 3060', 12 * 2**30, (8, 6))]), **no_smi)
    assert HardwareProfile.from_dict(json.loads(hw.to_json())) == hw


def test_device_memory_cpu():
    r = device_memory('cpu')
    assert r.used > 0 and r.peak_used >= r.used // 2 and r.total > r.used and r.current == r.used


def test_cli_probe_json_in_a_fresh_process():
    exe = shutil.which('netlite')
    assert exe, 'the `netlite` console script is not installed: pip install -e .'
    out = subprocess.run([exe, 'probe', '--json'], capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    assert d['device'] and d['cpu']['threads'] >= 1


def _touched_mapping(n:int):
    "`n` bytes of fresh anonymous memory with every page written: resident for sure (malloc might reuse freed memory instead)."
    import mmap
    m = mmap.mmap(-1, n)
    for i in range(0, n, mmap.PAGESIZE): m[i] = 1
    return m


def test_cpu_rss_reading_agrees_with_psutil_and_follows_allocations():
    import psutil
    from netlite_nb.probe import process_rss, device_memory
    assert abs(process_rss() - psutil.Process().memory_info().rss) < 2**20
    before = device_memory('cpu').used
    block = _touched_mapping(64 * 2**20)
    after = device_memory('cpu').used
    assert after - before >= 60 * 2**20, (before, after)
    block.close()


def test_cpu_rss_reading_in_a_forked_child_is_the_childs():
    import multiprocessing as mp, os
    from netlite_nb.probe import process_rss
    process_rss()                                            # the parent opens its /proc/self/statm first
    with mp.get_context('fork').Pool(1) as pool: pid, reopened_for, rss, psutil_rss = pool.apply(_child_reading)
    assert pid != os.getpid() and reopened_for == pid
    assert abs(rss - psutil_rss) < 2**20, (rss, psutil_rss)   # the parent's file would miss the child's 128 MiB


def _child_reading():
    import os, psutil
    from netlite_nb.probe import process_rss, PROCESS
    block = _touched_mapping(128 * 2**20)             # only the child holds this
    return os.getpid(), PROCESS['pid'] if process_rss() else None, process_rss(), psutil.Process().memory_info().rss


def _readme_lines():
    "The install line of each row of the README's 'Which PyTorch for your hardware' table, by the row's first words."
    rows = [l for l in (Path(__file__).parent.parent / 'README.md').read_text().splitlines() if l.startswith('| ')]
    return {r.split('|')[1].strip()[:14]: r.split('|')[2] for r in rows}


@pytest.mark.parametrize('card,cuda,system,expect', [
    ('GTX 1050 Ti', '13.0', 'Linux', 'NVIDIA Pascal:'), ('GTX 1050 Ti', None, 'Windows', 'NVIDIA Pascal:'),
    ('MX150', None, 'Linux', 'NVIDIA Pascal:'), ('RTX 3060', None, 'Windows', 'NVIDIA Turing '), ('RTX 2060', None, 'Linux', None)])
def test_check_usable_names_the_readme_s_install_line(card, cuda, system, expect):
    "A torch build that cannot use the card names the README's line for it: cu126 below 7.5, PyPI (cu130 on Windows) above."
    import dataclasses
    from netlite_nb.probe import GPUInfo, TorchBuild, check_usable
    b = TorchBuild('2.14.1', cuda, None, ['sm_75', 'sm_80', 'sm_90'] if cuda else [], {'cuda': bool(cuda), 'rocm': False, 'mps': False, 'xpu': False, 'cpu': True})
    why = check_usable(GPUInfo.from_spec(card), b, system)
    advice = why.split('supports it: ')[-1].split('then ')[-1].split(';')[0].split(' (')[0]
    if expect: assert f"`{advice}`" in _readme_lines()[expect], (advice, _readme_lines()[expect])
    else: assert advice == 'pip install torch torchvision' and "PyPI's default" in why and 'cu130' not in why.split(';')[0]
    if not cuda: assert 'CPU-only build' in why and 'pip uninstall -y torch torchvision' in why
