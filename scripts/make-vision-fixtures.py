#!/usr/bin/env python3
"""make-vision-fixtures.py - reference outputs of transformers' image processors (PIL backend) and of Pillow's
resize, for the Rust preprocessing in inferd to compare against ("pixel values within 1/255 of transformers'").

Output (all written by this script, nothing else is read):
    daemon/tests/fixtures/vision/images/{grad_37x23,noise_64x48,alpha_40x40,tall_20x90,gray_33x33}.png
    daemon/tests/fixtures/vision/{gemma3,qwen2_5_vl,llava,idefics3,pil_resize}.json
daemon/tests/fixtures/vision/README.md (hand-written) describes every file.

How to run (CPU only, a few seconds, no network once the packages are installed; torch is NOT needed: in
transformers 5.x the PIL/numpy ("slow") image processors are the `*ImageProcessorPil` classes, which need only
Pillow and numpy - the plain `Gemma3ImageProcessor` etc. names are the torchvision backend):
    python3 -m venv /tmp/vision-venv
    /tmp/vision-venv/bin/pip install transformers==5.24.0 pillow==13.0.0 numpy==2.4.6
    HF_HUB_OFFLINE=1 /tmp/vision-venv/bin/python scripts/make-vision-fixtures.py [--out DIR]
Versions used to make the committed files: python 3.11.7, transformers 5.24.0, pillow 13.0.0, numpy 2.4.6
(huggingface_hub 2.4.0, tokenizers 0.23.3, safetensors 0.8.0 came in as transformers' dependencies; no torch,
no torchvision). With these versions the output is byte-identical from run to run.

Nothing is downloaded: every processor is constructed from explicit kwargs (never from_pretrained), and
HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are forced on.

Besides recording transformers' outputs, the script re-derives every recorded value with an independent
implementation (a pure-Python port of Pillow's Resample.c 8-bit two-pass resampler, Pillow's alpha-composite
integer formula, and hand-written versions of each processor's resize / crop / split / rescale / normalize /
patchify) and asserts BIT-EXACT equality; it refuses to write anything if one of these checks fails. Those
independent functions are the algorithm the Rust side has to follow.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse
import json
import math
import platform
import sys
import warnings
from pathlib import Path

import numpy as np
import PIL
import transformers
from PIL import Image
from transformers import (
    CLIPImageProcessorPil,
    Gemma3ImageProcessorPil,
    Idefics3ImageProcessorPil,
    Qwen2VLImageProcessorPil,
)
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

warnings.filterwarnings("ignore")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "daemon" / "tests" / "fixtures" / "vision"

# --------------------------------------------------------------------------------------------------------------
# Test images
# --------------------------------------------------------------------------------------------------------------


def make_image_arrays():
    """name -> (uint8 array, PIL mode, how it was made). Arrays are HWC (HW for L)."""
    imgs = {}

    w, h = 37, 23
    x = np.arange(w, dtype=np.int64)[None, :]
    y = np.arange(h, dtype=np.int64)[:, None]
    grad = np.stack(
        [np.broadcast_to(x * 7 % 256, (h, w)), np.broadcast_to(y * 11 % 256, (h, w)), (x * y) % 256], axis=-1
    ).astype(np.uint8)
    imgs["grad_37x23.png"] = (grad, "RGB", "pixel (x,y) = (x*7 % 256, y*11 % 256, (x*y) % 256)")

    noise = np.random.default_rng(1).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    imgs["noise_64x48.png"] = (noise, "RGB", "np.random.default_rng(1).integers(0, 256, (48, 64, 3), uint8)")

    alpha = np.random.default_rng(2).integers(0, 256, size=(40, 40, 4), dtype=np.uint8)
    alpha[0, :, 3] = 0  # a fully transparent row ...
    alpha[1, :, 3] = 255  # ... and a fully opaque one, the two edge cases of compositing on white
    imgs["alpha_40x40.png"] = (
        alpha,
        "RGBA",
        "np.random.default_rng(2).integers(0, 256, (40, 40, 4), uint8), then alpha of row 0 := 0, row 1 := 255",
    )

    tall = np.random.default_rng(3).integers(0, 256, size=(90, 20, 3), dtype=np.uint8)
    imgs["tall_20x90.png"] = (tall, "RGB", "np.random.default_rng(3).integers(0, 256, (90, 20, 3), uint8)")

    gray = np.random.default_rng(4).integers(0, 256, size=(33, 33), dtype=np.uint8)
    imgs["gray_33x33.png"] = (gray, "L", "np.random.default_rng(4).integers(0, 256, (33, 33), uint8)")
    return imgs


def write_images(out_dir):
    img_dir = out_dir / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    meta = {}
    for name, (arr, mode, how) in make_image_arrays().items():
        im = Image.fromarray(arr)
        assert im.mode == mode, (name, im.mode)
        im.save(img_dir / name, format="PNG")
        back = Image.open(img_dir / name)
        back.load()
        assert back.mode == mode and np.array_equal(np.array(back), arr), name
        meta[name] = {"mode": mode, "width": arr.shape[1], "height": arr.shape[0], "made_by": how}
    return meta


def load_image(out_dir, name):
    im = Image.open(out_dir / "images" / name)
    im.load()
    return im


# --------------------------------------------------------------------------------------------------------------
# Independent reference implementations (what the notes / the Rust port follow); checked bit-exact below
# --------------------------------------------------------------------------------------------------------------


def _bilinear(x):
    x = -x if x < 0.0 else x
    return 1.0 - x if x < 1.0 else 0.0


def _bicubic(x):
    a = -0.5
    x = -x if x < 0.0 else x
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _sinc(x):
    if x == 0.0:
        return 1.0
    x = x * math.pi
    return math.sin(x) / x


def _lanczos(x):
    return _sinc(x) * _sinc(x / 3) if -3.0 <= x < 3.0 else 0.0


PIL_FILTERS = {  # name -> (PIL enum value, filter, support)
    "BILINEAR": (2, _bilinear, 1.0),
    "BICUBIC": (3, _bicubic, 2.0),
    "LANCZOS": (1, _lanczos, 3.0),
}
PRECISION_BITS = 32 - 8 - 2  # 22


def pil_coeffs(in_size, out_size, filt, support0):
    """Pillow precompute_coeffs + normalize_coeffs_8bpc: per output index, (first input index, int32 weights)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = support0 * filterscale
    ss = 1.0 / filterscale
    res = []
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)  # C (int) cast truncates toward zero, as Python int()
        xmax = min(int(center + support + 0.5), in_size)
        w = [filt((x + xmin - center + 0.5) * ss) for x in range(xmax - xmin)]
        ww = 0.0
        for v in w:
            ww += v
        if ww != 0.0:
            w = [v / ww for v in w]
        k = [int(-0.5 + v * (1 << PRECISION_BITS)) if v < 0 else int(0.5 + v * (1 << PRECISION_BITS)) for v in w]
        res.append((xmin, np.array(k, dtype=np.int64)))
    return res


