# adafactor_reference.py: the reference values of tests/ops/optim_test.cpp's Optim.AdafactorMatchesPyTorch,
# from torch.optim.Adafactor (PyTorch >= 2.5) in float64.
#   python3 tests/data/optim/adafactor_reference.py      (prints the C++ arrays the test holds)
# Inputs: a [3, 4] matrix, a [2, 3, 2] tensor (factored over its last two dimensions) and a [5] vector, all
# with values i * 0.37 mod 1 - 0.5 style patterns; gradients per step s: sin(0.7 i + s) (i: the flat index).
# Three steps, lr 0.02, weight decay 0.1, the other options PyTorch's defaults (beta2_decay -0.8, eps (None, 1e-3),
# d 1.0).
import math
import torch

torch.set_default_dtype(torch.float64)
shapes = [(3, 4), (2, 3, 2), (5,)]


def init(shape, k):
    n = math.prod(shape)
    return torch.tensor([((i + 1) * 0.37 * (k + 1)) % 1.0 - 0.5 for i in range(n)]).reshape(shape)


def grad(shape, k, s):
    n = math.prod(shape)
    return torch.tensor([math.sin(0.7 * i + s + k) for i in range(n)]).reshape(shape)


params = [init(s, k).requires_grad_() for k, s in enumerate(shapes)]
opt = torch.optim.Adafactor(params, lr=0.02, weight_decay=0.1, foreach=False)
for step in range(1, 4):
    for k, (p, s) in enumerate(zip(params, shapes)):
        p.grad = grad(s, k, step)
    opt.step()
for k, p in enumerate(params):
    vals = ", ".join(f"{v:.17g}" for v in p.detach().flatten().tolist())
    print(f"// param {k} {list(shapes[k])}\n{{{vals}}},")
for k, p in enumerate(params):
    st = opt.state[p]
    for name in ("row_var", "col_var", "variance"):
        if st.get(name) is not None:
            vals = ", ".join(f"{v:.17g}" for v in st[name].flatten().tolist())
            print(f"// {name} of param {k} {list(st[name].shape)}\n{{{vals}}},")
