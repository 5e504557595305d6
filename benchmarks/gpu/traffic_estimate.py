#!/usr/bin/env python3
"""Memory traffic of a CUDA build's kernels, estimated from its IR (no GPU needed).

Reads a KILN_LOGS=ir dump and takes its last "GPU parallel loops" stage: each top-level
scf.parallel becomes one kernel, each call of kiln_rt_cuda_gemm_* one cuBLAS GEMM. A kernel's
bytes are the sizes of the distinct buffers it loads from plus those it stores to, each counted
once (a view counts at its own size): a row a warp reads again from cache is not counted twice,
and a buffer read only in part counts whole (an upper bound). GEMMs are counted by their flops.
This is a model for comparing builds, not a measurement.

  KILN_DISABLE_CACHE=1 KILN_LOGS=ir build/tests/test_tracer "[.gpu_build_full]" 2> ir.txt
  python3 benchmarks/gpu/traffic_estimate.py ir.txt [--bandwidth GB/s] [--top N]
"""
import argparse
import re
import sys

ELEMENT_BYTES = {'f16': 2, 'bf16': 2, 'f32': 4, 'f64': 8, 'i1': 1, 'i8': 1, 'i32': 4, 'i64': 8,
                 'index': 8}
STAGE = '// ----- kiln codegen: GPU parallel loops -----'


def memref_bytes(t):
    shape = t.split(',')[0].strip().split('x')
    n = 1
    for d in shape[:-1]:
        n *= int(d) if d.isdigit() else 1  # a `?` dim counts as 1
    return n * ELEMENT_BYTES.get(shape[-1], 4)


def last_stage(lines):
    starts = [i for i, l in enumerate(lines) if l.startswith(STAGE)]
    if not starts:
        sys.exit('no "GPU parallel loops" stage in the dump: run with KILN_LOGS=ir and a cold '
                 'compile cache (KILN_DISABLE_CACHE=1)')
    out = []
    for l in lines[starts[-1] + 1:]:
        if l.startswith('// ----- kiln codegen:'):
            break
        out.append(l)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('dump')
    ap.add_argument('--bandwidth', type=float, default=4181.0,
                    help='GB/s the kernels move (default: the H200 copy measured in session 40)')
    ap.add_argument('--top', type=int, default=15, help='kernels listed, largest first')
    a = ap.parse_args()
    lines = last_stage(open(a.dump).read().split('\n'))
    root = {}
    access = re.compile(r'(?:memref\.load|memref\.store [^,]+,|memref\.atomic_rmw \w+ [^,]+,|'
                        r'memref\.generic_atomic_rmw) (%[\w]+)\[[^\]]*\] : memref<([^>]*)>')
    kernels, gemm_flops, gemms = [], 0, 0
    i = 0
    while i < len(lines):
        l = lines[i]
        m = re.match(r'\s+(%[\w]+) = memref\.(?:subview|collapse_shape|expand_shape|'
                     r'reinterpret_cast|cast) (%[\w]+)', l)
        if m:
            root[m.group(1)] = root.get(m.group(2), m.group(2))
        if re.match(r'    call @kiln_rt_cuda_gemm', l):
            args = l.split('(', 1)[1].split(')')[0].split(', ')
            sizes = [re.match(r'%c(\d+)', x) for x in args[:4]]
            if all(sizes):
                b, mm, n, k = (int(x.group(1)) for x in sizes)
                gemm_flops += 2 * b * mm * n * k
            gemms += 1
        if l.startswith('    scf.parallel'):
            touched = {}
            j = i + 1
            while not re.match(r'    \}', lines[j]):
                for m in access.finditer(lines[j]):
                    buf = root.get(m.group(1), m.group(1))
                    touched[buf] = max(touched.get(buf, 0), memref_bytes(m.group(2)))
                j += 1
            kernels.append((sum(touched.values()), i + 1))
            i = j
        i += 1
    total = sum(b for b, _ in kernels)
    print(f'{len(kernels)} kernels, {total / 1e9:.2f} GB moved '
          f'(~{total / a.bandwidth / 1e6:.2f} ms at {a.bandwidth:.0f} GB/s); '
          f'{gemms} GEMMs, {gemm_flops / 1e12:.3f} TFLOP')
    for b, line in sorted(kernels, reverse=True)[:a.top]:
        print(f'  {b / 1e6:9.1f} MB  kernel at line {line} of the stage')


if __name__ == '__main__':
    main()
