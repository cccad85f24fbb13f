"""Data behind the bundled models: the exact splits they were trained and measured on.

Two sources:

* :func:`digits_split` -- the 8x8 handwritten digits (real data, 1797 images, the UCI
  "Optical Recognition of Handwritten Digits" test set as scikit-learn ships it, CC BY
  4.0), split with a fixed seed. Used by ``digits-cnn``. The images and the split ship
  with the package (``digits.npz``), so no scikit-learn is needed.
* :func:`eeg_windows` / :func:`eeg_split` -- a **SYNTHETIC** scalp-EEG generator (no EEG
  corpus is available offline). Used by ``eeg-seizure``. It is a seeded model of what
  seizure windows look like, good for exercising the tool chain end to end; it is **not**
  clinical data and a detector trained on it says nothing about real patients.

Both return model-ready float32 arrays, so
``session.run(None, {input_name: x[i:i+1]})`` on the bundled ONNX file is the whole
evaluation. Everything is deterministic for a given seed (numpy ``default_rng``).
"""

from pathlib import Path

import numpy as np

from ..errors import DnnfabError

__all__ = [
    "DIGITS_FILE",
    "DIGITS_SEED",
    "DIGITS_TEST_FRACTION",
    "EEG_CHANNELS",
    "EEG_FS",
    "EEG_N_TEST",
    "EEG_N_TRAIN",
    "EEG_SAMPLES",
    "EEG_SCALE_UV",
    "EEG_TEST_SEED",
    "EEG_TRAIN_SEED",
    "digits_data",
    "digits_split",
    "eeg_model_input",
    "eeg_split",
    "eeg_windows",
]

# --------------------------------------------------------------------------------------
# Digits (real data)
# --------------------------------------------------------------------------------------

#: ``random_state`` of the stratified train/test split.
DIGITS_SEED = 0
#: Share of the 1797 images held out for testing (360 images).
DIGITS_TEST_FRACTION = 0.2


#: The shipped copy of the digits and of the split (written by scripts/make_digits_data.py).
DIGITS_FILE = Path(__file__).resolve().parent / "digits.npz"


def digits_data():
    """``(images, target)`` of the 1797 8x8 digits: uint8 pixel counts 0..16, digit 0..9.

    Read from the file shipped with the package (:data:`DIGITS_FILE`, no scikit-learn
    needed); scikit-learn's ``load_digits`` holds the same values in the same order.
    """
    with _digits_file() as d:
        return d["images"].copy(), d["target"].astype(np.int64)


def _digits_file():
    if not DIGITS_FILE.is_file():
        raise DnnfabError(f"the digits data file {DIGITS_FILE} is missing; reinstall dnnfab "
                          "(pip install -e .) or rewrite it with scripts/make_digits_data.py")
    return np.load(DIGITS_FILE)


def digits_split(seed=DIGITS_SEED, test_fraction=DIGITS_TEST_FRACTION):
    """Return ``(x_train, y_train, x_test, y_test)`` of the 8x8 digits, as ``digits-cnn`` saw them.

    ``x`` is float32 ``[n, 1, 8, 8]`` with pixel values scaled to ``[0, 1]``
    (the data holds 0..16; the model input is ``pixels / 16``), ``y`` is int64 class
    0..9. The split is ``sklearn.model_selection.train_test_split`` with
    ``test_size=test_fraction``, ``random_state=seed`` and ``stratify=y``: with the
    defaults 1437 training and 360 test images. The default split ships with the package
    (no scikit-learn needed); another ``seed`` or ``test_fraction`` is computed with
    scikit-learn (the ``train`` extra).
    """
    images, y = digits_data()
    x = (images.astype(np.float32) / 16.0)[:, None, :, :]
    if seed == DIGITS_SEED and test_fraction == DIGITS_TEST_FRACTION:
        with _digits_file() as d:
            tr, te = d["train_idx"].astype(np.intp), d["test_idx"].astype(np.intp)
    else:
        try:
            from sklearn.model_selection import train_test_split
        except ImportError as exc:  # scikit-learn is the `train` extra, not a runtime need
            raise DnnfabError(
                f"digits_split(seed={seed}, test_fraction={test_fraction}): a split other than "
                "the shipped one needs scikit-learn: pip install 'dnnfab[train]'") from exc
        tr, te = train_test_split(np.arange(len(y)), test_size=test_fraction,
                                  random_state=seed, stratify=y)
    return (np.ascontiguousarray(x[tr]), y[tr], np.ascontiguousarray(x[te]), y[te])


