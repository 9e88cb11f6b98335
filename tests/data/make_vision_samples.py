#!/usr/bin/env python3
"""make_vision_samples.py: writes the tiny VOC-style, COCO-style, ImageNet-style, Cityscapes-style and FFHQ-style
sets under tests/data/ that the vision data readers (models/data/segmentation.*, detection.*, classification.*,
cityscapes.*, image_set.*) and their tests (tests/models/vision_data_test.cpp, classification_data_test.cpp,
cityscapes_data_test.cpp, image_set_test.cpp) use.

Everything is flat colours on known rectangles (the ImageNet-style images: ramps of one colour), so the tests can
state what a decoder must return without running this script: the colours and rectangles below are repeated in
the test. JPEGs are written at quality
95 without chroma subsampling (an 8 x 8 block of one colour then decodes to it exactly; blocks with an edge
ring by up to ~20 levels); label maps are palette PNGs
(VOC's format: the pixel values are the class indices) except one grey PNG, so both kinds are read.

    /tmp/venv/bin/python tests/data/make_vision_samples.py [voc] [coco] [imagenet] [cityscapes] [ffhq]   # Pillow + numpy;
                                                                                  # no name: rewrites every set
"""
import json
import os
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))

# VOC-style: 5 classes (deeplabv3 --size tiny), 0 = background, 255 = ignore (one-pixel rectangle borders).
VOC_COLOURS = [(20, 20, 20), (200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40)]
# id -> (width, height, [(class, left, top, right, bottom)] half-open pixel rectangles)
VOC_IMAGES = {
    "2007_000001": (80, 60, [(1, 10, 8, 50, 40), (3, 55, 20, 78, 58)]),
    "2007_000002": (50, 90, [(2, 5, 10, 45, 50), (4, 10, 60, 30, 85)]),
    "2007_000003": (64, 64, [(3, 16, 16, 48, 48)]),
    "2007_000004": (96, 48, [(4, 4, 4, 40, 44), (1, 50, 10, 90, 40)]),  # its label map is a grey PNG
}
GREY_LABEL_ID = "2007_000004"

# COCO-style: 3 categories with non-contiguous ids (yolov3 --size tiny has 3 classes).
COCO_CATEGORIES = [(3, "car", (220, 60, 60)), (7, "train", (60, 220, 60)), (12, "stop sign", (60, 60, 220))]
COCO_BACKGROUND = (128, 128, 128)
# file -> (image id, width, height, [(category id, x, y, w, h, iscrowd)])
COCO_IMAGES = {
    "000000000001.jpg": (1, 80, 40, [(3, 10, 5, 20, 10, 0), (12, 40, 10, 30, 25, 0)]),
    "000000000002.jpg": (2, 60, 90, [(7, 5, 20, 40, 50, 0), (3, 10, 75, 20, 10, 1)]),  # the second: iscrowd
    "000000000003.jpg": (3, 64, 64, []),  # no annotation: still trained on (all slots empty)
    "000000000004.jpg": (4, 100, 50, [(12, 0, 0, 50, 50, 0), (7, 60, 10, 30, 30, 0), (3, 70, 15, 10, 10, 0)]),
}

# ImageNet-style (torchvision ImageFolder): one folder per class (synset ids, as ImageNet's train/). Every image is its
# class's colour times a left-to-right ramp from 0.5 to 1 (round(colour * (0.5 + 0.5 x / (w - 1)))): any crop of it
# keeps the class's hue (red, green, blue or grey), and different crops and flips give different pixels. Sizes vary
# (one wide, one tall enough that RandomResizedCrop often falls back to its central crop); the formats are RGB, RGBA
# (alpha not uniform), grey PNG, RGB and grey JPEG, with the extensions' cases ImageFolder accepts. notes.txt is not
# an image (ignored).
IMAGENET_CLASSES = [("n01440764", (200, 40, 40)), ("n01443537", (40, 200, 40)), ("n01484850", (40, 40, 200)),
                    ("n01491361", (128, 128, 128))]
