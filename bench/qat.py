"""Post-training INT8, cross-layer equalization and QAT (chapter 09c) on a model where chapter 09's post-training INT8 loses points.

The model is 09c's `wide_stem_cnn` (a depthwise-separable CNN whose stem channels span 10**spread in scale, 10**4 by default,
no BatchNorm after the stem), trained on the embedded MNIST sample with chapter 07's Trainer (AdamW, lr 1e-2, 3 epochs). Each seed
makes six INT8 files with `export_onnx(m, quantize='int8', calibration=dls)` (static QDQ, this CPU's 7/8-bit choice), m being:
- ptq: the trained model;                 - cle_ptq: `cross_layer_equalize(model)[0]` (the same floats);
- qat: `strip_qat(qat_fine_tune(model, dls, steps=300, lr=1e-3))` (equalized by `prepare_qat`, then fine-tuned with fake quantization,
  BatchNorm on batch statistics for the first half, then frozen: Krishnamoorthi 2018, 3.2);
- qat_fold: the same with `batchnorm='fold'` (BatchNorm folded before fine-tuning, the earlier method);
- control_ptq / control_cle_ptq: the trained model fine-tuned in fp32 for the same steps (then without / with equalization).
An arm's loss is the held-out accuracy (1,000 images) of the fp32 model m minus its INT8 file's, its agreement the file's top-1
agreement with m (the export report's: 1,064 inputs). For QAT, m is `strip_qat(qm)`: the fine-tuned weights on the int8 grid the file
stores, BatchNorm folded, no activation rounding; the QAT files are calibrated on `qm.calibration`, the inputs QAT last set its ranges from.
Two more references for each QAT file: `*_latent_fp32` (the fine-tuned latent weights, `strip_qat(qm, on_grid=False)`: the reference
before weights were exported on their grid) and `*_fake_quant` (the fake-quantized model training optimized; `*_fq_max_steps` is the
largest |file - fake quant| logit difference in steps of the file's output grid); `*_on_grid_agreement_with_latent_fp32` compares
the two fp32 models (weights on the grid or latent), no INT8 file involved. `qat_loss_vs_control_fp32` compares QAT's file with the
control's fp32 accuracy. Medians of the seeds, per column. Results go to bench/results/qat/<machine>.spread<spread>.json.

    OMP_NUM_THREADS=1 python bench/qat.py --spread 4     # seeds 0,1,2 (about 4 minutes a seed on 2 busy cores)
    OMP_NUM_THREADS=1 python bench/qat.py --spread 3
"""
import argparse, copy, json, os, platform, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's netlite_nb
from netlite_nb.data import mnist_sample, mnist_sample_loaders
from netlite_nb.export import export_onnx, onnx_session, run_onnx
from netlite_nb.qat import activation_qparams, cross_layer_equalize, qat_fine_tune, strip_qat, wide_stem_cnn
from netlite_nb.train import Trainer


ARMS = ('ptq', 'cle_ptq', 'qat', 'qat_fold', 'control_ptq', 'control_cle_ptq')


def _arm(r)->dict:
    "Accuracy of an INT8 file, its loss against the fp32 model it was made from, and top-1 agreement with that model."
    return dict(fp32=r.accuracy['pytorch'], int8=r.accuracy['int8'], loss=r.accuracy['pytorch'] - r.accuracy['int8'], agreement=r.agreement['int8'])


