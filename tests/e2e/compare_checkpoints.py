#!/usr/bin/env python3
"""Compares every dataset of two mpiformer checkpoints under the groups
given, tensor by tensor: |got - ref|_2 / |ref|_2, a norm-wise relative
error. Element-wise ratios are meaningless for the many values near zero
(biases, moments), and the largest element's error is that of the few
weights whose gradient nearly cancels over the batch: there fp32 rounding
is a large part of the gradient, and AdamW's m / sqrt(v) turns it into a
step of up to lr times that part, whatever the gradient's size.
Reads the raw float32 data with h5dump -b (hdf5-tools), so it shares no code
with mpiformer's reader.

The key third of each attn.c_attn.bias is left out: its gradient is zero in
exact arithmetic (softmax is unchanged by adding q.b_k to every score of a
row), so what it holds is fp32 rounding noise that no two layouts share
(two data-parallel replicas already differ there by 100% of its ~1e-7
values) and AdamW's normalisation makes it grow like a real update.

usage: compare_checkpoints.py REF.h5 GOT.h5 TOLERANCE GROUP... (e.g. /model)
Prints the worst tensor; exits 1 if any exceeds TOLERANCE.
"""
import array
import os
import subprocess
import sys
import tempfile


def datasets(path, group):
    """(name, element count) of every dataset under GROUP, in h5ls's order."""
    out = subprocess.run(["h5ls", "-r", f"{path}/{group.strip('/')}"], check=True,
                         capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        if "Dataset" not in line:
            continue
        dims = line[line.index("{") + 1:line.index("}")].split("/")[0]
        count = 1
        for d in ([] if dims == "SCALAR" else dims.split(",")):
            count *= int(d)
        found.append((group.rstrip("/") + line.split()[0], count))
    return found


def read_all(path, names, scratch):
    """The float32 data of every named dataset, from one h5dump run (a run
    per tensor was most of the comparison's time): h5dump writes the
    datasets' raw values one after another in the order given."""
    raw = os.path.join(scratch, "d.bin")
    cmd = ["h5dump", "-b", "LE", "-o", raw]
    for name, _ in names:
        cmd += ["-d", name]
    subprocess.run(cmd + [path], check=True, capture_output=True)
    a = array.array("f")
    with open(raw, "rb") as f:
        a.frombytes(f.read())
    want = sum(n for _, n in names)
    assert len(a) == want, f"{path}: {len(a)} values read, {want} expected"
    out, at = {}, 0
    for name, n in names:
        out[name] = a[at:at + n]
        at += n
    return out


def main():
    ref, got, tol, groups = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
    worst, worst_name, count = 0.0, "", 0
    with tempfile.TemporaryDirectory() as scratch:
        for g in groups:
            names = datasets(ref, g)
            assert names, f"{ref}: nothing under {g}"
            assert [n for n, _ in datasets(got, g)] == [n for n, _ in names], \
                f"{got}: the tensors under {g} are not {ref}'s"
            refs, gots = read_all(ref, names, scratch), read_all(got, names, scratch)
            for name, _ in names:
                a, b = refs[name], gots[name]
                assert len(a) == len(b), f"{name}: {len(a)} vs {len(b)} elements"
                if name.endswith("attn.c_attn.bias"):
                    third = len(a) // 3
                    a, b = a[:third] + a[2 * third:], b[:third] + b[2 * third:]
                scale = sum(x * x for x in a) ** 0.5 or 1.0
                err = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 / scale
                count += 1
                if err >= worst:
                    worst, worst_name = err, name
    print(f"{count} tensors, worst {worst_name}: {worst:.2e} (tolerance {tol:g})")
    sys.exit(0 if worst <= tol else 1)


if __name__ == "__main__":
    main()
