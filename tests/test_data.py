"Chapter 04 through the reader's code paths: files in torchvision's exact on-disk formats, folders of PNGs, loaders."
import gzip, hashlib, pickle, struct, warnings
from pathlib import Path
import numpy as np, pytest, torch
from PIL import Image
import torchvision.datasets as tvd
from netlite_nb.data import (mnist_sample, load_dataset, image_folder, check_dataset, make_loaders, mnist_sample_loaders,
                             TensorLoader, DataLoaders, DataCheckError, DatasetNotFoundError, LabeledTensors, loader_settings)

def write_idx(path:Path, arr:np.ndarray):
    "An IDX file as LeCun's MNIST distributes them: magic (0, 0, type 0x08 = ubyte, ndim), big-endian dims, data."
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack('>BBBB', 0, 0, 0x08, arr.ndim) + struct.pack(f'>{arr.ndim}I', *arr.shape) + arr.astype(np.uint8).tobytes())

def make_mnist_files(root:Path, folder='MNIST', n_train=30, n_test=10, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (('train', n_train), ('t10k', n_test)):
        x, y = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), np.arange(n) % 10
        write_idx(root / folder / 'raw' / f'{split}-images-idx3-ubyte', x)
        write_idx(root / folder / 'raw' / f'{split}-labels-idx1-ubyte', y)
        out[split] = (x, y)
    return out

CIFAR_NAMES = ['airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck']