# --------------------------------------------------------------------------------------
# Synthetic EEG
# --------------------------------------------------------------------------------------

#: Sampling rate in Hz and samples per window (1 s windows).
EEG_FS = 256
EEG_SAMPLES = 256
#: The model input is microvolts divided by this.
EEG_SCALE_UV = 100.0
#: Seeds of the training and the held-out windows (different seeds = disjoint draws).
EEG_TRAIN_SEED = 0
EEG_TEST_SEED = 1
#: Number of training and held-out windows of ``eeg-seizure``.
EEG_N_TRAIN = 30000
EEG_N_TEST = 1000

# Approximate 10-20 electrode positions on a unit disc seen from above
# (x: left -> right, y: back -> front).
_ELECTRODES = {
    "FP1": (-0.30, 0.95), "FP2": (0.30, 0.95),
    "F7": (-0.80, 0.60), "F3": (-0.40, 0.50), "FZ": (0.00, 0.45),
    "F4": (0.40, 0.50), "F8": (0.80, 0.60),
    "FT9": (-1.05, 0.30), "FT10": (1.05, 0.30),
    "T7": (-1.00, 0.00), "C3": (-0.50, 0.00), "CZ": (0.00, 0.00),
    "C4": (0.50, 0.00), "T8": (1.00, 0.00),
    "P7": (-0.80, -0.60), "P3": (-0.40, -0.50), "PZ": (0.00, -0.45),
    "P4": (0.40, -0.50), "P8": (0.80, -0.60),
    "O1": (-0.30, -0.95), "O2": (0.30, -0.95),
}

#: The 23 bipolar derivations, in the order of the CHB-MIT scalp recordings (which also
#: repeat T8-P8 and carry P7-T7 = -(T7-P7)); channel i of a window is ``EEG_CHANNELS[i]``.
EEG_CHANNELS = (
    "FP1-F7", "F7-T7", "T7-P7", "P7-O1",
    "FP1-F3", "F3-C3", "C3-P3", "P3-O1",
    "FP2-F4", "F4-C4", "C4-P4", "P4-O2",
    "FP2-F8", "F8-T8", "T8-P8", "P8-O2",
    "FZ-CZ", "CZ-PZ",
    "P7-T7", "T7-FT9", "FT9-FT10", "FT10-T8", "T8-P8",
)

_ENAMES = tuple(_ELECTRODES)
_EPOS = np.array([_ELECTRODES[e] for e in _ENAMES])
_PAIRS = np.array([[_ENAMES.index(a), _ENAMES.index(b)]
                   for a, b in (c.split("-") for c in EEG_CHANNELS)])
_FRONTAL = np.exp(-((_EPOS[:, 1] - 0.95) ** 2) / 0.08)          # blink field
_POSTERIOR = np.clip((0.2 - _EPOS[:, 1]) / 1.15, 0.0, 1.0) ** 1.5  # alpha weight
_TEMPORAL = np.array([1.0 if e in ("F7", "F8", "FT9", "FT10", "T7", "T8") else 0.0
                      for e in _ENAMES])                         # muscle field