def _pass(arr, coeffs, axis):
    """One 8-bit pass along `axis` (1 = horizontal over W, 0 = vertical over H) of an HWC int64 array."""
    outs = []
    for xmin, k in coeffs:
        sl = np.take(arr, np.arange(xmin, xmin + len(k)), axis=axis)
        kk = k.reshape((-1, 1, 1)) if axis == 0 else k.reshape((1, -1, 1))
        acc = (1 << (PRECISION_BITS - 1)) + (sl * kk).sum(axis=axis)
        outs.append(np.clip(acc >> PRECISION_BITS, 0, 255))  # clip8: arithmetic shift, then clamp to 0..255
    return np.stack(outs, axis=axis)


def pil_resize_ref(arr, out_w, out_h, filter_name):
    """Pillow Image.resize((out_w, out_h), filter) for an 8-bit HWC (or HW) array without alpha."""
    squeeze = arr.ndim == 2
    a = arr.astype(np.int64)
    if squeeze:
        a = a[:, :, None]
    in_h, in_w = a.shape[:2]
    if (in_w, in_h) == (out_w, out_h):
        return arr.copy()  # Image.resize returns a copy for an unchanged size
    _, filt, support = PIL_FILTERS[filter_name]
    # Two 8-bit passes; the second reads the first's rounded, clipped uint8 output. Pillow 13 (Resample.c,
    # ImagingResampleInner) runs the vertical pass first when "height is being scaled down more than twice the
    # amount the width is" (in sizes, not ratios); otherwise horizontal first (older Pillow: always horizontal
    # first). When horizontal goes first Pillow only computes the rows the vertical pass reads: same result.
    horizontal_first = not ((in_h - out_h) > 0 and (in_h - out_h) > (in_w - out_w) * 2)
    passes = [(1, out_w, in_w), (0, out_h, in_h)]
    for axis, n_out, n_in in passes if horizontal_first else passes[::-1]:
        if n_out != n_in:
            a = _pass(a, pil_coeffs(n_in, n_out, filt, support), axis=axis)
    a = a.astype(np.uint8)
    return a[:, :, 0] if squeeze else a


