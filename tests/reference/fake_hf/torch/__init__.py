"""numpy stand-in for the few torch calls bench/device/hf_parity.py makes.

Only for test_hf_parity_offline.py, which puts this folder first on PYTHONPATH so that the
parity script's control flow (config, save, compare, report, exit codes) runs without torch.
"""
import contextlib
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tiny_model import bf16_round  # noqa: E402

__version__ = "0.0-fake"
float32, float64, bfloat16, long = "float32", "float64", "bfloat16", "long"
_FLOATS = (float32, float64, bfloat16)
backends = types.SimpleNamespace(
    cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=True)))
cuda = types.SimpleNamespace(is_available=lambda: False)


def set_float32_matmul_precision(precision):
    del precision


def no_grad():
    return contextlib.nullcontext()


def _cast(values, dtype):
    values = np.asarray(values, dtype=np.float64)
    if dtype == float32:
        return values.astype(np.float32).astype(np.float64)
    if dtype == bfloat16:
        return bf16_round(values)
    return values


class Tensor:
    def __init__(self, values, dtype=float32):
        self.a, self.dtype = np.asarray(values), dtype

    shape = property(lambda self: self.a.shape)

    def dim(self):
        return self.a.ndim

    def _arg(self, other):
        return other.a if isinstance(other, Tensor) else other

    def __add__(self, other):
        return Tensor(self.a + self._arg(other), self.dtype)

    __radd__ = __add__

    def __mul__(self, other):
        return Tensor(self.a * self._arg(other), self.dtype)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return Tensor(self.a / self._arg(other), self.dtype)

    def __getitem__(self, index):
        return Tensor(self.a[index], self.dtype)

    def to(self, target):
        return Tensor(_cast(self.a, target), target) if target in _FLOATS else self

    def copy_(self, other):
        self.a[...] = _cast(other.a, self.dtype)
        return self

    def float(self):
        return self.to(float32)

    def double(self):
        return self.to(float64)

    def cpu(self):
        return self

    def detach(self):
        return self

    def numpy(self):
        return self.a

    def data_ptr(self):
        return id(self.a)


class Generator:
    def manual_seed(self, seed):
        self.rng = np.random.default_rng(seed)
        return self


def randn(shape, generator=None, dtype=None):
    del dtype
    return Tensor(generator.rng.standard_normal(shape))


def tensor(data, dtype=None, device=None):
    del dtype, device
    return Tensor(np.asarray(data), long)
