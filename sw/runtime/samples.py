"""Input samples from files for the command line: ``.npy`` (one input), ``.npz`` (one
array per input name) or a directory of them; feeds of a graph's batch size; seeded random
inputs. Shared by ``dnnfab run`` and ``dnnfab schedule``."""

import os

import numpy as np

from ...errors import InputError

__all__ = ["load_samples"]


def _load_one(path, names):
    """{input name: array} from one .npy / .npz file."""
    try:
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        else:
            arrays = {None: np.load(path, allow_pickle=False)}
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{path}: not a readable numpy file ({str(exc).splitlines()[0]}); "
                         "save it with np.save / np.savez") from None
    if None in arrays or (len(names) == 1 and len(arrays) == 1):
        if len(names) != 1:
            raise InputError(f"{path}: the model has inputs {names}; use an .npz with one "
                             "array per input name (np.savez(path, **{name: array}))")
        return {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(f"{path}: holds arrays {sorted(arrays)}, the model's inputs are "
                         f"{names}; name the arrays after the inputs")
    return {n: arrays[n] for n in names}


def load_samples(path, graph):
    """Samples for ``graph`` from ``path`` (``.npy``, ``.npz`` or a directory of them).

    Returns ``{input name: float32 array [N, *input_shape[1:]]}``; one sample may also be
    stored without the leading sample axis. Raises :class:`InputError` naming the file and
    the fix for a missing file, a wrong shape or dtype, or NaN/inf values.
    """
    from .network import check_finite
    names = [t.name for t in graph.inputs]
    shapes = {t.name: tuple(t.shape) for t in graph.inputs}
    if not os.path.exists(path):
        raise InputError(f"file not found: {path}; pass a .npy file, an .npz file or a "
                         "directory of them")
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.endswith((".npy", ".npz")))
        if not files:
            raise InputError(f"{path}: the directory holds no .npy or .npz files; save "
                             "samples with np.save")
    elif path.endswith((".npy", ".npz")):
        files = [path]
    else:
        raise InputError(f"{path}: expected a .npy file, an .npz file or a directory of them "
                         "(save samples with np.save / np.savez)")
    parts = {n: [] for n in names}
    for f in files:
        for n, a in _load_one(f, names).items():
            a = np.asarray(a)
            if a.dtype.kind not in "fiub":
                raise InputError(f"{f}: array {n!r} has dtype {a.dtype}; save numbers "
                                 "(float32) for the model input")
            want = shapes[n][1:]
            if tuple(a.shape) == want:
                a = a[None]
            elif tuple(a.shape[1:]) != want:
                raise InputError(f"{f}: array {n!r} has shape {list(a.shape)}; input {n!r} "
                                 f"needs [N, {', '.join(map(str, want))}] (N samples)")
            check_finite({n: a}, what=f"{f}: array")
            parts[n].append(a.astype(np.float32))
    out = {n: np.concatenate(parts[n]) for n in names}
    counts = {n: len(a) for n, a in out.items()}
    if len(set(counts.values())) != 1:
        raise InputError(f"{path}: the inputs have different sample counts {counts}; give "
                         "every input the same number of samples")
    if not next(iter(counts.values())):
        raise InputError(f"{path}: holds no samples (an axis of length 0); save at least one")
    return out


def _feeds(graph, arrays, n=None):
    """Feeds of the graph's batch size from {name: [N, ...]} (the first ``n`` batches)."""
    b = graph.inputs[0].shape[0]
    total = len(next(iter(arrays.values()))) // b
    n = total if n is None else min(n, total)
    return [{k: v[i * b:(i + 1) * b] for k, v in arrays.items()} for i in range(n)]


def _random(graph, n, seed):
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal((n * t.shape[0],) + tuple(t.shape[1:])).astype(np.float32)
            for t in graph.inputs}
