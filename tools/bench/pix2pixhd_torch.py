#!/usr/bin/env python3
"""PyTorch reference for pix2pixhd: NVIDIA/pix2pixHD's training step at 2048x1024 (train_1024p_24G.sh: --netG local
--ngf 32 --num_D 3, instance norm, LSGAN + feature matching (lambda 10) + VGG19 perceptual loss, Adam 2e-4 betas
(0.5, 0.999)), written here from its architecture (models/vision/pix2pixhd.h says it layer by layer) so that it runs
on a current PyTorch without the repository, on the same GPU as the engine, in the same run.

The step is train.py's: one forward computes every loss (G, D on the detached fake, D on the real image, D on the
fake for G), then G's Adam steps on loss_G, then D's zero_grad drops what loss_G left in D, loss_D's backward, D's
Adam. channels_last, cudnn.benchmark, bf16 through autocast. VGG19 has random weights (no download on the GPU
machine): the work is the same. Differences from the engine: PyTorch keeps its caching allocator's free blocks
(peak = max_memory_allocated, not the reserve), ReLU(inplace=True) as pix2pixHD writes it.

Prints: torch pix2pixhd WxH batch B precision | img/s | ms | peak GiB
Usage: python3 tools/bench/pix2pixhd_torch.py --precision fp32|tf32|bf16 [--batch 1 --steps 5 --warmup 2]
       python3 tools/bench/pix2pixhd_torch.py --precision fp32 --max-batch-cap-gib 22.81
       python3 tools/bench/pix2pixhd_torch.py --width 128 --height 64 --tiny   (the engine's --size tiny shapes)
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_bench import add_run_args, measure, release, run_main


def conv(i, o, k, s=1, p=0):
    c = nn.Conv2d(i, o, k, s, p)
    nn.init.normal_(c.weight, 0.0, 0.02)
    return c


class ResnetBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv_block = nn.Sequential(nn.ReflectionPad2d(1), conv(dim, dim, 3), nn.InstanceNorm2d(dim),
                                        nn.ReLU(True), nn.ReflectionPad2d(1), conv(dim, dim, 3),
                                        nn.InstanceNorm2d(dim))

    def forward(self, x):
        return x + self.conv_block(x)


def up(i, o):
    c = nn.ConvTranspose2d(i, o, 3, 2, 1, output_padding=1)
    nn.init.normal_(c.weight, 0.0, 0.02)
    return [c, nn.InstanceNorm2d(o), nn.ReLU(True)]


class LocalEnhancer(nn.Module):
    def __init__(self, in_nc, ngf, n_down, n_blocks, n_local):
        super().__init__()
        g = ngf * 2
        layers = [nn.ReflectionPad2d(3), conv(in_nc, g, 7), nn.InstanceNorm2d(g), nn.ReLU(True)]
        ch = g
        for _ in range(n_down):
            layers += [conv(ch, ch * 2, 3, 2, 1), nn.InstanceNorm2d(ch * 2), nn.ReLU(True)]
            ch *= 2
        layers += [ResnetBlock(ch) for _ in range(n_blocks)]
        for _ in range(n_down):
            layers += up(ch, ch // 2)
            ch //= 2
        self.model = nn.Sequential(*layers)
        self.model1_1 = nn.Sequential(nn.ReflectionPad2d(3), conv(in_nc, ngf, 7), nn.InstanceNorm2d(ngf), nn.ReLU(True),
                                      conv(ngf, ngf * 2, 3, 2, 1), nn.InstanceNorm2d(ngf * 2), nn.ReLU(True))
        self.model1_2 = nn.Sequential(*[ResnetBlock(ngf * 2) for _ in range(n_local)], *up(ngf * 2, ngf),
                                      nn.ReflectionPad2d(3), conv(ngf, 3, 7), nn.Tanh())

    def forward(self, x):
        half = F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
        return self.model1_2(self.model1_1(x) + self.model(half))


class MultiscaleD(nn.Module):
    def __init__(self, in_nc, ndf, num_d=3):
        super().__init__()
        self.scales = nn.ModuleList()
        for _ in range(num_d):
            chans = [in_nc, ndf, ndf * 2, ndf * 4, ndf * 8]
            layers = nn.ModuleList([nn.Sequential(conv(in_nc, ndf, 4, 2, 2), nn.LeakyReLU(0.2, True))])
            for j in (1, 2):
                layers.append(nn.Sequential(conv(chans[j], chans[j + 1], 4, 2, 2), nn.InstanceNorm2d(chans[j + 1]),
                                            nn.LeakyReLU(0.2, True)))
            layers.append(nn.Sequential(conv(chans[3], chans[4], 4, 1, 2), nn.InstanceNorm2d(chans[4]),
                                        nn.LeakyReLU(0.2, True)))
            layers.append(nn.Sequential(conv(chans[4], 1, 4, 1, 2)))
            self.scales.append(layers)

    def forward(self, x):
        out = []
        for i, layers in enumerate(reversed(self.scales)):  # full size first, as pix2pixHD orders them
            feats, h = [], x
            for layer in layers:
                h = layer(h)
                feats.append(h)
            out.append(feats)
            if i + 1 < len(self.scales):
                x = F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
        return out


class Vgg19(nn.Module):
    """vgg19().features up to relu5_1, frozen; widths as torchvision's unless given."""

    def __init__(self, widths=(64, 128, 256, 512, 512)):
        super().__init__()
        w = widths
        plan = [w[0], w[0], "M", w[1], w[1], "M", w[2], w[2], w[2], w[2], "M", w[3], w[3], w[3], w[3], "M", w[4]]
        layers, ch = [], 3
        for v in plan:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(ch, v, 3, padding=1), nn.ReLU(True)]
                ch = v
        self.features = nn.Sequential(*layers)
        self.ends = {1, 6, 11, 20, 29}
        for p in self.parameters():
            p.requires_grad = False

    def forward(self, x):
        out = []
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i in self.ends:
                out.append(x)
        return out


