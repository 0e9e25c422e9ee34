"Set before any test imports torch: one thread per process unless the environment says otherwise, as `.ci/run` does."
import os

# Chapter 07's thread policy picks the fastest count at the start of each fit; on a busy machine two identical runs can
# then pick differently, and a different count changes the order of float additions. Tests that compare runs bit for
# bit need one fixed count; the policy's own tests set the variable aside (tests/test_train.py, `torch_threads`).
os.environ.setdefault('OMP_NUM_THREADS', '1')