# class -> [(file, width, height, PIL mode)]; .JPEG/.jpg/.jpeg are JPEGs, .png/.PNG PNGs
IMAGENET_IMAGES = {
    "n01440764": [("n01440764_10026.JPEG", 80, 60, "RGB"), ("n01440764_10042.png", 50, 90, "RGB")],
    "n01443537": [("n01443537_1.jpg", 64, 64, "RGB"), ("n01443537_2.PNG", 120, 30, "RGBA")],
    "n01484850": [("n01484850_7.jpeg", 30, 200, "RGB")],
    "n01491361": [("n01491361_3.png", 40, 40, "L"), ("n01491361_4.JPEG", 60, 45, "L")],
}


def save_jpeg(array, path):
    Image.fromarray(array, "RGB").save(path, quality=95, subsampling=0)


def voc():
    root = os.path.join(HERE, "voc_sample")
    for sub in ("JPEGImages", "SegmentationClass", os.path.join("ImageSets", "Segmentation")):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    palette = [0] * 768
    for k, c in enumerate(VOC_COLOURS):
        palette[3 * k:3 * k + 3] = c
    palette[3 * 255:3 * 256] = (224, 224, 192)  # VOC's colour for 255
    for id_, (w, h, rects) in VOC_IMAGES.items():
        label = np.zeros((h, w), np.uint8)
        for cls, l, t, r, b in rects:
            label[t:b, l:r] = 255
            label[t + 1:b - 1, l + 1:r - 1] = cls
        image = np.array(VOC_COLOURS, np.uint8)[np.where(label == 255, 0, label)]  # borders look like background
        save_jpeg(image, os.path.join(root, "JPEGImages", id_ + ".jpg"))
        png = Image.fromarray(label, "L")
        if id_ != GREY_LABEL_ID:
            png = png.convert("P")
            png.putpalette(palette)
        png.save(os.path.join(root, "SegmentationClass", id_ + ".png"))
    with open(os.path.join(root, "ImageSets", "Segmentation", "train.txt"), "w") as f:
        f.write("".join(i + "\n" for i in VOC_IMAGES))
    # An RGB PNG whose pixels are a formula, for the exact PNG decode test (not part of the set).
    y, x = np.mgrid[0:12, 0:20]
    rgb = np.stack([(x * 13) % 256, (y * 21) % 256, (x * y * 7) % 256], -1).astype(np.uint8)
    Image.fromarray(rgb, "RGB").save(os.path.join(root, "rgb_formula.png"))


