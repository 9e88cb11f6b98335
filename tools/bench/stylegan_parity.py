#!/usr/bin/env python3
"""StyleGAN parity reference: the engine's stylegan against PyTorch with the same weights and inputs.

Issue 17's check, made on the cpu so that `make test` runs it (tests/models/stylegan_test.cpp, no PyTorch there):
the networks of tools/bench/stylegan_torch.py (NVlabs' G_style and D_basic written from their architecture) at the
engine's tiny widths (latent 32, 2 mapping layers, feature maps min(128 / 2^stage, 32)) at 128 x 128, so that the
fused resampling convs (from 128 up) run too. Seeded random weights, every bias and the constant moved away from
their initial zeros and ones; the noise strengths stay zero (their initial value: the two sides' noise draws come
from different generators). In float64: G's images for given latents without style mixing, D's scores of them and of
given real images, the R1 penalty per sample (through autograd.grad with create_graph), G's and D's losses, the
gradient of D's loss with respect to two D weights, and that of R1 alone (the second backward only) with respect
to two more (one the fused 128 x 128 downscaling conv). Written to FILE: the weights
(f32, under the engine's names and in its layout: KRSC convs, NHWC constant, Dense0's inputs in NHWC order, the blur
filters and dlatent_avg the engine keeps as buffers), "input.z" [N, 32], "input.real" [N, 128, 128, 3], and the
"expected.*" values (f64).

    python3 tools/bench/stylegan_parity.py --reference tests/data/stylegan_reference.safetensors
"""
import argparse
import math

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import stylegan_torch as sg

RES, N = 128, 4


def main():
    sg.SHAPE.update(latent=32, mapping_layers=2, fmap_base=128, fmap_max=32)
    torch.manual_seed(11)
    G, D = sg.Generator(RES).double(), sg.Discriminator(RES).double()
    with torch.no_grad():
        for m in (G, D):
            for name, p in m.named_parameters():
                if name.endswith("bias"):
                    p.copy_(0.2 * torch.randn_like(p))
                elif name.endswith("const"):
                    p.copy_(1 + 0.5 * torch.randn_like(p))
        for name, p in G.named_parameters():  # f32 values, as the file stores them
            p.copy_(p.float().double())
        for name, p in D.named_parameters():
            p.copy_(p.float().double())
    z = torch.randn(N, 32, dtype=torch.float64).float().double()
    real = (torch.rand(N, 3, RES, RES, dtype=torch.float64) * 2 - 1).float().double()

    fake = G(z, False)
    fake_scores = D(fake)
    x = real.clone().requires_grad_(True)
    real_scores = D(x)
    (grad,) = torch.autograd.grad(real_scores.sum(), x, create_graph=True)
    r1 = grad.pow(2).sum([1, 2, 3])
    loss_d = (F.softplus(fake_scores).squeeze(1) + F.softplus(-real_scores).squeeze(1) + 5.0 * r1).mean()
    loss_g = F.softplus(-fake_scores).mean()
    d_dense0, d_from_rgb = torch.autograd.grad(loss_d, [D.dense0.weight, D.from_rgb.weight], retain_graph=True)
    # R1 alone: its gradient in D's weights is the second backward only (the fused 128x128 Conv1_down included).
    r1_dense0, r1_down = torch.autograd.grad(r1.sum(), [D.dense0.weight, D.blocks[0][1].weight])

    krsc = lambda w: w.permute(0, 2, 3, 1).contiguous()  # OIHW -> [out, KH, KW, in]
    top = int(math.log2(RES))
    out = {}
    for i, l in enumerate(G.mapping):
        out[f"G.mapping.Dense{i}.weight"], out[f"G.mapping.Dense{i}.bias"] = l.weight, l.bias
    names = ["4x4.Const", "4x4.Conv"]
    for r in range(3, top + 1):
        names += [f"{2 ** r}x{2 ** r}.Conv0_up", f"{2 ** r}x{2 ** r}.Conv1"]
    for name, layer in zip(names, G.layers):
        p = "G.synthesis." + name
        if layer.kind == "const":
            out[p + ".const"] = layer.const.permute(0, 2, 3, 1)
        else:
            out[p + ".conv.weight"] = krsc(layer.conv.weight)
        if layer.kind == "up":
            out[p + ".Blur.filter"] = blur_filter(layer.conv.weight.shape[0])
        out[p + ".noise_strength"], out[p + ".bias"] = layer.noise_strength, layer.bias
        out[p + ".StyleMod.weight"], out[p + ".StyleMod.bias"] = layer.style.weight, layer.style.bias
    out["G.synthesis.ToRGB_lod0.weight"], out["G.synthesis.ToRGB_lod0.bias"] = krsc(G.to_rgb.weight), G.to_rgb.bias
    out["G.dlatent_avg"] = torch.zeros(32)
    out["D.FromRGB_lod0.weight"], out["D.FromRGB_lod0.bias"] = krsc(D.from_rgb.weight), D.from_rgb.bias
    for i, (c0, c1) in enumerate(D.blocks):
        size = 2 ** (top - i)
        p = f"D.{size}x{size}"
        out[p + ".Conv0.weight"], out[p + ".Conv0.bias"] = krsc(c0.weight), c0.bias
        out[p + ".Blur.filter"] = blur_filter(c0.weight.shape[0])
        out[p + ".Conv1_down.weight"], out[p + ".Conv1_down.bias"] = krsc(c1.weight), c1.bias
    out["D.4x4.Conv.weight"], out["D.4x4.Conv.bias"] = krsc(D.conv4.weight), D.conv4.bias
    c = D.conv4.weight.shape[0]
    nhwc_inputs = lambda w: w.reshape(w.shape[0], c, 4, 4).permute(0, 2, 3, 1).reshape(w.shape[0], -1)
    out["D.4x4.Dense0.weight"], out["D.4x4.Dense0.bias"] = nhwc_inputs(D.dense0.weight), D.dense0.bias
    out["D.4x4.Dense1.weight"], out["D.4x4.Dense1.bias"] = D.dense1.weight, D.dense1.bias
    out = {k: v.detach().float().contiguous() for k, v in out.items()}
    out["input.z"] = z.float()
    out["input.real"] = real.permute(0, 2, 3, 1).float().contiguous()
    expected = {"fake": fake.permute(0, 2, 3, 1).float(), "fake_scores": fake_scores, "real_scores": real_scores,
                "R1": r1, "loss_D": loss_d, "loss_G": loss_g, "dD.Dense0": nhwc_inputs(d_dense0),
                "dD.FromRGB": krsc(d_from_rgb), "dR1.Dense0": nhwc_inputs(r1_dense0),
                "dR1.Conv1_down128": krsc(r1_down)}
    for k, v in expected.items():
        out["expected." + k] = v.detach().contiguous()
    save_file(out, ARGS.reference)
    print(f"wrote {ARGS.reference}: loss_D {float(loss_d):.10f}, loss_G {float(loss_g):.10f}, "
          f"R1 {[float(v) for v in r1.detach()]}")


def blur_filter(channels):
    k = torch.tensor([1.0, 2.0, 1.0])
    return ((k[:, None] * k[None, :]) / 16).reshape(1, 3, 3, 1).expand(channels, 3, 3, 1).contiguous()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--reference", required=True)
    ARGS = p.parse_args()
    main()