def instance_edges(inst):
    """pix2pixHD's instance boundary map (its get_edges): true where a pixel's instance id differs from that of a
    horizontal or vertical neighbour."""
    e = torch.zeros_like(inst, dtype=torch.bool)
    dw, dh = inst[..., 1:] != inst[..., :-1], inst[..., 1:, :] != inst[..., :-1, :]
    e[..., 1:] |= dw
    e[..., :-1] |= dw
    e[..., 1:, :] |= dh
    e[..., :-1, :] |= dh
    return e


def run_config(batch, steps, warmup):
    dev = torch.device("cuda")
    labels = ARGS.classes
    G = LocalEnhancer(labels + 1, ARGS.ngf, ARGS.n_down, ARGS.n_blocks, ARGS.n_local).to(dev)
    D = MultiscaleD(labels + 4, ARGS.ndf).to(dev)
    V = Vgg19(ARGS.vgg_widths).to(dev)
    for m in (G, D, V):
        m.to(memory_format=torch.channels_last).train()
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    amp = ARGS.precision == "bf16"
    cl = torch.channels_last
    H, W = ARGS.height, ARGS.width
    label = torch.randint(0, labels, (batch, 1, H, W), device=dev)
    inst = torch.randint(0, 8, (batch, 1, H, W), device=dev).float()
    real = (torch.rand(batch, 3, H, W, device=dev) * 2 - 1).to(memory_format=cl)
    vgg_w = [1 / 32, 1 / 16, 1 / 8, 1 / 4, 1]

    def encode():
        one_hot = torch.zeros(batch, labels, H, W, device=dev).scatter_(1, label, 1.0)
        return torch.cat([one_hot, instance_edges(inst).float()], 1).to(memory_format=cl)

    def lsgan(preds, target):
        return sum(F.mse_loss(p[-1], torch.full_like(p[-1], target)) for p in preds)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            x = encode()
            fake = G(x)
            d_fake = lsgan(D(torch.cat([x, fake.detach()], 1)), 0.0)
            pred_real = D(torch.cat([x, real], 1))
            d_real = lsgan(pred_real, 1.0)
            pred_fake = D(torch.cat([x, fake], 1))
            g_gan = lsgan(pred_fake, 1.0)
            g_feat = sum(F.l1_loss(pred_fake[i][j], pred_real[i][j].detach()) * (1 / 3) * 10
                         for i in range(3) for j in range(4))
            vf, vr = V(fake), V(real)
            g_vgg = sum(w * F.l1_loss(a, b.detach()) for w, a, b in zip(vgg_w, vf, vr)) * 10
            loss_g, loss_d = g_gan + g_feat + g_vgg, (d_fake + d_real) * 0.5
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()

    try:
        return measure(step, steps, warmup, ARGS.profile)
    finally:
        del G, D, V, opt_g, opt_d
        release()


def main():
    run_main(ARGS, f"torch pix2pixhd {ARGS.width}x{ARGS.height}", run_config)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_run_args(p, batch=1)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--height", type=int, default=1024)
    p.add_argument("--tiny", action="store_true", help="the engine's --size tiny networks")
    ARGS = p.parse_args()
    ARGS.classes, ARGS.ngf, ARGS.n_down, ARGS.n_blocks, ARGS.n_local, ARGS.ndf = 35, 32, 4, 9, 3, 64
    ARGS.vgg_widths = (64, 128, 256, 512, 512)
    if ARGS.tiny:
        ARGS.classes, ARGS.ngf, ARGS.n_down, ARGS.n_blocks, ARGS.n_local, ARGS.ndf = 5, 4, 2, 2, 1, 8
        ARGS.vgg_widths = (4, 8, 16, 32, 32)
    main()
