#!/usr/bin/env python3
"""PyTorch reference for stylegan: StyleGAN v1's training step (NVlabs/stylegan training/networks_stylegan.py with
training_loop.py's schedule: the D step with the R1 penalty, gamma 10, then the G step; Adam lr 0.003 betas (0, 0.99)),
written here from its architecture as models/vision/stylegan.h describes it, so that it runs on a current PyTorch,
on the same GPU as the engine, in the same run.

Same as the engine: the fixed structure at --resolution (default 1024), mapping 8 x 512 (lrmul 0.01, pixel norm),
the learned 4x4 constant, noise, instance norm (eps 1e-8), style modulation, [1,2,1] blur, the fused resampling
convs from 128 up (the summed 4x4 kernels), D_basic with minibatch stddev (group 4), softplus losses, R1 through
torch.autograd.grad(create_graph=True), style mixing 0.9, Gs moving average. channels_last, cudnn.benchmark, bf16
through autocast, and (--conv gradfix, the default) convolutions whose derivatives of every order are convolutions
(_Conv below: without it PyTorch's double backward of a convolution took 6-8 s a step). Not the same: PyTorch keeps
its caching allocator's free blocks (peak = max_memory_allocated).

Prints: torch stylegan R batch B precision | img/s | ms | peak GiB
Usage: python3 tools/bench/stylegan_torch.py --batch 4 --precision fp32|tf32|bf16 [--resolution 1024]
       [--blur depthwise|planes] [--memory-format channels_last|contiguous] [--conv gradfix|autograd] [--profile]
       python3 tools/bench/stylegan_torch.py --precision fp32 --max-batch-cap-gib 22.81
"""
import argparse
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_bench import add_run_args, measure, release, run_main

SQRT2 = math.sqrt(2)
BLUR = "depthwise"  # --blur: how blur() runs the filter (main sets it; stylegan_parity.py keeps the default)
CONV = "autograd"  # --conv: how conv2d() differentiates (main sets it; stylegan_parity.py keeps autograd's)
# The network's widths (stylegan_parity.py sets the engine's tiny ones): latent = dlatent = mapping width.
SHAPE = {"latent": 512, "mapping_layers": 8, "fmap_base": 8192, "fmap_max": 512}


def nf(stage):
    return min(SHAPE["fmap_base"] >> stage, SHAPE["fmap_max"])


class _Conv(torch.autograd.Function):
    """y = conv2d(x, w): its backward is made of _Dgrad and _Wgrad, whose backward are again _Conv, _Dgrad and
    _Wgrad, so the R1 penalty's second backward runs on cuDNN's forward, data-gradient and weight-gradient
    kernels. PyTorch's own double backward of a convolution (aten's _convolution_double_backward) instead convolves
    with the output gradient as the kernel: cuDNN falls back to implicit_convolve_sgemm at up to 217 ms a call on
    the H200 (stylegan 1024, batch 4: 6-8 s a step). StyleGAN2-ADA's conv2d_gradfix answers the same problem."""

    @staticmethod
    def forward(ctx, x, w, stride, padding, groups):
        ctx.save_for_backward(x, w)
        ctx.conf = (stride, padding, groups)
        return F.conv2d(x, w, None, stride, padding, 1, groups)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        gx = _Dgrad.apply(gy, w, x.shape, *ctx.conf) if ctx.needs_input_grad[0] else None
        gw = _Wgrad.apply(x, gy, w.shape, *ctx.conf) if ctx.needs_input_grad[1] else None
        return gx, gw, None, None, None


class _Dgrad(torch.autograd.Function):
    """gx = conv2d's input gradient from gy and w: linear in gy (its adjoint is the convolution) and in w (the
    weight gradient of a convolution of the incoming gradient with gy as output gradient)."""

    @staticmethod
    def forward(ctx, gy, w, x_shape, stride, padding, groups):
        ctx.save_for_backward(gy, w)
        ctx.conf = (stride, padding, groups)
        return torch.nn.grad.conv2d_input(x_shape, w, gy, stride, padding, 1, groups)

    @staticmethod
    def backward(ctx, ggx):
        gy, w = ctx.saved_tensors
        g_gy = _Conv.apply(ggx, w, *ctx.conf) if ctx.needs_input_grad[0] else None
        g_w = _Wgrad.apply(ggx, gy, w.shape, *ctx.conf) if ctx.needs_input_grad[1] else None
        return g_gy, g_w, None, None, None, None


