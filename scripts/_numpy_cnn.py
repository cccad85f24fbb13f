"""A tiny numpy CNN trainer shared by ``scripts/train_*.py`` (no PyTorch needed).

Layers work on NCHW float32 batches and know how to write themselves as ONNX nodes, so the
trained network and the exported graph are the same list of objects:

    Conv(in, out, (kh, kw), pad) -> Relu -> MaxPool((kh, kw)) -> ... -> Flatten -> Gemm

Training is plain mini-batch Adam on softmax cross-entropy. Everything is seeded; with the
same numpy/OpenBLAS build a run reproduces the committed weights bit for bit (different
BLAS builds may differ in the last float bits).
"""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
IR_VERSION = 8  # readable by onnx >= 1.10 / onnxruntime >= 1.10


class Layer:
    params = ()

    def grads(self):
        return ()


class Conv(Layer):
    """2-D convolution, stride 1, symmetric zero padding ``pad = (ph, pw)``."""

    def __init__(self, rng, cin, cout, kernel, pad):
        kh, kw = kernel
        fan_in = cin * kh * kw
        self.w = (rng.standard_normal((cout, cin, kh, kw)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        self.b = np.zeros(cout, np.float32)
        self.kernel, self.pad = (kh, kw), tuple(pad)
        self.params = (self.w, self.b)

    def forward(self, x):
        ph, pw = self.pad
        kh, kw = self.kernel
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        win = sliding_window_view(xp, (kh, kw), axis=(2, 3))  # N C Ho Wo kh kw
        n, c, ho, wo = win.shape[:4]
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, c * kh * kw)
        self._cache = (x.shape, cols, ho, wo)
        y = cols @ self.w.reshape(self.w.shape[0], -1).T + self.b
        return y.reshape(n, ho, wo, -1).transpose(0, 3, 1, 2)

    def backward(self, dy):
        xshape, cols, ho, wo = self._cache
        n, c, h, w = xshape
        kh, kw = self.kernel
        ph, pw = self.pad
        cout = self.w.shape[0]
        dy2 = dy.transpose(0, 2, 3, 1).reshape(-1, cout)
        self.dw = (dy2.T @ cols).reshape(self.w.shape)
        self.db = dy2.sum(0)
        dcols = (dy2 @ self.w.reshape(cout, -1)).reshape(n, ho, wo, c, kh, kw)
        dxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), np.float32)
        for i in range(kh):
            for j in range(kw):
                dxp[:, :, i:i + ho, j:j + wo] += dcols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
        return dxp[:, :, ph:ph + h, pw:pw + w]

    def grads(self):
        return (self.dw, self.db)

    def onnx(self, name, x, y):
        kh, kw = self.kernel
        ph, pw = self.pad
        inits = [numpy_helper.from_array(self.w, f"{name}.weight"),
                 numpy_helper.from_array(self.b, f"{name}.bias")]
        node = helper.make_node("Conv", [x, f"{name}.weight", f"{name}.bias"], [y], name=name,
                                kernel_shape=[kh, kw], pads=[ph, pw, ph, pw], strides=[1, 1])
        return [node], inits


class Relu(Layer):
    def forward(self, x):
        self._mask = x > 0
        return x * self._mask

    def backward(self, dy):
        return dy * self._mask

    def onnx(self, name, x, y):
        return [helper.make_node("Relu", [x], [y], name=name)], []


