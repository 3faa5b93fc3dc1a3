#!/usr/bin/env python3
"""Joins bench-kernels' RESULT lines with llama.cpp's test-backend-ops MUL_MAT
timings (same types and shapes) into one table with ratios; our grouped launches
of N one-token products with its MUL_MAT_ID of n tokens and n_used experts each
where n * n_used = N: its experts are the same every repetition, so it is set beside
our hot launch (groupedN-hot), not the one whose experts rotate through HBM (groupedN).

usage: bench/kernel-table.py BENCH_LOG [LLAMA_LOG]
ratio columns: ours/llama = llama's us / our us (above 1: we are faster);
copy % = weight bytes read per second over the device-to-device copy bandwidth
(bytes read + written) measured in the same run."""
import re
import sys


def parse_kv(line):
    return dict(kv.split('=', 1) for kv in line.split()[1:] if '=' in kv)


if len(sys.argv) > 1 and sys.argv[1] in ('-h', '--help'):
    print(__doc__)
    sys.exit(0)
if not 2 <= len(sys.argv) <= 3:
    print('usage: bench/kernel-table.py BENCH_LOG [LLAMA_LOG] (--help says more)', file=sys.stderr)
    sys.exit(2)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        sys.exit(f'kernel-table: {e}')


bench_log = read(sys.argv[1]).splitlines()

ours, copy, launches = [], None, None
for line in bench_log:
    if line.startswith('launches: '):
        launches = line.split(': ', 1)[1].strip()
    if line.startswith('RESULT '):
        d = parse_kv(line)
        if d.get('kind') == 'copy':
            copy = float(d['copy_GBps'])
        else:
            ours.append(d)

llama = {}
if len(sys.argv) > 2:
    # With its CUDA graphs on, test-backend-ops prints its graph warm-up messages
    # between a case's name and its time: a case's time is the first one before
    # the next case's line.
    until_time = r'[^\n]*?(?:\n(?!\s*MUL_MAT)[^\n]*?)*?([\d.]+) us/run'
    pat = re.compile(r'MUL_MAT\(type_a=(\w+),type_b=f32,m=(\d+),n=(\d+),k=(\d+),' + until_time)
    text = read(sys.argv[2])
    for m in pat.finditer(text):
        llama[(m.group(1), m.group(2), m.group(3), m.group(4))] = float(m.group(5))
    pat_id = re.compile(r'MUL_MAT_ID\(type_a=(\w+),type_b=f32,n_mats=\d+,n_used=(\d+),b=\w+,m=(\d+),n=(\d+),k=(\d+)\)'
                        + until_time)
    for m in pat_id.finditer(text):
        llama[('grouped', m.group(1), m.group(3), m.group(5), int(m.group(2)) * int(m.group(4)))] = float(m.group(6))

print(f'copy bandwidth (D2D, read+write): {copy:.0f} GB/s' if copy else 'copy bandwidth: not measured')
# bench/llama-kernels.sh runs test-backend-ops with its CUDA graphs off (each op
# launched from the host) unless given --graphs; ours are replayed with --graph.
print(f'our launches: {launches or "one by one from the host (a log from before --graph)"}')
hdr = f"{'kind':<12}{'type':<7}{'shape':<21}{'n':>4} {'mode':<13}{'us':>9}{'GB/s':>7}{'copy%':>7}{'llama us':>10}{'llama GB/s':>11}{'ours/llama':>11}"
print(hdr)
print('-' * len(hdr))
for d in ours:
    key = (d['type'], d['m'], d['n'], d['k'])
    us = float(d['us'])
    lus = llama.get(key) if d['kind'] in ('matvec', 'matmul-bf16', 'matmul-fp32', 'matmul-tiles', 'matmul-mma') and d['mode'] in ('hot', 'cold') else None
    # Like for like: its MUL_MAT_ID repeats the same experts, so beside our hot launch.
    grouped = re.fullmatch(r'grouped(\d+)-hot', d['mode'])
    if d['kind'] == 'grouped' and grouped:
        lus = llama.get(('grouped', d['type'], d['m'], d['k'], int(grouped.group(1))))
    if d['kind'].startswith('matmul') and d['mode'] != 'cold':
        lus = None
    shape = f"{d['k']}x{d['m']}"
    lgbs = ''
    ratio = ''
    if lus:
        wbytes = float(d['weight_GBps']) * 1e9 * us * 1e-6
        lgbs = f'{wbytes / (lus * 1e-6) / 1e9:.0f}'
        ratio = f'{lus / us:.2f}x'
    print(f"{d['kind']:<12}{d['type']:<7}{shape:<21}{d['n']:>4} {d['mode']:<13}{us:>9.2f}{float(d['weight_GBps']):>7.0f}"
          f"{float(d['copy_pct']):>6.1f}%{(f'{lus:.2f}' if lus else '-'):>10}{lgbs or '-':>11}{ratio or '-':>11}")