def one_seed(seed:int, epochs:int, steps:int, lr:float, spread:float)->dict:
    torch.manual_seed(seed)
    dls = mnist_sample_loaders(batch_size=64, seed=seed)
    va = mnist_sample()[1]
    model = Trainer(wide_stem_cnn(spread=spread), dls, device='cpu', lr=1e-2, progress=False, verbose=False, plan=False, seed=seed).fit(epochs).model.eval()
    ex = lambda m, d, name, cal=dls: export_onnx(m, va.x[:64], Path(d) / f'{name}.onnx', quantize='int8', calibration=cal, valid=va, measure_speed=False)
    with tempfile.TemporaryDirectory() as d:
        ptq = ex(model, d, 'ptq')
        cle_ptq = ex(cross_layer_equalize(model)[0], d, 'cle_ptq')
        t0 = time.process_time()
        qm = qat_fine_tune(model, dls, steps=steps, lr=lr, seed=seed)  # BatchNorm trained on batch statistics, frozen at half the steps
        cpu_s = time.process_time() - t0
        qf = qat_fine_tune(model, dls, steps=steps, lr=lr, seed=seed, batchnorm='fold')  # the earlier method: BatchNorm folded from the start
        qat, qat_fold = (ex(strip_qat(q), d, k, q.calibration) for k, q in dict(qat=qm, qat_fold=qf).items())
        refs = {}
        xs = torch.cat([va.x[:64], va.x])  # the inputs of the export report's agreement: its sample, then the held-out set
        for k, q in dict(qat=qm, qat_fold=qf).items():  # the same file against the other two references
            q8 = torch.from_numpy(run_onnx(onnx_session(Path(d) / f'{k}.onnx'), xs.numpy()))
            step = activation_qparams(q.out.lo.item(), q.out.hi.item())[0]
            with torch.no_grad(): fq, lat, grid = q.eval()(xs), strip_qat(q, on_grid=False)(xs), strip_qat(q)(xs)
            acc = lambda o: 100 * (o[64:].argmax(1) == va.y).float().mean().item()
            agree = lambda a, b: 100 * (a.argmax(1) == b.argmax(1)).float().mean().item()
            refs.update({f'{k}_fake_quant': acc(fq), f'{k}_agreement_with_fake_quant': agree(q8, fq), f'{k}_loss_vs_fake_quant': acc(fq) - acc(q8),
                         f'{k}_fq_max_steps': ((q8 - fq).abs().max() / step).item(), f'{k}_latent_fp32': acc(lat),
                         f'{k}_agreement_with_latent_fp32': agree(q8, lat), f'{k}_loss_vs_latent_fp32': acc(lat) - acc(q8),
                         f'{k}_on_grid_agreement_with_latent_fp32': agree(grid, lat)})  # fp32 both: what rounding the weights alone changes
        # the control: the same steps of fine-tuning without fake quantization, then post-training INT8 (plain and equalized)
        ctl = Trainer(copy.deepcopy(model), dls, device='cpu', lr=lr, progress=False, verbose=False, plan=False, seed=seed).fit(steps=steps).model.eval()
        ctl_ptq, ctl_cle = ex(ctl, d, 'ctl'), ex(cross_layer_equalize(ctl)[0], d, 'ctl_cle')
    row = dict(seed=seed, int8_range=ptq.int8_range, qat_cpu_seconds=cpu_s)
    row.update(refs)
    for k, r in dict(ptq=ptq, cle_ptq=cle_ptq, qat=qat, qat_fold=qat_fold, control_ptq=ctl_ptq, control_cle_ptq=ctl_cle).items():
        row.update({f'{k}_{f}': v for f, v in _arm(r).items()})
    row['qat_loss_vs_control_fp32'] = ctl_ptq.accuracy['pytorch'] - qat.accuracy['int8']
    row['qat_fold_loss_vs_control_fp32'] = ctl_ptq.accuracy['pytorch'] - qat_fold.accuracy['int8']
    return row


def _git(*a): return subprocess.run(['git', *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--seeds', default='0,1,2')
    ap.add_argument('--epochs', type=int, default=3)
    ap.add_argument('--steps', type=int, default=300)
    ap.add_argument('--lr', type=float, default=1e-3)
    ap.add_argument('--spread', type=float, default=4.0, help="the stem's channel scales span 10**spread")
    ap.add_argument('--out', default=None, help='the JSON to write (default: bench/results/qat/<machine>.spread<spread>.json)')
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for s in [int(x) for x in a.seeds.split(',')]:
        rows.append(one_seed(s, a.epochs, a.steps, a.lr, a.spread))
        r = rows[-1]
        print(f"seed {s}:", '  '.join(f"{k} fp32 {r[k+'_fp32']:.1f}% int8 {r[k+'_int8']:.1f}% (loses {r[k+'_loss']:+.1f} pp, agreement {r[k+'_agreement']:.1f}%)"
                                     for k in ARMS), flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k not in ('seed', 'int8_range')}
    print('medians (loss: fp32 of the model the file is made from, minus INT8; agreement: top-1 of the INT8 file with that fp32 model):')
    for k in ARMS: print(f"  {k:16s} fp32 {med[k+'_fp32']:.2f}%  INT8 {med[k+'_int8']:.2f}%  loses {med[k+'_loss']:+.2f} pp  agreement {med[k+'_agreement']:.2f}%")
    for k in ('qat', 'qat_fold'):
        print(f"  {k}: INT8 against the control's fp32 loses {med[k + '_loss_vs_control_fp32']:+.2f} pp; against its fake-quantized model "
              f"{med[k + '_loss_vs_fake_quant']:+.2f} pp, agreement {med[k + '_agreement_with_fake_quant']:.2f}% (logits within "
              f"{med[k + '_fq_max_steps']:.1f} output steps); against its latent fp32 weights {med[k + '_loss_vs_latent_fp32']:+.2f} pp, "
              f"agreement {med[k + '_agreement_with_latent_fp32']:.2f}% (its fp32 weights on the grid agree with them {med[k + '_on_grid_agreement_with_latent_fp32']:.2f}%)")
    cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), platform.machine()) if os.path.exists('/proc/cpuinfo') else platform.machine()
    out = Path(a.out).resolve() if a.out else ROOT / "bench" / "results" / "qat" / f"{platform.machine()}.spread{a.spread:g}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    res = dict(bench='qat', schema=4, model=f'wide_stem_cnn(c=8, spread={a.spread:g})', epochs=a.epochs, steps=a.steps, lr=a.lr, seeds=[r['seed'] for r in rows], cpu=cpu,
               torch=torch.__version__, date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), commit=_git('rev-parse', '--short=10', 'HEAD') or None,
               dirty=bool(_git('status', '--porcelain', '--untracked-files=no')), medians=med, rows=rows)
    tmp = out.with_suffix('.tmp'); tmp.write_text(json.dumps(res, indent=1)); os.replace(tmp, out)
    print(f"stored {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == '__main__':
    main()
