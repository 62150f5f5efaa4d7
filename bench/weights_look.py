"""What a translated forward spends looking for weights changed since the last one (translator.weights).

    python -m bench.weights_look [--tiny]

gpt2_small_12L (bench.host_overhead's model) translated on the reference backend; then, timed with
timeit (least of 5 x 2000 calls): `weights.follow(tm.gm)` when nothing changed (the per-forward
cost), its parts (the dict snapshots' comparison, the data pointers), and state.refresh_prepared
beside it. A loaded machine inflates every number: compare rows of one run.
"""

from __future__ import annotations

import argparse
import os
import timeit

import torch


def _least_us(fn) -> float:
    return min(timeit.repeat(fn, number=2000, repeat=5)) / 2000 * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="one layer instead of 12")
    a = p.parse_args()
    from bench.host_overhead import _model
    from translator import translate, weights
    from translator.state import refresh_prepared

    model, inputs = _model("gpt2_small_12L", a.tiny)
    tm = translate(model, tuple(inputs), backend="reference", verify=False)
    with torch.no_grad():
        tm(*inputs)
    t = weights._TRACKED[id(tm.gm)]
    assert t.unchanged()
    ptr = torch.Tensor.data_ptr
    print(f"gpt2_small_12L{' (1 layer)' if a.tiny else ''}: {len(t.weights)} tracked weights, "
          f"{len(t.dicts)} dicts, {len(t.objs)} data pointers; load average {os.getloadavg()[0]:.1f}")
    for name, fn in (("follow (nothing changed)", lambda: weights.follow(tm.gm)),
                     ("  of which the dict snapshots", lambda: t.snapshots != t.dicts),
                     ("  of which the data pointers", lambda: list(map(ptr, t.objs)) == t.ptrs),
                     ("refresh_prepared (nothing changed)", lambda: refresh_prepared(tm.gm))):
        print(f"{name:36s} {_least_us(fn):8.2f} us")


if __name__ == "__main__":
    main()
