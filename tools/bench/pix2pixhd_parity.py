#!/usr/bin/env python3
"""pix2pixHD parity reference: the engine's pix2pixhd (--size tiny) against PyTorch with the same weights and batch.

Issue 16's check, made on the cpu so that `make test` runs it (tests/models/pix2pixhd_test.cpp, no PyTorch there):
the networks of tools/bench/pix2pixhd_torch.py (NVIDIA's LocalEnhancer and multiscale PatchGAN written from
their architecture) at the engine's tiny shapes, and torchvision's own VGG19 layer builder
(torchvision.models.vgg.make_layers with vgg19's configuration "E", widths divided by 16) for the perceptual
loss, up to relu5_1 as pix2pixHD's Vgg19 slices it. Seeded random weights (convs N(0, 0.02) as
networks.weights_init, PyTorch's default biases), a seeded batch (35 -> 5 classes, instance ids with edges, images
in [-1, 1]); one forward in float64 computes what pix2pixHD_model.forward returns: G_GAN, G_GAN_Feat, G_VGG,
D_real, D_fake, and the fake image. Written to FILE: the weights (f32, under the engine's names, PyTorch's layout:
OIHW, ConvTranspose [in, out, k, k]), the batch ("batch.labels", "batch.instances" [N, H, W, 1], "batch.images"
[N, H, W, 3], f32 NHWC), the expected values ("expected.<loss>" 0-d f64, "expected.fake" NHWC f32), and the VGG
slices of the real image ("expected.vgg<k>" NHWC f32: torchvision's layers, checked one by one).

    python3 tools/bench/pix2pixhd_parity.py --reference tests/data/pix2pixhd_reference.safetensors
"""
import argparse

import torch
import torch.nn.functional as F
import torchvision
from safetensors.torch import save_file

from pix2pixhd_torch import LocalEnhancer, MultiscaleD, instance_edges

CLASSES, H, W, N = 5, 64, 128, 2
VGG_E = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]
VGG_ENDS = [1, 6, 11, 20, 29]  # relu1_1 ... relu5_1


def batch(gen):
    labels = torch.zeros(N, 1, H, W, dtype=torch.long)
    inst = torch.zeros(N, 1, H, W)
    for n in range(N):
        for r in range(5):
            cls = int(torch.randint(1, CLASSES, (1,), generator=gen))
            y0, x0 = int(torch.randint(0, H - 8, (1,), generator=gen)), int(torch.randint(0, W - 8, (1,), generator=gen))
            h, w = int(torch.randint(4, H - y0, (1,), generator=gen)), int(torch.randint(4, W - x0, (1,), generator=gen))
            labels[n, 0, y0:y0 + h, x0:x0 + w] = cls
            inst[n, 0, y0:y0 + h, x0:x0 + w] = cls * 1000 + r
    images = torch.rand(N, 3, H, W, generator=gen, dtype=torch.float64) * 2 - 1
    return labels, inst, images.float()


def encode(labels, inst):
    one_hot = torch.zeros(N, CLASSES, H, W, dtype=torch.float64).scatter_(1, labels, 1.0)
    return torch.cat([one_hot, instance_edges(inst).double()], 1)


def main():
    torch.manual_seed(3)
    G = LocalEnhancer(CLASSES + 1, 4, 2, 2, 1)
    D = MultiscaleD(CLASSES + 4, 8)
    vgg = torchvision.models.vgg.make_layers([v if v == "M" else v // 16 for v in VGG_E])[:30]
    for m in (G, D, vgg):
        m.double()
    gen = torch.Generator().manual_seed(5)
    labels, inst, images = batch(gen)
    x, real = encode(labels, inst), images.double()

    def vgg_slices(t):
        out = []
        for i, layer in enumerate(vgg):
            t = layer(t)
            if i in VGG_ENDS:
                out.append(t)
        return out

    with torch.no_grad():
        fake = G(x)
        lsgan = lambda preds, target: sum(F.mse_loss(p[-1], torch.full_like(p[-1], target)) for p in preds)
        pred_real = D(torch.cat([x, real], 1))
        pred_fake = D(torch.cat([x, fake], 1))
        losses = {
            "D_fake": lsgan(pred_fake, 0.0),
            "D_real": lsgan(pred_real, 1.0),
            "G_GAN": lsgan(pred_fake, 1.0),
            "G_GAN_Feat": sum(F.l1_loss(pred_fake[i][j], pred_real[i][j]) * (1 / 3) * 10
                              for i in range(3) for j in range(4)),
            "G_VGG": sum(w * F.l1_loss(a, b) for w, a, b in zip([1 / 32, 1 / 16, 1 / 8, 1 / 4, 1],
                                                                  vgg_slices(fake), vgg_slices(real))) * 10,
        }
        real_slices = vgg_slices(real)
    nhwc = lambda t: t.permute(0, 2, 3, 1).contiguous()
    out = {}
    for name, p in G.state_dict().items():
        out["netG." + name] = p.float().contiguous()
    for name, p in D.state_dict().items():  # scales.<k>.<j>.0.* -> scale<k>_layer<j>.0.*
        _, k, j, rest = name.split(".", 3)
        out[f"netD.scale{k}_layer{j}.{rest}"] = p.float().contiguous()
    for name, p in vgg.state_dict().items():
        out["vgg.features." + name] = p.float().contiguous()
    out["batch.labels"] = nhwc(labels.float())
    out["batch.instances"] = nhwc(inst)
    out["batch.images"] = nhwc(images)
    for k, v in losses.items():
        out["expected." + k] = v.reshape([])
    out["expected.fake"] = nhwc(fake).float()  # the maps in f32 (the file stays small), the losses in f64
    for k, s in enumerate(real_slices):
        out[f"expected.vgg{k}"] = nhwc(s).float()
    save_file(out, ARGS.reference)
    print(f"wrote {ARGS.reference}: " + ", ".join(f"{k} {float(v):.10f}" for k, v in losses.items()))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--reference", required=True)
    ARGS = p.parse_args()
    main()