def to_rgb_ref(im):
    """transformers convert_to_rgb for a PIL image: RGBA composited over opaque white; L replicated; RGB as is."""
    a = np.array(im)
    if im.mode == "RGB":
        return a
    if im.mode == "L":
        return np.repeat(a[:, :, None], 3, axis=2)
    assert im.mode == "RGBA"
    s = a[..., :3].astype(np.int64)
    al = a[..., 3:4].astype(np.int64)
    t = s * al + 255 * (255 - al)  # Pillow alpha_composite(white, src) == round(t / 255) exactly (no ties exist)
    return ((t + 128 + ((t + 128) >> 8)) >> 8).astype(np.uint8)


def rescale_normalize_ref(chw_u8, mean, std, factor=1 / 255):
    """PilBackend rescale (float64 multiply, cast to float32) then normalize in float32."""
    x = (chw_u8.astype(np.float64) * factor).astype(np.float32)
    m = np.array(mean, dtype=np.float32).reshape(-1, 1, 1)
    s = np.array(std, dtype=np.float32).reshape(-1, 1, 1)
    return (x - m) / s


def chw(hwc):
    return np.ascontiguousarray(np.transpose(hwc, (2, 0, 1)))


def gemma3_ref(im, size, mean, std):
    rgb = to_rgb_ref(im)
    r = pil_resize_ref(rgb, size, size, "BILINEAR")
    return rescale_normalize_ref(chw(r), mean, std)[None]


def clip_shortest_edge_size(h, w, shortest):
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = shortest, int(shortest * long / short)
    return (new_long, new_short) if w <= h else (new_short, new_long)


def llava_ref(im, shortest, crop, mean, std):
    rgb = to_rgb_ref(im)
    h, w = rgb.shape[:2]
    nh, nw = clip_shortest_edge_size(h, w, shortest)
    r = pil_resize_ref(rgb, nw, nh, "BICUBIC")
    top, left = (nh - crop) // 2, (nw - crop) // 2
    c = r[top : top + crop, left : left + crop]
    return rescale_normalize_ref(chw(c), mean, std)[None], (nh, nw), (top, left)