class _Wgrad(torch.autograd.Function):
    """gw = conv2d's weight gradient from x and gy: <ggw, gw> = <conv2d(x, ggw), gy>, so its input gradient is the
    data gradient of gy through ggw and its output-gradient gradient the convolution of x with ggw."""

    @staticmethod
    def forward(ctx, x, gy, w_shape, stride, padding, groups):
        ctx.save_for_backward(x, gy)
        ctx.conf = (stride, padding, groups)
        return torch.nn.grad.conv2d_weight(x, w_shape, gy, stride, padding, 1, groups)

    @staticmethod
    def backward(ctx, ggw):
        x, gy = ctx.saved_tensors
        g_x = _Dgrad.apply(gy, ggw, x.shape, *ctx.conf) if ctx.needs_input_grad[0] else None
        g_gy = _Conv.apply(x, ggw, *ctx.conf) if ctx.needs_input_grad[1] else None
        return g_x, g_gy, None, None, None, None


def conv2d(x, w, stride=1, padding=0, groups=1):
    """F.conv2d, differentiated as --conv says: autograd (PyTorch's double backward) or gradfix (_Conv). Under
    autocast, gradfix casts both operands to bf16 first (as autocast's conv2d does) and runs the Function without
    autocast, so every order of its derivative sees one dtype."""
    if CONV == "autograd":
        return F.conv2d(x, w, stride=stride, padding=padding, groups=groups)
    if torch.is_autocast_enabled("cuda"):
        x, w = x.to(torch.bfloat16), w.to(torch.bfloat16)
        with torch.autocast("cuda", enabled=False):
            return _Conv.apply(x, w, stride, padding, groups)
    return _Conv.apply(x, w, stride, padding, groups)


class EqLinear(nn.Module):
    def __init__(self, i, o, gain=SQRT2, lrmul=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i) / lrmul)
        self.bias = nn.Parameter(torch.zeros(o))
        self.coef, self.lrmul = gain / math.sqrt(i) * lrmul, lrmul

    def forward(self, x):
        return F.linear(x, self.weight * self.coef, self.bias * self.lrmul)


class EqConv(nn.Module):
    def __init__(self, i, o, k, gain=SQRT2, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i, k, k))
        self.bias = nn.Parameter(torch.zeros(o)) if bias else None
        self.coef, self.k = gain / math.sqrt(i * k * k), k

    def w(self):
        return self.weight * self.coef

    def conv(self, x):
        return conv2d(x, self.w(), padding=self.k // 2)

    def conv_up(self, x, fused):
        if not fused:
            return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))
        w = F.pad(self.w(), (1, 1, 1, 1))
        w = w[:, :, 1:, 1:] + w[:, :, :-1, 1:] + w[:, :, 1:, :-1] + w[:, :, :-1, :-1]
        return F.conv_transpose2d(x, w.transpose(0, 1), stride=2, padding=1)

    def conv_down(self, x, fused):
        if not fused:
            return F.avg_pool2d(self.conv(x), 2)
        w = F.pad(self.w(), (1, 1, 1, 1))
        w = (w[:, :, 1:, 1:] + w[:, :, :-1, 1:] + w[:, :, 1:, :-1] + w[:, :, :-1, :-1]) * 0.25
        return conv2d(x, w, stride=2, padding=1)