def _pink(rng, n_sig, n, beta):
    """``n_sig`` unit-RMS 1/f**beta noises of length ``n`` (spectral shaping, 2n then crop)."""
    m = 2 * n
    spec = np.fft.rfft(rng.standard_normal((n_sig, m)), axis=1)
    f = np.fft.rfftfreq(m, 1.0 / EEG_FS)
    f[0] = f[1]
    spec *= f[None, :] ** (-beta / 2.0)
    spec[:, 0] = 0.0
    sig = np.fft.irfft(spec, m, axis=1)[:, n // 2: n // 2 + n]
    return sig / sig.std(axis=1, keepdims=True)


def _gauss(t, centre, width):
    return np.exp(-0.5 * ((t - centre) / width) ** 2)


def _background(rng, t, n, e, artifacts=True):
    """Electrode potentials without a seizure: pink noise, alpha/theta/beta, artifacts."""
    flags = {}
    # Pink background, part common to all electrodes (cancels in bipolar) part local.
    beta = rng.uniform(0.8, 1.6)
    rms = rng.uniform(12.0, 35.0)
    rho = rng.uniform(0.2, 0.6)
    noise = _pink(rng, e + 1, n, beta)
    sig = rms * (np.sqrt(rho) * noise[-1:] + np.sqrt(1 - rho) * noise[:e])
    sig *= rng.lognormal(0.0, 0.15, size=(e, 1))  # per-electrode impedance / gain
    # Posterior-dominant alpha, waxing and waning; absent (eyes open) in some windows.
    if rng.random() < 0.8:
        fa = rng.uniform(8.0, 12.0)
        amp = rng.uniform(5.0, 45.0)
        env = 1.0 + 0.4 * np.sin(2 * np.pi * rng.uniform(0.3, 2.0) * t + rng.uniform(0, 2 * np.pi))
        ph = rng.uniform(0, 2 * np.pi) + rng.normal(0, 0.3, size=(e, 1))
        sig += amp * _POSTERIOR[:, None] * env * np.sin(2 * np.pi * fa * t + ph)
        flags["alpha"] = True
    # Drowsy theta (4-7 Hz), smooth and diffuse: a hard negative near the seizure band.
    if rng.random() < 0.25:
        ft = rng.uniform(4.0, 7.0)
        w = np.exp(-np.sum((_EPOS - rng.uniform(-0.6, 0.6, 2)) ** 2, axis=1) / 0.8)
        sig += rng.uniform(10.0, 40.0) * w[:, None] * np.sin(2 * np.pi * ft * t + rng.uniform(0, 6.3))
        flags["theta"] = True
    # Frontal beta.
    if rng.random() < 0.5:
        fb = rng.uniform(14.0, 28.0)
        w = np.clip(_EPOS[:, 1] + 0.3, 0, None)
        sig += rng.uniform(2.0, 8.0) * w[:, None] * np.sin(2 * np.pi * fb * t + rng.normal(0, 1, (e, 1)))
    # Eye blink: large slow frontal deflection, 1-3 Hz content (the classic confounder).
    if artifacts and rng.random() < 0.3:
        width = rng.uniform(0.04, 0.10)
        sig += rng.uniform(80.0, 250.0) * _FRONTAL[:, None] * _gauss(t, rng.uniform(0.0, 1.0), width)
        flags["blink"] = True
    # Muscle (EMG): broadband 20-100 Hz bursts over temporal electrodes.
    if artifacts and rng.random() < 0.15:
        emg = rng.standard_normal((e, n))
        spec = np.fft.rfft(emg, axis=1)
        f = np.fft.rfftfreq(n, 1.0 / EEG_FS)
        spec[:, (f < 20) | (f > 100)] = 0.0
        emg = np.fft.irfft(spec, n, axis=1)
        emg /= emg.std() + 1e-12
        c, d = rng.uniform(0, 1), rng.uniform(0.1, 0.5)
        sig += rng.uniform(10.0, 40.0) * _TEMPORAL[:, None] * emg * _gauss(t, c, d)
        flags["muscle"] = True
    # Electrode pop: one electrode, step then exponential decay.
    if artifacts and rng.random() < 0.05:
        k = rng.integers(e)
        t0 = rng.uniform(0.0, 0.9)
        sig[k] += rng.uniform(50.0, 200.0) * (t >= t0) * np.exp(-(t - t0).clip(0) / rng.uniform(0.05, 0.3))
        flags["pop"] = True
    # Mains interference, slightly different at each electrode.
    if artifacts and rng.random() < 0.3:
        sig += rng.uniform(0.5, 4.0, size=(e, 1)) * np.sin(2 * np.pi * 60.0 * t + rng.uniform(0, 6.3))
        flags["line"] = True
    return sig, flags


def _spike_wave(rng, t, e):
    """Electrode potentials of one spike-and-wave discharge and its parameters."""
    f0 = rng.uniform(2.5, 3.6)                    # discharge rate, Hz
    chirp = rng.uniform(-0.4, 0.0)                # rate slows down over the second
    onset = rng.uniform(-0.5, 0.55)               # s; < 0 means started before the window
    ramp = rng.uniform(0.05, 0.3)                 # s to full amplitude
    amp = rng.uniform(150.0, 450.0)               # uV at the focus
    spread = rng.uniform(0.25, 1.6)               # field sigma: focal ... generalized
    focus = rng.integers(e)
    w_spike = rng.uniform(0.006, 0.015)           # s, spike sigma (20-70 ms spikes)
    wave_ratio = rng.uniform(0.6, 1.2)            # slow wave / spike amplitude
    d = np.linalg.norm(_EPOS - _EPOS[focus], axis=1)
    gain = np.exp(-0.5 * (d / spread) ** 2) * rng.uniform(0.6, 1.4, size=e)
    lag = d * rng.uniform(0.0, 0.02)              # s, propagation away from the focus
    # Discharge times over the window (and a bit before it, for ongoing seizures).
    times, tk = [], onset
    while tk < t[-1] + 0.5:
        times.append(tk + rng.normal(0, 0.004))
        tk += 1.0 / max(f0 + chirp * max(tk, 0.0), 1.5)
    times = np.array(times)
    period = 1.0 / f0
    # One discharge: sharp surface-negative spike, small after-positivity, broad negative
    # slow wave; minus its mean over a cycle (EEG amplifiers are AC-coupled).
    a_pos, w_pos = 0.3, 2.0 * w_spike
    w_wave = 0.17 * period
    dc = (-w_spike + a_pos * w_pos - wave_ratio * w_wave) * np.sqrt(2 * np.pi) / period
    out = np.zeros((e, t.size))
    for k in range(e):
        dt = (t - lag[k])[None, :] - times[:, None]
        spike = -_gauss(dt, 0.0, w_spike) + a_pos * _gauss(dt, 2.5 * w_spike, w_pos)
        wave = -wave_ratio * _gauss(dt, 0.45 * period, w_wave)
        out[k] = (spike + wave).sum(axis=0) - dc
    env = np.clip((t - onset) / ramp, 0.0, 1.0)
    env = env * env * (3 - 2 * env)               # smoothstep ramp-up after onset
    params = dict(onset=onset, rate_hz=f0, amplitude_uv=amp, spread=spread, focus=_ENAMES[focus])
    return amp * gain[:, None] * env[None, :] * out, params


def eeg_windows(n, seed, *, seizure_fraction=0.5, artifacts=True, return_meta=False):
    """Generate ``n`` **SYNTHETIC** 23-channel, 1 s, 256 Hz scalp-EEG windows.

    Returns ``(x, y)``: ``x`` float32 ``[n, 23, 256]`` in microvolts (bipolar montage
    :data:`EEG_CHANNELS`), ``y`` int64 with 1 for a window containing a seizure. Exactly
    ``round(n * seizure_fraction)`` windows are seizures, in shuffled order. With
    ``return_meta=True`` a third item lists per-window parameters (dicts);
    ``artifacts=False`` leaves out blinks, muscle, pops and mains hum (other draws follow).

    This is a signal model, not recorded data. Each window simulates the 21 electrode
    potentials and takes bipolar differences (so P7-T7 = -(T7-P7) and T8-P8 appears twice,
    as in CHB-MIT):

    * background: 1/f^beta noise (beta 0.8-1.6, 12-35 uV RMS), partly shared across
      electrodes, per-electrode gains (lognormal, sigma 0.15);
    * rhythms: posterior-weighted alpha 8-12 Hz with waxing/waning envelope (80 % of
      windows), diffuse drowsy theta 4-7 Hz (25 %), frontal beta (50 %);
    * artifacts: eye blinks (frontal, 80-250 uV, 30 %), temporal muscle bursts (15 %),
      electrode pops (5 %), 60 Hz mains (30 %);
    * seizures: rhythmic spike-and-wave at 2.5-3.6 Hz slowing slightly, 150-450 uV at a
      random focus electrode, Gaussian field of sigma 0.25 (focal) to 1.6 (generalized)
      head radii with per-electrode jitter and propagation lag, onset from 0.5 s before
      the window to 0.55 s into it (at least ~1.5 discharges visible) with a 50-300 ms
      ramp-up;
    * per-channel amplifier gain (lognormal, sigma 0.1) and 1-2 uV white noise.

    The same ``seed`` always gives the same windows; different seeds are independent draws.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = np.random.default_rng(seed)
    t = np.arange(EEG_SAMPLES) / EEG_FS
    e = len(_ENAMES)
    n_seiz = int(round(n * seizure_fraction))
    y = np.zeros(n, dtype=np.int64)
    y[:n_seiz] = 1
    rng.shuffle(y)
    x = np.empty((n, len(EEG_CHANNELS), EEG_SAMPLES), dtype=np.float32)
    meta = []
    for i in range(n):
        elec, info = _background(rng, t, EEG_SAMPLES, e, artifacts)
        if y[i]:
            sw, params = _spike_wave(rng, t, e)
            elec += sw
            info.update(params)
        chans = elec[_PAIRS[:, 0]] - elec[_PAIRS[:, 1]]
        chans *= rng.lognormal(0.0, 0.1, size=(len(EEG_CHANNELS), 1))
        chans += rng.uniform(1.0, 2.0) * rng.standard_normal(chans.shape)
        x[i] = chans
        info["seizure"] = bool(y[i])
        meta.append(info)
    return (x, y, meta) if return_meta else (x, y)


def eeg_model_input(x_uv):
    """Windows in microvolts ``[n, 23, 256]`` -> ``eeg-seizure`` input ``[n, 23, 1, 256]`` float32.

    The model input is microvolts / :data:`EEG_SCALE_UV` (units of 100 uV), laid out as
    NCHW with the 23 EEG channels as C, H = 1 and time as W.
    """
    x = np.asarray(x_uv, dtype=np.float32)
    return (x / np.float32(EEG_SCALE_UV))[:, :, None, :]


def eeg_split(n_train=EEG_N_TRAIN, n_test=EEG_N_TEST, train_seed=EEG_TRAIN_SEED,
              test_seed=EEG_TEST_SEED):
    """Return ``(x_train, y_train, x_test, y_test)`` exactly as ``eeg-seizure`` was trained and measured.

    ``x`` is the model input (see :func:`eeg_model_input`), ``y`` is 1 for seizure. Half
    of each set are seizure windows; training and test windows come from different seeds.
    ``eeg_split(n_train=0)`` gives just the held-out windows (fast: about a second).
    """
    x_tr, y_tr = eeg_windows(n_train, train_seed)
    x_te, y_te = eeg_windows(n_test, test_seed)
    return eeg_model_input(x_tr), y_tr, eeg_model_input(x_te), y_te