def smart_resize_ref(h, w, factor, min_pixels, max_pixels):
    h_bar = round(h / factor) * factor  # Python round(): half to even
    w_bar = round(w / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((h * w) / max_pixels)
        h_bar = max(factor, math.floor(h / beta / factor) * factor)
        w_bar = max(factor, math.floor(w / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        h_bar = math.ceil(h * beta / factor) * factor
        w_bar = math.ceil(w * beta / factor) * factor
    return h_bar, w_bar


def qwen_ref(im, patch, tps, merge, min_pixels, max_pixels, mean, std):
    rgb = to_rgb_ref(im)
    h, w = rgb.shape[:2]
    rh, rw = smart_resize_ref(h, w, patch * merge, min_pixels, max_pixels)
    x = rescale_normalize_ref(chw(pil_resize_ref(rgb, rw, rh, "BICUBIC")), mean, std)
    gh, gw = rh // patch, rw // patch
    rows = []
    for bh in range(gh // merge):
        for bw in range(gw // merge):
            for mh in range(merge):
                for mw in range(merge):
                    py, px = (bh * merge + mh) * patch, (bw * merge + mw) * patch
                    p = x[:, py : py + patch, px : px + patch]  # (C, P, P)
                    rows.append(np.stack([p] * tps, axis=1).reshape(-1))  # (C, T, P, P) flattened
    return np.stack(rows), (rh, rw), [1, gh, gw]


def idefics3_sizes(h, w, longest, tile):
    """(after the longest_edge resize, after resize_for_vision_encoder), as (height, width)."""
    aspect = w / h
    if w >= h:
        w1 = longest
        h1 = int(w1 / aspect)
        h1 += h1 % 2
    else:
        h1 = longest
        w1 = int(h1 * aspect)
        w1 += w1 % 2
    h1, w1 = max(h1, 1), max(w1, 1)
    # second clamp to MAX_IMAGE_SIZE = 4096 is a no-op at these sizes
    assert max(h1, w1) <= 4096
    aspect = w1 / h1
    if w1 >= h1:
        w2 = math.ceil(w1 / tile) * tile
        h2 = int(w2 / aspect)
        h2 = math.ceil(h2 / tile) * tile
    else:
        h2 = math.ceil(h1 / tile) * tile
        w2 = int(h2 * aspect)
        w2 = math.ceil(w2 / tile) * tile
    return (h1, w1), (h2, w2)


def idefics3_ref(im, longest, tile, mean, std):
    rgb = to_rgb_ref(im)
    h, w = rgb.shape[:2]
    (h1, w1), (h2, w2) = idefics3_sizes(h, w, longest, tile)
    r1 = pil_resize_ref(rgb, w1, h1, "LANCZOS")
    r2 = pil_resize_ref(r1, w2, h2, "LANCZOS")
    if h2 > tile or w2 > tile:
        rows, cols = h2 // tile, w2 // tile
        frames = [r2[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile] for r in range(rows) for c in range(cols)]
        frames.append(pil_resize_ref(r2, tile, tile, "LANCZOS"))  # global image, from the split-size image
    else:
        rows = cols = 0
        frames = [r2]
    pv = np.stack([rescale_normalize_ref(chw(f), mean, std) for f in frames])[None]
    return pv, (h1, w1), (h2, w2), rows, cols


# --------------------------------------------------------------------------------------------------------------
# JSON output
# --------------------------------------------------------------------------------------------------------------


def f32_values(arr):
    """Flat C-order list of the float32 values, each as the shortest decimal that round-trips to that float32."""
    a = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    assert np.all(np.isfinite(a))
    vals = [float(np.format_float_positional(v, unique=True, trim="0")) for v in a]
    # what a reader gets by parsing to f64 and rounding to f32 (or parsing straight to f32) is the exact value
    assert np.array_equal(np.array(vals, dtype=np.float64).astype(np.float32), a)
    return vals


def dumps(obj, indent=0):
    """Pretty JSON with every list of scalars on one line (keeps the files small and diffable)."""
    pad = "  " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (dict, list, tuple)) for v in obj):
            return "[" + ",".join(json.dumps(v) for v in obj) + "]"
        items = [pad + dumps(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(obj)


def write_json(obj, path):
    path.write_text(dumps(obj) + "\n", encoding="utf-8")


def jsonable_kwargs(kw):
    out = {}
    for k, v in kw.items():
        if isinstance(v, PILImageResampling):
            out[k] = v.name
            out[k + "_pil_value"] = int(v)
        elif isinstance(v, tuple):
            out[k] = list(v)
        else:
            out[k] = v
    return out


def versions():
    return {
        "python": platform.python_version(),
        "transformers": transformers.__version__,
        "pillow": PIL.__version__,
        "numpy": np.__version__,
        "torch": "not installed (PIL backend only)",
    }


def header(processor_class, kwargs, what):
    return {
        "generator": "scripts/make-vision-fixtures.py",
        "versions": versions(),
        "processor_class": f"transformers.{processor_class}",
        "backend": "pil (PIL/numpy; the slow processor, i.e. use_fast=False / backend='pil')",
        "processor_kwargs": jsonable_kwargs(kwargs),
        "description": what,
        "value_format": "pixel_values are the float32 outputs flattened in C order, each printed as the shortest "
        "decimal that parses back to the same float32",
    }


def check_equal(name, got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
        diff = (
            float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
            if got.shape == want.shape
            else None
        )
        raise SystemExit(
            f"self-check failed for {name}: shape {got.shape} {got.dtype} vs {want.shape} {want.dtype}, max|diff|={diff}"
        )


# --------------------------------------------------------------------------------------------------------------
# The fixtures
# --------------------------------------------------------------------------------------------------------------

IMAGE_NAMES = ["grad_37x23.png", "noise_64x48.png", "alpha_40x40.png", "tall_20x90.png", "gray_33x33.png"]


def make_gemma3(out_dir):
    kwargs = dict(
        size={"height": 32, "width": 32},
        resample=PILImageResampling.BILINEAR,
        do_resize=True,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
        do_pan_and_scan=False,
    )
    proc = Gemma3ImageProcessorPil(**kwargs)
    obj = header(
        "Gemma3ImageProcessorPil",
        kwargs,
        "Gemma 3's preprocessing (SigLIP: squash-resize to size x size bilinear, /255, (x-0.5)/0.5, pan&scan off) "
        "with a 32 px size instead of 896",
    )
    cases = []
    for name in IMAGE_NAMES:
        im = load_image(out_dir, name)
        out = proc(im, return_tensors="np")
        pv = out["pixel_values"]
        check_equal(f"gemma3 {name}", pv, gemma3_ref(im, 32, [0.5] * 3, [0.5] * 3))
        cases.append(
            {
                "image": name,
                "kwargs": jsonable_kwargs(kwargs),
                "resized_hw": [32, 32],
                "num_crops": [int(v) for v in out["num_crops"]],
                "pixel_values_shape": list(pv.shape),
                "pixel_values": f32_values(pv),
            }
        )
    obj["cases"] = cases
    write_json(obj, out_dir / "gemma3.json")


def make_qwen(out_dir):
    kwargs = dict(
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        min_pixels=56 * 56,
        max_pixels=28 * 28 * 16,
        image_mean=list(OPENAI_CLIP_MEAN),
        image_std=list(OPENAI_CLIP_STD),
        resample=PILImageResampling.BICUBIC,
        do_resize=True,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        do_convert_rgb=True,
    )
    proc = Qwen2VLImageProcessorPil(**kwargs)
    assert dict(proc.size) == {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16}, dict(proc.size)
    obj = header(
        "Qwen2VLImageProcessorPil",
        kwargs,
        "Qwen2-VL / Qwen2.5-VL image preprocessing (smart_resize to multiples of patch_size*merge_size=28, bicubic, "
        "/255, CLIP mean/std, patchify into rows of C*T*P*P = 3*2*14*14 = 1176) with a tiny max_pixels. "
        "Qwen2.5-VL's preprocessor_config.json names this same Qwen2VLImageProcessor class.",
    )
    obj["resolved_size"] = dict(proc.size)
    cases = []
    for name in IMAGE_NAMES:
        im = load_image(out_dir, name)
        out = proc(im, return_tensors="np")
        pv, thw = out["pixel_values"], out["image_grid_thw"]
        w, h = im.size
        rh, rw = hf_smart_resize(h, w, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 16)
        ref_pv, ref_hw, ref_thw = qwen_ref(
            im, 14, 2, 2, 56 * 56, 28 * 28 * 16, list(OPENAI_CLIP_MEAN), list(OPENAI_CLIP_STD)
        )
        assert (rh, rw) == ref_hw, (name, (rh, rw), ref_hw)
        assert thw.tolist() == [ref_thw], (name, thw.tolist(), ref_thw)
        check_equal(f"qwen {name}", pv, ref_pv)
        cases.append(
            {
                "image": name,
                "kwargs": jsonable_kwargs(kwargs),
                "input_hw": [h, w],
                "smart_resize_hw": [rh, rw],
                "image_grid_thw": thw.tolist(),
                "num_patches": int(pv.shape[0]),
                "num_merged_tokens": int(pv.shape[0] // 4),
                "pixel_values_shape": list(pv.shape),
                "pixel_values": f32_values(pv),
            }
        )
    obj["cases"] = cases
    # smart_resize alone, on a few more sizes (including the default Qwen2.5-VL limits), for the size rule.
    extra = []
    for h, w in [(23, 37), (48, 64), (40, 40), (90, 20), (33, 33), (1, 1), (28, 28), (14, 200), (10, 2000),
                 (480, 640), (1080, 1920), (3000, 4000), (299, 301), (56, 56), (57, 83),
                 (70, 98), (42, 126), (98, 70)]:  # x.5 ties: Python round() is half-to-even (2.5 -> 2, 3.5 -> 4)
        # (this file's tiny limits), (the class defaults), (Qwen2.5-VL's preprocessor_config.json values)
        for mn, mx in [(56 * 56, 28 * 28 * 16), (56 * 56, 28 * 28 * 1280), (3136, 12845056)]:
            if max(h, w) / min(h, w) > 200:
                continue
            got = hf_smart_resize(h, w, factor=28, min_pixels=mn, max_pixels=mx)
            assert got == smart_resize_ref(h, w, 28, mn, mx)
            extra.append({"input_hw": [h, w], "factor": 28, "min_pixels": mn, "max_pixels": mx,
                          "smart_resize_hw": list(got)})
    obj["smart_resize_table"] = extra
    write_json(obj, out_dir / "qwen2_5_vl.json")


def make_llava(out_dir):
    kwargs = dict(
        size={"shortest_edge": 24},
        crop_size={"height": 24, "width": 24},
        resample=PILImageResampling.BICUBIC,
        do_resize=True,
        do_center_crop=True,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(OPENAI_CLIP_MEAN),
        image_std=list(OPENAI_CLIP_STD),
        do_convert_rgb=True,
    )
    proc = CLIPImageProcessorPil(**kwargs)
    obj = header(
        "CLIPImageProcessorPil",
        kwargs,
        "LLaVA-1.5's preprocessing (its preprocessor_config.json names CLIPImageProcessor: resize shortest edge, "
        "bicubic, center crop, /255, CLIP mean/std) with shortest_edge 24 and a 24x24 crop instead of 336",
    )
    cases = []
    for name in IMAGE_NAMES:
        im = load_image(out_dir, name)
        pv = proc(im, return_tensors="np")["pixel_values"]
        ref_pv, resized_hw, crop_tl = llava_ref(im, 24, 24, list(OPENAI_CLIP_MEAN), list(OPENAI_CLIP_STD))
        check_equal(f"llava {name}", pv, ref_pv)
        cases.append(
            {
                "image": name,
                "kwargs": jsonable_kwargs(kwargs),
                "input_hw": [im.size[1], im.size[0]],
                "resized_hw": list(resized_hw),
                "crop_top_left": list(crop_tl),
                "pixel_values_shape": list(pv.shape),
                "pixel_values": f32_values(pv),
            }
        )
    obj["cases"] = cases
    write_json(obj, out_dir / "llava.json")


def make_idefics3(out_dir):
    base = dict(
        resample=PILImageResampling.LANCZOS,
        do_resize=True,
        do_image_splitting=True,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
        do_pad=True,
    )
    configs = [
        dict(base, size={"longest_edge": 64}, max_image_size={"longest_edge": 32}),
        # longest_edge == max_image_size: never split (rows = cols = 0, one tile, no separate global image)
        dict(base, size={"longest_edge": 32}, max_image_size={"longest_edge": 32}),
    ]
    obj = header(
        "Idefics3ImageProcessorPil",
        configs[0],
        "Idefics3 / SmolVLM preprocessing as SmolVLM configures it (resize longest edge, LANCZOS, resize to multiples "
        "of max_image_size, split into max_image_size tiles + a global image, /255, (x-0.5)/0.5, pad) but tiny: "
        "size longest_edge 64, max_image_size 32; a second set of cases uses size longest_edge 32 (no split). "
        "Each case is one image processed alone (batch of 1). rows/cols come from the processor itself "
        "(return_row_col_info=True), not from Idefics3Processor.",
    )
    obj["processor_kwargs_variants"] = [jsonable_kwargs(c) for c in configs]
    cases = []
    for kw in configs:
        proc = Idefics3ImageProcessorPil(**kw)
        longest, tile = kw["size"]["longest_edge"], kw["max_image_size"]["longest_edge"]
        for name in IMAGE_NAMES:
            im = load_image(out_dir, name)
            out = proc(im, return_tensors="np", return_row_col_info=True)
            pv, mask = out["pixel_values"], out["pixel_attention_mask"]
            rows, cols = out["rows"], out["cols"]
            ref_pv, hw1, hw2, ref_rows, ref_cols = idefics3_ref(im, longest, tile, [0.5] * 3, [0.5] * 3)
            check_equal(f"idefics3 {name} {longest}", pv, ref_pv)
            assert rows == [[ref_rows]] and cols == [[ref_cols]], (name, rows, cols, ref_rows, ref_cols)
            assert mask.shape == pv.shape[:2] + pv.shape[3:] and bool(np.all(mask == 1)), name
            n_tiles = pv.shape[1]
            assert n_tiles == (ref_rows * ref_cols + 1 if ref_rows else 1)
            assert proc.get_number_of_image_patches(im.size[1], im.size[0]) == (
                (n_tiles, ref_rows, ref_cols) if ref_rows else (0, 0, 0)
            )
            cases.append(
                {
                    "image": name,
                    "kwargs": jsonable_kwargs(kw),
                    "input_hw": [im.size[1], im.size[0]],
                    "resized_hw": list(hw1),
                    "split_resized_hw": list(hw2),
                    "rows": int(ref_rows),
                    "cols": int(ref_cols),
                    "num_tiles": int(n_tiles),
                    "pixel_attention_mask_shape": list(mask.shape),
                    "pixel_attention_mask_sum": int(mask.sum()),
                    "pixel_values_shape": list(pv.shape),
                    "pixel_values": f32_values(pv),
                }
            )
    obj["cases"] = cases
    write_json(obj, out_dir / "idefics3.json")


def make_pil_resize(out_dir):
    obj = {
        "generator": "scripts/make-vision-fixtures.py",
        "versions": versions(),
        "description": "Raw uint8 outputs of Pillow Image.resize((w, h), resample) on the RGB test images (no "
        "reducing_gap, no box), and transformers' convert_to_rgb of the RGBA image (alpha-composited over opaque "
        "white by PIL.Image.alpha_composite, then .convert('RGB')). Values are flat HWC (row-major, RGB "
        "interleaved), i.e. np.array(pil_image).reshape(-1).",
        "resample_pil_values": {"NEAREST": 0, "LANCZOS": 1, "BILINEAR": 2, "BICUBIC": 3, "BOX": 4, "HAMMING": 5},
    }
    cases = []
    for name in ["grad_37x23.png", "noise_64x48.png"]:
        im = load_image(out_dir, name)
        assert im.mode == "RGB"
        src = np.array(im)
        for filt in ["BILINEAR", "BICUBIC", "LANCZOS"]:
            for (w, h) in [(16, 16), (50, 30), (74, 46), (5, 40)]:
                out = np.array(im.resize((w, h), resample=PIL_FILTERS[filt][0]))
                check_equal(f"pil resize {name} {filt} {w}x{h}", out, pil_resize_ref(src, w, h, filt))
                cases.append(
                    {
                        "image": name,
                        "input_wh": list(im.size),
                        "resample": filt,
                        "resample_pil_value": PIL_FILTERS[filt][0],
                        "output_wh": [w, h],
                        "shape_hwc": list(out.shape),
                        "values": [int(v) for v in out.reshape(-1)],
                    }
                )
    obj["resize_cases"] = cases

    from transformers.image_transforms import convert_to_rgb

    im = load_image(out_dir, "alpha_40x40.png")
    rgb = convert_to_rgb(im, return_numpy=True)
    check_equal("convert_to_rgb alpha", rgb, to_rgb_ref(im))
    # The composite formula, checked for every (value, alpha) pair at several x positions (SIMD vs scalar tails).
    v = np.arange(256, dtype=np.uint8)
    grid = np.zeros((256, 259, 4), np.uint8)
    grid[:, :256, 0], grid[:, :256, 1], grid[:, :256, 2] = v[None, :], v[None, ::-1], v[None, :]
    grid[:, 256:, :3] = 77
    grid[..., 3] = v[:, None]
    gim = Image.fromarray(grid)
    check_equal("convert_to_rgb all pairs", convert_to_rgb(gim, return_numpy=True), to_rgb_ref(gim))
    obj["convert_rgb"] = {
        "image": "alpha_40x40.png",
        "function": "transformers.image_transforms.convert_to_rgb(pil_image, return_numpy=True)",
        "formula": "out = round((c*a + 255*(255-a)) / 255) per channel c of R,G,B with alpha a (exact; no ties); "
        "checked for all 256x256 (c, a) pairs",
        "shape_hwc": list(rgb.shape),
        "values": [int(x) for x in rgb.reshape(-1)],
    }
    gray = load_image(out_dir, "gray_33x33.png")
    g_rgb = convert_to_rgb(gray, return_numpy=True)
    check_equal("convert_to_rgb gray", g_rgb, to_rgb_ref(gray))
    obj["convert_rgb_gray_note"] = "gray_33x33.png (mode L) converts to RGB by replicating the channel (checked)"
    write_json(obj, out_dir / "pil_resize.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = ap.parse_args()
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_images(out_dir)
    make_pil_resize(out_dir)
    make_gemma3(out_dir)
    make_qwen(out_dir)
    make_llava(out_dir)
    make_idefics3(out_dir)
    for p in sorted(out_dir.rglob("*")):
        if p.is_file():
            print(f"{p.stat().st_size:>9}  {p.relative_to(out_dir)}")
    print("all self-checks passed (independent reference == transformers / Pillow, bit-exact)")


if __name__ == "__main__":
    sys.exit(main())