def wide(x):
    """Statistics in f32 at least (StyleGAN casts fp16 to f32 for them); f64 stays f64 (the parity reference)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def blur(x):
    """The [1,2,1] x [1,2,1] / 16 filter on every channel. --blur depthwise: one grouped conv (groups = channels), as
    NVlabs' reference; --blur planes: every (image, channel) plane as its own 1-channel image of one conv, for when
    cuDNN's grouped kernels are slow at these sizes (pytorch/pytorch#34977 shows them 100x off in channels_last)."""
    n, c, h, w = x.shape
    k = torch.tensor([1.0, 2.0, 1.0], device=x.device, dtype=x.dtype)
    k = (k[:, None] * k[None, :]) / 16
    if BLUR == "planes":
        return conv2d(x.reshape(n * c, 1, h, w), k.view(1, 1, 3, 3), padding=1).view(n, c, h, w)
    return conv2d(x, k.expand(c, 1, 3, 3), padding=1, groups=c)


class SynthLayer(nn.Module):
    def __init__(self, kind, i, o, fused=False):
        super().__init__()
        self.kind, self.fused = kind, fused
        if kind == "const":
            self.const = nn.Parameter(torch.ones(1, o, 4, 4))
        else:
            self.conv = EqConv(i, o, 3, bias=False)
        self.noise_strength = nn.Parameter(torch.zeros(o))
        self.bias = nn.Parameter(torch.zeros(o))
        self.style = EqLinear(SHAPE["latent"], 2 * o, gain=1.0)

    def forward(self, x, w):
        if self.kind == "const":
            x = self.const.expand(w.shape[0], -1, -1, -1)
        elif self.kind == "up":
            x = blur(self.conv.conv_up(x, self.fused))
        else:
            x = self.conv.conv(x)
        n, c, h, wd = x.shape
        x = x + torch.randn(n, 1, h, wd, device=x.device, dtype=x.dtype) * self.noise_strength.view(1, -1, 1, 1)
        x = F.leaky_relu(x + self.bias.view(1, -1, 1, 1), 0.2)
        x = F.instance_norm(wide(x), eps=1e-8).to(x.dtype)
        s = self.style(w).view(n, 2, c, 1, 1)
        return x * (s[:, 0] + 1) + s[:, 1]


class Generator(nn.Module):
    def __init__(self, res):
        super().__init__()
        z = SHAPE["latent"]
        self.mapping = nn.ModuleList([EqLinear(z, z, lrmul=0.01) for _ in range(SHAPE["mapping_layers"])])
        layers = [SynthLayer("const", 0, nf(1)), SynthLayer("conv", nf(1), nf(1))]
        for r in range(3, int(math.log2(res)) + 1):
            layers += [SynthLayer("up", nf(r - 2), nf(r - 1), fused=2 ** r >= 128),
                       SynthLayer("conv", nf(r - 1), nf(r - 1))]
        self.layers = nn.ModuleList(layers)
        self.to_rgb = EqConv(nf(int(math.log2(res)) - 1), 3, 1, gain=1.0)

    def map(self, z):
        x = z * torch.rsqrt(z.pow(2).mean(1, keepdim=True) + 1e-8)
        for l in self.mapping:
            x = F.leaky_relu(l(x), 0.2)
        return x

    def forward(self, z, mix):
        w = self.map(z)
        cutoff, w2 = len(self.layers), None
        if mix and random.random() < 0.9:
            cutoff = random.randrange(1, len(self.layers))
            w2 = self.map(torch.randn_like(z))
        x = None
        for i, l in enumerate(self.layers):
            x = l(x, w if i < cutoff else w2)
        return self.to_rgb.conv(x) + self.to_rgb.bias.view(1, -1, 1, 1)