class MaxPool(Layer):
    """Non-overlapping max pooling (kernel = stride); H and W must divide evenly."""

    def __init__(self, kernel):
        self.kernel = tuple(kernel)

    def forward(self, x):
        kh, kw = self.kernel
        n, c, h, w = x.shape
        blocks = x.reshape(n, c, h // kh, kh, w // kw, kw).transpose(0, 1, 2, 4, 3, 5)
        blocks = blocks.reshape(n, c, h // kh, w // kw, kh * kw)
        arg = blocks.argmax(-1)
        self._cache = (x.shape, arg)
        return np.take_along_axis(blocks, arg[..., None], -1)[..., 0]

    def backward(self, dy):
        (n, c, h, w), arg = self._cache
        kh, kw = self.kernel
        d = np.zeros((n, c, h // kh, w // kw, kh * kw), np.float32)
        np.put_along_axis(d, arg[..., None], dy[..., None], -1)
        d = d.reshape(n, c, h // kh, w // kw, kh, kw).transpose(0, 1, 2, 4, 3, 5)
        return d.reshape(n, c, h, w)

    def onnx(self, name, x, y):
        kh, kw = self.kernel
        return [helper.make_node("MaxPool", [x], [y], name=name,
                                 kernel_shape=[kh, kw], strides=[kh, kw])], []


class GlobalAveragePool(Layer):
    def forward(self, x):
        self._shape = x.shape
        return x.mean(axis=(2, 3), keepdims=True)

    def backward(self, dy):
        n, c, h, w = self._shape
        return np.broadcast_to(dy / (h * w), self._shape).astype(np.float32)

    def onnx(self, name, x, y):
        return [helper.make_node("GlobalAveragePool", [x], [y], name=name)], []


class Flatten(Layer):
    def forward(self, x):
        self._shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy):
        return dy.reshape(self._shape)

    def onnx(self, name, x, y):
        return [helper.make_node("Flatten", [x], [y], name=name, axis=1)], []


class Gemm(Layer):
    """Fully connected: ``y = x @ W.T + b`` (ONNX Gemm with transB=1)."""

    def __init__(self, rng, cin, cout, gain=2.0):
        self.w = (rng.standard_normal((cout, cin)) * np.sqrt(gain / cin)).astype(np.float32)
        self.b = np.zeros(cout, np.float32)
        self.params = (self.w, self.b)

    def forward(self, x):
        self._x = x
        return x @ self.w.T + self.b

    def backward(self, dy):
        self.dw = dy.T @ self._x
        self.db = dy.sum(0)
        return dy @ self.w

    def grads(self):
        return (self.dw, self.db)

    def onnx(self, name, x, y):
        inits = [numpy_helper.from_array(self.w, f"{name}.weight"),
                 numpy_helper.from_array(self.b, f"{name}.bias")]
        node = helper.make_node("Gemm", [x, f"{name}.weight", f"{name}.bias"], [y], name=name,
                                alpha=1.0, beta=1.0, transB=1)
        return [node], inits


class Net:
    def __init__(self, layers, names):
        self.layers, self.names = layers, names

    def forward(self, x):
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dy):
        for layer in reversed(self.layers):
            dy = layer.backward(dy)

    def params(self):
        return [p for layer in self.layers for p in layer.params]

    def grads(self):
        return [g for layer in self.layers for g in layer.grads()]

    def predict(self, x, batch=500):
        return np.concatenate([self.forward(x[i:i + batch]) for i in range(0, len(x), batch)])

    def to_onnx(self, graph_name, input_name, input_shape, output_name, doc, metadata):
        nodes, inits = [], []
        cur = input_name
        for i, (layer, name) in enumerate(zip(self.layers, self.names)):
            out = output_name if i == len(self.layers) - 1 else f"{name}.out"
            n, ini = layer.onnx(name, cur, out)
            nodes += n
            inits += ini
            cur = out
        x = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(input_shape))
        probe = self.forward(np.zeros(input_shape, np.float32))
        y = helper.make_tensor_value_info(output_name, TensorProto.FLOAT, list(probe.shape))
        graph = helper.make_graph(nodes, graph_name, [x], [y], initializer=inits, doc_string=doc)
        model = helper.make_model(graph, producer_name="dnnfab-scripts",
                                  opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        model.doc_string = doc
        helper.set_model_props(model, {k: str(v) for k, v in metadata.items()})
        onnx.checker.check_model(model, full_check=True)
        return model


def softmax_xent(logits, y, class_weight=None):
    """Mean cross-entropy and its gradient w.r.t. the logits."""
    z = logits - logits.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y] + 1e-12).mean()
    d = p.copy()
    d[np.arange(n), y] -= 1.0
    return loss, (d / n).astype(np.float32)


class Adam:
    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0):
        self.params, self.lr, self.b1, self.b2, self.eps, self.wd = params, lr, b1, b2, eps, weight_decay
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads):
        self.t += 1
        c1 = 1 - self.b1 ** self.t
        c2 = 1 - self.b2 ** self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            if self.wd and p.ndim > 1:  # decoupled weight decay on weights, not biases
                p -= self.lr * self.wd * p
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            p -= (self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)).astype(np.float32)


def train(net, x, y, *, epochs, batch, lr, seed, weight_decay=0.0, augment=None, log=print):
    """Mini-batch Adam with a cosine learning-rate schedule; returns the loss per epoch."""
    rng = np.random.default_rng(seed)
    opt = Adam(net.params(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = (len(x) + batch - 1) // batch
    total = epochs * steps_per_epoch
    history = []
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        losses = []
        for s in range(steps_per_epoch):
            idx = order[s * batch:(s + 1) * batch]
            xb = x[idx]
            if augment is not None:
                xb = augment(rng, xb)
            opt.lr = lr * 0.5 * (1 + np.cos(np.pi * (epoch * steps_per_epoch + s) / total))
            logits = net.forward(xb)
            loss, d = softmax_xent(logits, y[idx])
            net.backward(d)
            opt.step(net.grads())
            losses.append(loss)
        history.append(float(np.mean(losses)))
        log(f"epoch {epoch + 1:3d}/{epochs}  loss {history[-1]:.4f}")
    return history


def gradient_check(seed=0):
    """Finite-difference check (float64) of every layer's backward pass; returns the worst
    relative error (about 1e-6 when correct). Run: ``python scripts/_numpy_cnn.py``."""
    rng = np.random.default_rng(seed)
    layers = [Conv(rng, 2, 3, (3, 3), (1, 1)), Relu(), MaxPool((2, 2)), Conv(rng, 3, 4, (1, 3), (0, 1)),
              Relu(), GlobalAveragePool(), Flatten(), Gemm(rng, 4, 3)]
    for layer in layers:
        if layer.params:
            layer.w, layer.b = layer.w.astype(np.float64), layer.b.astype(np.float64)
            layer.params = (layer.w, layer.b)
    net = Net(layers, [str(i) for i in range(len(layers))])
    x = rng.standard_normal((2, 2, 4, 6))
    y = np.array([0, 2])
    loss, d = softmax_xent(net.forward(x), y)
    net.backward(d.astype(np.float64))
    worst = 0.0
    for p, g in zip(net.params(), net.grads()):
        flat, gflat = p.reshape(-1), g.reshape(-1)
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + 1e-5
            up = softmax_xent(net.forward(x), y)[0]
            flat[i] = old - 1e-5
            down = softmax_xent(net.forward(x), y)[0]
            flat[i] = old
            num = (up - down) / 2e-5
            worst = max(worst, abs(num - gflat[i]) / max(1e-6, abs(num) + abs(gflat[i])))
    return worst


if __name__ == "__main__":
    print("worst relative gradient error:", gradient_check())