def coco_polygons(aid, x, y, w, h, crowd):
    """The painted rectangle as COCO polygons: annotation 1 as its left and right halves (two parts), annotation 7
    without any (the readers then use its box), a crowd without (COCO gives crowds RLE masks), the rest one part."""
    if crowd or aid == 7:
        return []
    def rect(x0, x1):
        return [float(x0), float(y), float(x1), float(y), float(x1), float(y + h), float(x0), float(y + h)]
    if aid == 1:
        return [rect(x, x + w // 2), rect(x + w // 2, x + w)]
    return [rect(x, x + w)]


def coco():
    root = os.path.join(HERE, "coco_sample")
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    os.makedirs(os.path.join(root, "train2017"), exist_ok=True)
    colour = {cid: c for cid, _, c in COCO_CATEGORIES}
    images, annotations = [], []
    for name, (iid, w, h, boxes) in COCO_IMAGES.items():
        image = np.empty((h, w, 3), np.uint8)
        image[:] = COCO_BACKGROUND
        for cid, x, y, bw, bh, crowd in boxes:
            image[y:y + bh, x:x + bw] = colour[cid]
            annotations.append({"id": len(annotations) + 1, "image_id": iid, "category_id": cid,
                                "bbox": [float(x), float(y), float(bw), float(bh)], "area": float(bw * bh),
                                "iscrowd": crowd, "segmentation": coco_polygons(len(annotations) + 1, x, y, bw, bh,
                                                                                crowd)})
        save_jpeg(image, os.path.join(root, "train2017", name))
        images.append({"id": iid, "file_name": name, "width": w, "height": h})
    doc = {"info": {"description": "engine test sample"}, "images": images, "annotations": annotations,
           "categories": [{"id": cid, "name": n, "supercategory": "thing"} for cid, n, _ in COCO_CATEGORIES]}
    with open(os.path.join(root, "annotations", "instances_train2017.json"), "w") as f:
        json.dump(doc, f, indent=1)


def imagenet():
    root = os.path.join(HERE, "imagenet_sample")
    for name, colour in IMAGENET_CLASSES:
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for file, w, h, mode in IMAGENET_IMAGES[name]:
            ramp = 0.5 + 0.5 * np.arange(w) / (w - 1)
            rgb = np.round(np.array(colour)[None, None, :] * ramp[None, :, None]).repeat(h, 0).astype(np.uint8)
            if mode == "L":
                image = Image.fromarray(rgb[:, :, 0], "L")
            elif mode == "RGBA":
                alpha = np.where(np.arange(w)[None, :] < w // 2, 255, 0).repeat(h, 0).astype(np.uint8)
                image = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
            else:
                image = Image.fromarray(rgb, "RGB")
            path = os.path.join(root, name, file)
            if file.lower().endswith(".png"):
                image.save(path, format="PNG")
            else:
                image.save(path, format="JPEG", quality=95, subsampling=0)
    with open(os.path.join(root, IMAGENET_CLASSES[0][0], "notes.txt"), "w") as f:
        f.write("not an image: the reader ignores files that are not .jpg, .jpeg or .png\n")


# Cityscapes-style: label ids (pix2pixhd --size tiny has 5 classes: 0-4) and instance ids (16-bit, class * 1000 + k
# for objects) as Cityscapes stores them, images one flat colour per class (PNG: exact).
CITY_COLOURS = [(10, 10, 10), (128, 64, 128), (70, 70, 70), (0, 0, 142), (220, 20, 60)]
# key -> (width, height, [(class, instance, left, top, right, bottom)] half-open, later ones on top); background 1
CITY_IMAGES = {
    "testcity_000000_000001": (128, 64, [(2, 2, 0, 0, 128, 16), (3, 3001, 10, 30, 40, 60), (3, 3002, 40, 30, 70, 60)]),
    "testcity_000000_000002": (160, 80, [(4, 4001, 20, 20, 60, 70)]),
}


def cityscapes():
    root = os.path.join(HERE, "cityscapes_sample")
    for key, (w, h, rects) in CITY_IMAGES.items():
        label = np.full((h, w), 1, np.uint8)
        inst = np.full((h, w), 1, np.uint16)
        for cls, iid, l, t, r, b in rects:
            label[t:b, l:r] = cls
            inst[t:b, l:r] = iid
        image = np.array(CITY_COLOURS, np.uint8)[label]
        img_dir = os.path.join(root, "leftImg8bit", "train", "testcity")
        gt_dir = os.path.join(root, "gtFine", "train", "testcity")
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(gt_dir, exist_ok=True)
        Image.fromarray(image, "RGB").save(os.path.join(img_dir, key + "_leftImg8bit.png"))
        Image.fromarray(label, "L").save(os.path.join(gt_dir, key + "_gtFine_labelIds.png"))
        Image.fromarray(inst).save(os.path.join(gt_dir, key + "_gtFine_instanceIds.png"))


# FFHQ-style: unlabeled images in a numbered sub-folder, each half one colour and half another (left | right), so a
# mirrored one reads as the colours swapped; one grey PNG; all PNG (exact values).
FFHQ_IMAGES = {  # name -> (size, left colour, right colour, mode)
    "00000/00000.png": (32, (250, 10, 10), (10, 250, 10), "RGB"),
    "00000/00001.png": (32, (10, 10, 250), (250, 250, 10), "RGB"),
    "00000/00002.png": (48, (200, 200, 200), (40, 40, 40), "L"),
}


def ffhq():
    root = os.path.join(HERE, "ffhq_sample")
    for name, (size, left, right, mode) in FFHQ_IMAGES.items():
        image = np.zeros((size, size, 3), np.uint8)
        image[:, : size // 2] = left
        image[:, size // 2:] = right
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(image[:, :, 0] if mode == "L" else image, mode).save(path)
    with open(os.path.join(root, "LICENSE.txt"), "w") as f:
        f.write("not an image: the reader lists only .png, .jpg and .jpeg files\n")


if __name__ == "__main__":
    for name in sys.argv[1:] or ["voc", "coco", "imagenet", "cityscapes", "ffhq"]:
        {"voc": voc, "coco": coco, "imagenet": imagenet, "cityscapes": cityscapes, "ffhq": ffhq}[name]()