def make_cifar_files(root:Path, n=8, seed=0):
    "The python-pickle CIFAR-10 layout: data_batch_1..5 and test_batch ({'data': uint8 [n, 3072] (R, G, B planes), 'labels'}), batches.meta."
    rng = np.random.default_rng(seed)
    d = root / 'cifar-10-batches-py'; d.mkdir(parents=True)
    batches = {}
    for name in [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']:
        data, labels = rng.integers(0, 256, (n, 3072), dtype=np.uint8), [int(v) for v in rng.integers(0, 10, n)]
        (d / name).write_bytes(pickle.dumps({'batch_label': name.encode(), 'data': data, 'labels': labels}))
        batches[name] = (data, labels)
    (d / 'batches.meta').write_bytes(pickle.dumps({'label_names': CIFAR_NAMES, 'num_cases_per_batch': n, 'num_vis': 3072}))
    return batches

def md5(p:Path)->str: return hashlib.md5(p.read_bytes()).hexdigest()

@pytest.mark.parametrize('name,folder', [('mnist', 'MNIST'), ('fashion_mnist', 'FashionMNIST')])
def test_idx_files_load_through_torchvision(tmp_path, name, folder):
    ref = make_mnist_files(tmp_path, folder)
    tr, va = load_dataset(name, root=tmp_path)
    assert (len(tr), len(va)) == (30, 10) and tr.input_shape == (1, 28, 28) and tr.x.dtype == torch.uint8
    assert torch.equal(tr.x[:, 0], torch.from_numpy(ref['train'][0])) and torch.equal(va.y, torch.from_numpy(ref['t10k'][1]).long())
    assert tr.num_classes == 10 and tr.classes == getattr(tvd, folder).classes  # torchvision's names, e.g. '0 - zero'
    x, y = tr[3]
    assert x.dtype == torch.float32 and 0 <= float(x.min()) and float(x.max()) <= 1 and int(y) == 3
    dls = make_loaders(tr, va, batch_size=8)
    xb, yb = next(iter(dls.train))
    assert xb.shape == (8, 1, 28, 28) and dls.classes == tr.classes

def test_missing_dataset_says_where_and_how(tmp_path):
    with pytest.raises(DatasetNotFoundError) as e: load_dataset('mnist', root=tmp_path)
    msg = str(e.value)
    assert str(tmp_path / 'MNIST' / 'raw') in msg and 'train-images-idx3-ubyte' in msg and 'download=True' in msg
    make_mnist_files(tmp_path)
    (tmp_path / 'MNIST' / 'raw' / 't10k-labels-idx1-ubyte').unlink()
    with pytest.raises(DatasetNotFoundError, match='Missing: t10k-labels-idx1-ubyte'): load_dataset('mnist', root=tmp_path)

def test_cifar_pickles_load_through_torchvision(tmp_path, monkeypatch):
    ref = make_cifar_files(tmp_path)
    d = tmp_path / 'cifar-10-batches-py'
    # torchvision verifies every file's MD5 against the real CIFAR-10's: our tiny fixture must be rejected ...
    with pytest.raises(DatasetNotFoundError, match='rejected the files'): load_dataset('cifar10', root=tmp_path)
    # ... so the test registers the fixture's own checksums; torchvision still checks them and parses the same way
    monkeypatch.setattr(tvd.CIFAR10, 'train_list', [[f'data_batch_{i}', md5(d / f'data_batch_{i}')] for i in range(1, 6)])
    monkeypatch.setattr(tvd.CIFAR10, 'test_list', [['test_batch', md5(d / 'test_batch')]])
    monkeypatch.setattr(tvd.CIFAR10, 'meta', {'filename': 'batches.meta', 'key': 'label_names', 'md5': md5(d / 'batches.meta')})
    tr, va = load_dataset('cifar10', root=tmp_path)
    assert (len(tr), len(va)) == (40, 8) and tr.input_shape == (3, 32, 32) and tr.classes == CIFAR_NAMES
    data, labels = ref['data_batch_2']
    img = data[0].reshape(3, 32, 32)                      # channel planes R, G, B; rows of 32
    assert torch.equal(tr.x[8], torch.from_numpy(img)) and int(tr.y[8]) == labels[0]
    assert torch.equal(va.y, torch.tensor(ref['test_batch'][1]))
    (d / 'data_batch_3').write_bytes(b'corrupt')           # a damaged file fails the checksum
    with pytest.raises(DatasetNotFoundError, match='rejected'): load_dataset('cifar10', root=tmp_path)

def test_image_folder_pngs(tmp_path):
    rng = np.random.default_rng(0)
    for c, n in [('cat', 6), ('dog', 4), ('emu', 5)]:
        (tmp_path / c).mkdir()
        for i in range(n): Image.fromarray(rng.integers(0, 256, (40 + i, 50, 3), dtype=np.uint8)).save(tmp_path / c / f'{i}.png')
    (tmp_path / 'dog' / 'truncated.png').write_bytes((tmp_path / 'dog' / '0.png').read_bytes()[:60])
    (tmp_path / 'emu' / 'page.jpg').write_text('<html>404</html>')
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        tr, va = image_folder(tmp_path, size=24, valid_pct=0.25, seed=1)
    msgs = [str(m.message) for m in w if 'unreadable' in str(m.message)]
    assert len(msgs) == 1 and 'Skipped 2' in msgs[0] and 'truncated.png' in msgs[0] and 'page.jpg' in msgs[0]
    assert tr.classes == va.classes == ['cat', 'dog', 'emu'] and len(tr) + len(va) == 15   # nothing else lost
    assert torch.bincount(va.targets).tolist() == [2, 1, 1] and all(torch.bincount(tr.targets) > 0)
    x, y = tr[0]
    assert x.shape == (3, 24, 24) and x.dtype == torch.float32
    with pytest.warns(UserWarning, match='Skipped 2'): tr2, va2 = image_folder(tmp_path, size=24, valid_pct=0.25, seed=1)
    assert [s for s, _ in va2.samples] == [s for s, _ in va.samples]           # the split is seeded
    with pytest.warns(UserWarning): g, _ = image_folder(tmp_path, size=16, channels=1)
    assert g[0][0].shape == (1, 16, 16)
    dls = make_loaders(tr, va, batch_size=4, augment=True)
    xb, yb = next(iter(dls.train))
    assert xb.shape == (4, 3, 24, 24) and dls.num_classes == 3 and dls.input_shape == (3, 24, 24)
    with pytest.raises(DatasetNotFoundError, match='one sub-folder per class'): image_folder(tmp_path / 'missing')
    (tmp_path / 'empty').mkdir()
    with pytest.raises(DatasetNotFoundError): image_folder(tmp_path / 'empty')

def test_sample_split_is_fixed_and_disjoint():
    tr, va = mnist_sample()
    d = np.load(Path(__file__).parents[1] / 'netlite_nb' / 'mnist_5k.npz')
    assert set(d['train_idx'].tolist()).isdisjoint(d['valid_idx'].tolist()) and len(d['train_idx']) + len(d['valid_idx']) == 5000
    assert torch.equal(va.x, torch.from_numpy(d['images'][d['valid_idx']]).unsqueeze(1).float() / 255)
    assert str(d['source_sha256']) == '846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d'

def test_check_dataset_names_the_item():
    tr, _ = mnist_sample()
    x, y = tr.x[::40].clone(), tr.y[::40].clone()
    y[12] = -1
    with pytest.raises(DataCheckError, match=r'Label of item 12 is -1'): check_dataset((x, y), num_classes=10)
    with pytest.raises(DataCheckError, match='whole class numbers'): check_dataset((x, torch.full((100,), 0.5)))
    with pytest.raises(DataCheckError, match=r"Class 6 \('6'\), 7 \('7'\), 8 \('8'\), 9 \('9'\) has no items"):
        check_dataset(LabeledTensors(x[:60], tr.y[::40][:60], [str(i) for i in range(10)]))
    x2, y2 = tr.x[:1100], tr.y[:1100]           # 400 zeros, 400 ones, 300 twos
    r = check_dataset((x2, y2))
    assert r.counts == [400, 400, 300] and abs(r.imbalance - 400 / 300) < 1e-9 and 'imbalance 1.3×' in str(r)

def test_loaders_follow_the_strategy():
    class S: device, num_workers, pin_memory, persistent_workers, prefetch_factor, micro_batch = 'cpu', 2, True, True, 3, 32
    dls = mnist_sample_loaders(strategy=S())
    assert isinstance(dls, DataLoaders) and dls.batch_size == 32 and isinstance(dls.train, TensorLoader)
    s = loader_settings(S(), notebook=False, system='Linux')
    assert (s.num_workers, s.pin_memory, s.prefetch_factor) == (2, False, 3)
    tr, va = mnist_sample()
    dl = make_loaders(tr, va, strategy=S(), resident=False)        # the DataLoader path takes the strategy's workers
    assert dl.train.loader.num_workers == 2 and dl.train.loader.prefetch_factor == 3
    xb, yb = next(iter(dl.train))
    assert xb.shape == (32, 1, 28, 28)

def test_notebook_detection_is_chapter_00s(monkeypatch):
    "Loaders ask `probe.in_notebook()` (one rule for the book): a Jupyter kernel, Colab's subclass of it, not a terminal."
    import netlite_nb.data as data, netlite_nb.probe as probe
    assert 'in_notebook' not in data.__all__ and data.in_notebook is probe.in_notebook
    class ZMQInteractiveShell: pass
    class Shell(ZMQInteractiveShell): pass                       # google.colab._shell.Shell subclasses the Jupyter kernel's shell
    class TerminalInteractiveShell: pass
    class S: num_workers, device = 4, 'cpu'
    for shell, workers in [(ZMQInteractiveShell(), 0), (Shell(), 0), (TerminalInteractiveShell(), 4), (None, 4)]:
        monkeypatch.setattr(probe, '_ipython', lambda: shell)
        assert loader_settings(S(), system='Windows').num_workers == workers, type(shell).__name__
    monkeypatch.setattr(probe, '_ipython', lambda: ZMQInteractiveShell())
    assert loader_settings(S(), system='Linux').num_workers == 4   # workers start fine from a notebook on Linux (fork)

@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_tensor_loader_on_cuda():
    dls = mnist_sample_loaders(device='cuda', augment=True)
    xb, yb = next(iter(dls.train))
    assert xb.is_cuda and yb.is_cuda and xb.shape == (64, 1, 28, 28)
    a, b = [torch.cat([y for _, y in TensorLoader(mnist_sample()[0], 64, shuffle=True, seed=s, device=d)]).cpu() for s, d in ((3, 'cuda'), (3, 'cpu'))]
    assert torch.equal(a, b)                                     # the order depends on the seed, not the device

class _Counted(torch.utils.data.Dataset):
    "n items of shape (1, 2, 2) with labels i % 3, read one at a time, counting the reads."
    def __init__(self, n): self.n, self.reads = n, 0
    def __len__(self): return self.n
    def __getitem__(self, i): self.reads += 1; return torch.full((1, 2, 2), float(i)), i % 3

@pytest.mark.parametrize('n,sample_labels,reads', [(10_000, True, 100), (300, False, 300), (50, True, 50), (50, False, 50)])
def test_check_dataset_reads_each_item_once(n, sample_labels, reads):
    "Labels and pixels come from one read of each item (the old check read the sampled items twice)."
    ds = _Counted(n)
    r = check_dataset(ds, sample_labels=sample_labels, max_items=100)
    assert ds.reads == reads and r.checked == min(n, 100) and r.n == (n if not sample_labels or n <= 100 else 100)

@pytest.fixture
def tensor_reads(monkeypatch):
    "Counts `TensorDataset.__getitem__` calls; patched on the class itself, so a plain TensorDataset still reads as one."
    n, orig = [0], torch.utils.data.TensorDataset.__getitem__
    def counted(self, i): n[0] += 1; return orig(self, i)
    monkeypatch.setattr(torch.utils.data.TensorDataset, '__getitem__', counted)
    return n


class _OneByOne(torch.utils.data.Dataset):
    "The items of `ds`, readable only one at a time."
    def __init__(self, ds): self.ds = ds
    def __len__(self): return len(self.ds)
    def __getitem__(self, i): return self.ds[i]

def _message(f):
    with pytest.raises(DataCheckError) as e: f()
    return str(e.value)

def test_tensor_dataset_check_indexes_rows_and_finds_the_same(tensor_reads):
    "A TensorDataset (and a Subset of one) is checked from its tensors, with no item read, and reports what item-by-item reading does."
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(3000, 1, 4, 4, generator=g), torch.randint(0, 10, (3000,), generator=g)
    rows = torch.utils.data.TensorDataset(x, y)
    sub = torch.utils.data.Subset(rows, list(range(2999, -1, -3)))
    for ds in (rows, sub):
        for kw in (dict(sample_labels=True, max_items=512), dict(max_items=200)):
            fast, slow = check_dataset(ds, **kw), None
            assert tensor_reads[0] == 0
            slow = check_dataset(_OneByOne(ds), **kw)
            same = lambda r: (r.mean, r.std, r.min, r.max, r.checked, r.input_shape)
            assert same(fast) == same(slow)                     # the same pixel sample
            # its labels are read whole (one index, no item read): complete counts, where item-by-item reading samples them
            assert fast.complete and sum(fast.counts) == fast.n == len(ds) and (slow.complete or kw.get('sample_labels') is True)
            if not kw.get('sample_labels'): assert fast == slow
            tensor_reads[0] = 0
    k = int(torch.linspace(0, 2999, 512).round()[171])  # an item of the evenly spaced sample of 512
    xn = x.clone(); xn[k, 0, 2, 2] = float('nan')
    msg = _message(lambda: check_dataset(torch.utils.data.TensorDataset(xn, y), sample_labels=True, max_items=512))
    assert f'Image {k} contains NaN' in msg and msg == _message(lambda: check_dataset(_OneByOne(torch.utils.data.TensorDataset(xn, y)), sample_labels=True, max_items=512))
    yb = y.clone(); yb[0] = 12
    msg = _message(lambda: check_dataset(torch.utils.data.TensorDataset(x, yb), num_classes=10, sample_labels=True))
    assert 'Label of item 0 is 12' in msg and msg == _message(lambda: check_dataset(_OneByOne(torch.utils.data.TensorDataset(x, yb)), num_classes=10, sample_labels=True))

def test_a_sampled_label_out_of_range_names_the_datasets_item():
    "With `sample_labels`, a bad label is named by its index in the dataset, not by its place in the sample (both read paths)."
    x, y = torch.rand(3000, 1, 4, 4), torch.randint(0, 10, (3000,), generator=torch.Generator().manual_seed(0))
    k = int(torch.linspace(0, 2999, 512).round()[300])  # the sample's 301st item
    y[k] = 12
    for ds in (torch.utils.data.TensorDataset(x, y), _OneByOne(torch.utils.data.TensorDataset(x, y))):
        msg = _message(lambda: check_dataset(ds, num_classes=10, sample_labels=True, max_items=512))
        assert f'Label of item {k} is 12' in msg and f'items out of range: {k}' in msg, msg

def test_a_tensor_dataset_subclass_with_its_own_items_is_read_item_by_item(tensor_reads):
    "A subclass that changes `__getitem__` (a normalisation, an augmentation) is checked on its items, not its stored tensors."
    class Normalised(torch.utils.data.TensorDataset):
        def __getitem__(self, i): x, y = super().__getitem__(i); return (x - 0.5) / 0.25, y
    class Broken(torch.utils.data.TensorDataset):
        def __getitem__(self, i): x, y = super().__getitem__(i); return (x / 0 if i == 7 else x), y
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(300, 1, 4, 4, generator=g), torch.randint(0, 10, (300,), generator=g)
    plain, norm = check_dataset(torch.utils.data.TensorDataset(x, y)), check_dataset(Normalised(x, y))
    assert tensor_reads[0] == 300 and abs(norm.mean - (plain.mean - 0.5) / 0.25) < 1e-4 and abs(norm.std - plain.std / 0.25) < 1e-4
    x[7] = x[7].clamp_min(0.01)  # x / 0 is inf, not NaN
    with pytest.raises(DataCheckError, match='Image 7 contains inf'): check_dataset(Broken(x, y))