class Discriminator(nn.Module):
    def __init__(self, res):
        super().__init__()
        top = int(math.log2(res))
        self.from_rgb = EqConv(3, nf(top - 1), 1)
        self.blocks = nn.ModuleList()
        self.fused = []
        for r in range(top, 2, -1):
            self.blocks.append(nn.ModuleList([EqConv(nf(r - 1), nf(r - 1), 3), EqConv(nf(r - 1), nf(r - 2), 3)]))
            self.fused.append(2 ** r >= 128)
        self.conv4 = EqConv(nf(1) + 1, nf(1), 3)
        self.dense0 = EqLinear(nf(1) * 16, nf(0))
        self.dense1 = EqLinear(nf(0), 1, gain=1.0)

    def forward(self, x):
        act = lambda t, conv: F.leaky_relu(t + conv.bias.view(1, -1, 1, 1), 0.2)
        x = act(self.from_rgb.conv(x), self.from_rgb)
        for (c0, c1), fused in zip(self.blocks, self.fused):
            x = act(c0.conv(x), c0)
            x = act(c1.conv_down(blur(x), fused), c1)
        n, c, h, w = x.shape
        g = min(4, n)
        while n % g:
            g -= 1
        y = wide(x).view(g, -1, c, h, w)
        y = torch.sqrt((y - y.mean(0, keepdim=True)).pow(2).mean(0) + 1e-8).mean([1, 2, 3])
        y = y.to(x.dtype).view(1, -1, 1, 1, 1).expand(g, -1, 1, h, w).reshape(n, 1, h, w)
        x = act(self.conv4.conv(torch.cat([x, y], 1)), self.conv4)
        x = F.leaky_relu(self.dense0(x.flatten(1)), 0.2)
        return self.dense1(x)


def run_config(batch, steps, warmup):
    dev = torch.device("cuda")
    res = ARGS.resolution
    G, D = Generator(res).to(dev), Discriminator(res).to(dev)
    Gs = [p.detach().clone() for p in G.parameters()]
    fmt = torch.channels_last if ARGS.memory_format == "channels_last" else torch.contiguous_format
    for m in (G, D):
        m.to(memory_format=fmt).train()
    opt_g = torch.optim.Adam(G.parameters(), lr=0.003, betas=(0.0, 0.99), eps=1e-8)
    opt_d = torch.optim.Adam(D.parameters(), lr=0.003, betas=(0.0, 0.99), eps=1e-8)
    amp = ARGS.precision == "bf16"
    real = (torch.rand(batch, 3, res, res, device=dev) * 2 - 1).to(memory_format=fmt)
    beta = 0.5 ** (batch / 10000)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            with torch.no_grad():
                fake = G(torch.randn(batch, SHAPE["latent"], device=dev), True)
            x = real.detach().requires_grad_(True)
            real_scores, fake_scores = D(x), D(fake)
            (grad,) = torch.autograd.grad(real_scores.sum(), x, create_graph=True)
            r1 = grad.float().pow(2).sum([1, 2, 3])
            loss_d = (F.softplus(fake_scores) + F.softplus(-real_scores)).float().squeeze(1) + r1 * 5.0
        opt_d.zero_grad(set_to_none=True)
        loss_d.mean().backward()
        opt_d.step()
        with torch.no_grad():
            for s, p in zip(Gs, G.parameters()):
                s.lerp_(p, 1 - beta)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss_g = F.softplus(-D(G(torch.randn(batch, SHAPE["latent"], device=dev), True))).mean()
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        opt_d.zero_grad(set_to_none=True)

    try:
        return measure(step, steps, warmup, ARGS.profile)
    finally:
        del G, D, Gs, opt_g, opt_d, real
        release()


def main():
    global BLUR, CONV
    BLUR, CONV = ARGS.blur, ARGS.conv
    random.seed(1)
    run_main(ARGS, f"torch stylegan {ARGS.resolution} ({ARGS.memory_format}, blur {ARGS.blur}, conv {ARGS.conv})",
             run_config)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_run_args(p, batch=4)
    p.add_argument("--resolution", type=int, default=1024)
    p.add_argument("--blur", default="depthwise", choices=["depthwise", "planes"])
    p.add_argument("--memory-format", default="channels_last", choices=["channels_last", "contiguous"])
    p.add_argument("--conv", default="gradfix", choices=["gradfix", "autograd"],
                   help="gradfix: convolutions whose double backward is made of convolutions (the fast one)")
    ARGS = p.parse_args()
    main()
