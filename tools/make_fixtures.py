#!/usr/bin/env python3
"""Reference fixtures for cw-vae, made with PyTorch + diffusers (tools/requirements-fixtures.txt).

Modes:
  make_fixtures.py                       tiny fixtures -> tests/fixtures/ (committed, < 2 MiB)
  make_fixtures.py --encoder             tiny encoder fixtures -> tests/fixtures/tiny_enc* and the
                                         model folder's config (same model and seed as the decoder's)
  make_fixtures.py --config sd --size 256 [--out fixtures-big] [--half]
                                         SD-sized random-weight VAE (not committed, see .gitignore);
                                         --config sdxl differs only in its scaling factor; --half adds
                                         the F16/BF16 weights, their float64 references and diffusers'
                                         own f16/bf16 decodes, as the tiny fixtures have them
  make_fixtures.py --corpus              regression corpus -> tests/corpus/safetensors/ (no torch)
  make_fixtures.py --compare A.npy B.npy prints max abs / rel error of A against reference B
  make_fixtures.py --contract CFG.json f16|bf16 OUT.npy
                                         issue 13's accuracy contract for a half decode OUT (convweave's,
                                         of CFG's weights_f16/bf16 file and latent): its max abs and RMS
                                         error vs the float64 reference, each <= 1.5x diffusers' own
                                         half decode's; exit status 1 when not

Comparison with an SD-sized model (weights are random; no hub access is needed):
  python tools/make_fixtures.py --config sd --size 256
  cw-vae --weights fixtures-big/sd_vae.safetensors --latent fixtures-big/sd_latent.npy --raw /tmp/sd_cw.npy
  python tools/make_fixtures.py --compare /tmp/sd_cw.npy fixtures-big/sd_out.npy

Half precision at SD size (issue 13's contract, checked by hand; the tiny one is in CI):
  python tools/make_fixtures.py --config sd --size 256 --half
  cw-vae --preset sd --weights fixtures-big/sd_vae_f16.safetensors --latent fixtures-big/sd_latent.npy \
      --dtype f16 --budget 128MiB --raw /tmp/sd_cw_f16.npy
  python tools/make_fixtures.py --contract fixtures-big/sd_config.json f16 /tmp/sd_cw_f16.npy

Every reference output is `vae.decode(z).sample` computed in float64 (stored as float32),
with z the stored latent as is: no division by scaling_factor has been applied. The half
references (`*_out_f16w.npy`, `*_out_bf16w.npy`) decode the weights rounded to the dtype (what
the F16/BF16 files hold) in float64, from the same float32 latent. diffusers' own half decode
(`*_diffusers_f16.npy`, `*_diffusers_bf16.npy`, exact in float32) is `vae.to(dtype)` on those
weights and `decode(z.to(dtype))`, on the CPU; the SD-sized one in channels_last layout, where
PyTorch's CPU half convolution goes through oneDNN (~5 GFLOP/s on AVX2; the default layout's
fallback runs at ~0.2 GFLOP/s, hours for one SD decode). Both layouts' errors were within 10 %
of each other on the tiny fixture.
"""
import argparse
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Architectures. "tiny" mirrors SD's decoder layout (4 levels, 3 upsamplers, two channel
# changes, attention in the mid block) at widths that keep the committed files small.
CONFIGS = {
    "tiny": dict(block_out_channels=(8, 16, 32, 32), layers_per_block=1, norm_num_groups=4,
                 latent_channels=4, scaling_factor=0.18215),
    "sd": dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32,
               latent_channels=4, scaling_factor=0.18215),
    "sdxl": dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32,
                 latent_channels=4, scaling_factor=0.13025),
}


def build_vae(cfg, seed):
    import torch
    from diffusers import AutoencoderKL
    from diffusers.utils import logging

    logging.set_verbosity_error()  # silences the "cast with to()" notice for our f64 decode
    n = len(cfg["block_out_channels"])
    torch.manual_seed(seed)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=cfg["block_out_channels"], layers_per_block=cfg["layers_per_block"],
        norm_num_groups=cfg["norm_num_groups"], latent_channels=cfg["latent_channels"],
        scaling_factor=cfg["scaling_factor"], sample_size=32)
    return randomize(vae, seed).eval()


def randomize(model, seed):
    """Fills model's parameters in place (seeded) and returns it. Non-trivial weights, so a
    wrong GroupNorm (grouping, eps, affine), a wrong attention (scale, softmax axis,
    transposes) or a swapped tensor changes the output visibly: conv/linear weights
    N(0, 1/fan_in) keep activations O(1) through the depth; biases N(0, 0.2); norm scales
    N(1, 0.3) and shifts N(0, 0.3)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
    return model


def decoder_state(vae):
    """Decoder + post_quant_conv tensors under diffusers' key names (as in its checkpoints)."""
    sd = vae.state_dict()
    return {k: v.detach().float().contiguous() for k, v in sd.items()
            if k.startswith("decoder.") or k.startswith("post_quant_conv.")}


def decode(vae, z, dtype, channels_last=False):
    import torch
    with torch.no_grad():
        v = vae.to(dtype)
        x = z.to(dtype)
        if channels_last:
            v = v.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        return v.decode(x).sample


def err_stats(out, ref):
    """An output's error against a float64 reference (both torch tensors): max abs, RMS, and
    max abs relative to max|ref|."""
    d = (out.double() - ref.double()).abs()
    return {"max_abs": float(d.max()), "rms": float(d.pow(2).mean().sqrt()),
            "max_rel": float(d.max() / ref.abs().max())}


def save_st(path, tensors, dtype):
    import torch
    from safetensors.torch import save_file
    save_file({k: v.to(dtype).contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)


def versions():
    import diffusers
    import numpy
    import safetensors
    import torch
    return {"torch": torch.__version__, "diffusers": diffusers.__version__,
            "safetensors": safetensors.__version__, "numpy": numpy.__version__,
            "python": sys.version.split()[0]}


def make(config, out_dir, prefix, latent_hw, seed, with_half, png=True, channels_last=False):
    import copy

    import numpy as np
    import torch

    torch.use_deterministic_algorithms(True)
    cfg = CONFIGS[config]
    os.makedirs(out_dir, exist_ok=True)
    vae = build_vae(cfg, seed)
    weights = decoder_state(vae)
    save_st(os.path.join(out_dir, f"{prefix}_vae.safetensors"), weights, torch.float32)

    h, w = latent_hw
    g = torch.Generator().manual_seed(seed + 1)
    z = torch.randn((1, cfg["latent_channels"], h, w), generator=g, dtype=torch.float32)
    np.save(os.path.join(out_dir, f"{prefix}_latent.npy"), z.numpy())

    ref = decode(copy.deepcopy(vae), z, torch.float64)
    out32 = ref.float().numpy()
    np.save(os.path.join(out_dir, f"{prefix}_out.npy"), out32)
    # How far plain float32 PyTorch lands from the float64 reference: a yardstick for the
    # tolerance of any float32 implementation.
    f32 = decode(copy.deepcopy(vae), z, torch.float32).double()
    d = (f32 - ref).abs()
    stats = {"ref_abs_max": float(ref.abs().max()), "ref_std": float(ref.std()),
             "torch_f32_vs_f64_max_abs": float(d.max()),
             "torch_f32_vs_f64_max_rel": float(d.max() / ref.abs().max())}

    files = {"weights_f32": f"{prefix}_vae.safetensors", "latent": f"{prefix}_latent.npy",
             "out": f"{prefix}_out.npy"}
    if with_half:
        # Same weights stored as F16 / BF16; references decode those rounded weights (in
        # float64), so a reader that widens them exactly matches as tightly as with F32.
        # diffusers' own decode in that dtype, of the same weights and latent, is issue 13's
        # yardstick: a half decode's error vs the float64 reference may be at most 1.5x its.
        for dt, tag in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
            save_st(os.path.join(out_dir, f"{prefix}_vae_{tag}.safetensors"), weights, dt)
            v2 = copy.deepcopy(vae)
            with torch.no_grad():
                for name, p in v2.named_parameters():
                    if name.startswith("decoder.") or name.startswith("post_quant_conv."):
                        p.copy_(p.to(dt).float())
            o64 = decode(copy.deepcopy(v2), z, torch.float64)
            np.save(os.path.join(out_dir, f"{prefix}_out_{tag}w.npy"), o64.float().numpy())
            oh = decode(v2, z, dt, channels_last).float()  # a half value is exact in float32
            np.save(os.path.join(out_dir, f"{prefix}_diffusers_{tag}.npy"), oh.numpy())
            stats[f"diffusers_{tag}_vs_f64"] = err_stats(oh, o64)
            files[f"weights_{tag}"] = f"{prefix}_vae_{tag}.safetensors"
            files[f"out_{tag}w"] = f"{prefix}_out_{tag}w.npy"
            files[f"diffusers_{tag}"] = f"{prefix}_diffusers_{tag}.npy"

    if png:
        # Image: diffusers' own postprocess of the stored float32 output, saved with PIL.
        from diffusers.image_processor import VaeImageProcessor
        img = VaeImageProcessor().postprocess(torch.from_numpy(out32), output_type="pil")[0]
        img.save(os.path.join(out_dir, f"{prefix}_out.png"))
        files["png"] = f"{prefix}_out.png"

    meta = {
        "config": config,
        "block_out_channels": list(cfg["block_out_channels"]),
        "layers_per_block": cfg["layers_per_block"],
        "norm_num_groups": cfg["norm_num_groups"],
        "latent_channels": cfg["latent_channels"],
        "in_channels": 3, "out_channels": 3,
        "up_block_types": ["UpDecoderBlock2D"] * len(cfg["block_out_channels"]),
        "mid_block_add_attention": True,
        "norm_eps": 1e-6,
        "scaling_factor": cfg["scaling_factor"],
        "seed": seed,
        "latent_shape": list(z.shape),
        "out_shape": list(out32.shape),
        "decode": "out = vae.decode(latent).sample in float64, stored as float32; "
                  "the latent is used as is (not divided by scaling_factor)",
        "files": files,
        "stats": stats,
        "versions": versions(),
    }
    if with_half:
        meta["decode_half"] = ("out_<dt>w: the decode above of the weights rounded to <dt>; diffusers_<dt>: "
                               "vae.to(<dt>).decode(latent.to(<dt>)).sample on the CPU"
                               + (" in channels_last layout" if channels_last else "")
                               + ", stored as float32 (exact); stats diffusers_<dt>_vs_f64 is its error vs out_<dt>w")
    with open(os.path.join(out_dir, f"{prefix}_config.json"), "w") as fp:
        json.dump(meta, fp, indent=2)
        fp.write("\n")
    with open(os.path.join(out_dir, f"{prefix}_keys.txt"), "w") as fp:
        fp.write(f"# {prefix}_vae.safetensors: {len(weights)} tensors (diffusers key names), "
                 f"config {config}\n")
        for k in sorted(weights):
            fp.write(f"{k} {list(weights[k].shape)}\n")
    print(json.dumps(stats, indent=2))


def make_encoder(out_dir, seed, hw=(64, 96), batch=2):
    """Encoder fixtures of the tiny model: its encoder.* + quant_conv.* weights, a batch of
    8-bit PNG images, and the moments (mean, logvar after quant_conv) diffusers computes for
    them in float64; plus diffusers' own config.json of the model (for --model folders)."""
    import copy

    import numpy as np
    import torch
    from PIL import Image
    from safetensors.torch import load_file

    torch.use_deterministic_algorithms(True)
    cfg = CONFIGS["tiny"]
    vae = build_vae(cfg, seed)
    # the same model as the committed decoder fixture
    dec = load_file(os.path.join(out_dir, "tiny_vae.safetensors"))
    sd = vae.state_dict()
    assert all(torch.equal(sd[k].float(), v) for k, v in dec.items()), "decoder fixture is another model"
    enc = {k: v.detach().float().contiguous() for k, v in sd.items()
           if k.startswith("encoder.") or k.startswith("quant_conv.")}
    save_st(os.path.join(out_dir, "tiny_enc.safetensors"), enc, torch.float32)

    g = torch.Generator().manual_seed(seed + 2)
    h, w = hw
    # smooth gradients plus noise: image-like, every value of the 8-bit range used
    yy, xx = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    imgs, xs = [], []
    for b in range(batch):
        base = torch.stack([xx, yy, (xx + yy) / 2]) * 255
        noise = torch.randint(-60, 61, (3, h, w), generator=g)
        u8 = (base + noise + 40 * b).clamp(0, 255).round().to(torch.uint8)
        name = f"tiny_image{b}.png"
        Image.fromarray(u8.permute(1, 2, 0).numpy(), "RGB").save(os.path.join(out_dir, name))
        imgs.append(name)
        # diffusers' VaeImageProcessor: float32 / 255, then 2x - 1
        x = torch.from_numpy(np.array(Image.open(os.path.join(out_dir, name))).astype(np.float32) / 255.0)
        xs.append(2.0 * x.permute(2, 0, 1) - 1.0)
    x = torch.stack(xs)
    with torch.no_grad():
        ref = copy.deepcopy(vae).to(torch.float64).encode(x.to(torch.float64)).latent_dist.parameters
        f32 = copy.deepcopy(vae).encode(x).latent_dist.parameters.double()
    np.save(os.path.join(out_dir, "tiny_enc_moments.npy"), ref.float().numpy())
    d = (f32 - ref).abs()
    stats = {"ref_abs_max": float(ref.abs().max()), "torch_f32_vs_f64_max_abs": float(d.max()),
             "torch_f32_vs_f64_max_rel": float(d.max() / ref.abs().max())}
    vae.save_config(out_dir)  # diffusers' config.json of the model
    os.replace(os.path.join(out_dir, "config.json"), os.path.join(out_dir, "tiny_model_config.json"))
    meta = {"images": imgs, "moments": "tiny_enc_moments.npy",
            "encode": "moments = vae.encode(x).latent_dist.parameters in float64 (mean then logvar, "
                      "after quant_conv), stored as float32; x = 2 * png / 255 - 1 in float32",
            "weights": "tiny_enc.safetensors", "seed": seed, "stats": stats, "versions": versions()}
    with open(os.path.join(out_dir, "tiny_enc_config.json"), "w") as fp:
        json.dump(meta, fp, indent=2)
        fp.write("\n")
    print(json.dumps(stats, indent=2))


# ---- regression corpus for the safetensors parser (pure Python: no torch needed) ----

def st_bytes(header, data=b"", hlen=None, pad=True):
    js = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        js += b" " * ((8 - (8 + len(js)) % 8) % 8)
    n = len(js) if hlen is None else hlen
    return struct.pack("<Q", n) + js + data


def corpus(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    f32 = struct.pack("<6f", 1.0, -2.0, 0.5, 3.25, -0.0, 65504.0)
    f16 = struct.pack("<6H", 0x3C00, 0x0001, 0x7BFF, 0x7C00, 0xFC00, 0x7E01)   # 1, min subnormal, max, +-inf, NaN
    bf16 = struct.pack("<4H", 0x3F80, 0x0001, 0x7F80, 0x7FC1)
    good = {"__metadata__": {"format": "pt"},
            "a.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"dtype": "F16", "shape": [6], "data_offsets": [24, 36]},
            "c": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [36, 44]},
            "empty": {"dtype": "F32", "shape": [0, 4], "data_offsets": [44, 44]},
            "scalar": {"dtype": "F32", "shape": [], "data_offsets": [44, 48]}}
    data = f32 + f16 + bf16 + struct.pack("<f", 7.0)

    def t(dtype="F32", shape=(2,), off=(0, 8)):
        return {"dtype": dtype, "shape": list(shape), "data_offsets": list(off)}

    cases = {
        "valid_mixed.safetensors": st_bytes(good, data),
        "valid_empty_header.safetensors": st_bytes({}),
        "valid_no_pad.safetensors": st_bytes({"x": t()}, b"\0" * 8, pad=False),
        "short_file.safetensors": b"\x10\x00\x00",
        "header_past_eof.safetensors": struct.pack("<Q", 1000) + b"{}",
        "header_len_huge.safetensors": struct.pack("<Q", 2 ** 63 + 5) + b"{}      ",
        "header_len_zero.safetensors": struct.pack("<Q", 0) + b"{}",
        "bad_json.safetensors": st_bytes(b'{"x": {"dtype": "F32", "shape": [2],'),
        "json_array.safetensors": st_bytes(b"[1, 2, 3]"),
        "json_trailing_garbage.safetensors": st_bytes(b'{}  xyz '),
        "json_deep_nesting.safetensors": st_bytes(b"[" * 5000 + b"]" * 5000),
        "json_nul_in_header.safetensors": st_bytes(b'{"x"\0: 1}'),
        "unknown_dtype.safetensors": st_bytes({"x": t("I64", (1,))}, b"\0" * 8),
        "dtype_not_string.safetensors": st_bytes({"x": {"dtype": 3, "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
        "missing_offsets.safetensors": st_bytes({"x": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
        "entry_not_object.safetensors": st_bytes({"x": [1, 2]}),
        "offsets_past_end.safetensors": st_bytes({"x": t(off=(0, 8))}, b"\0" * 4),
        "offsets_reversed.safetensors": st_bytes({"x": t(off=(8, 0))}, b"\0" * 8),
        "offsets_three.safetensors": st_bytes({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}}, b"\0" * 8),
        "offsets_negative.safetensors": st_bytes({"x": t(off=(-8, 0))}, b"\0" * 8),
        "offsets_huge.safetensors": st_bytes({"x": t(off=(0, 2 ** 64))}, b"\0" * 8),
        "overlap.safetensors": st_bytes({"x": t(off=(0, 8)), "y": t(off=(4, 12))}, b"\0" * 16),
        "duplicate_name.safetensors": st_bytes(b'{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                               b'"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', b"\0" * 16),
        "size_mismatch.safetensors": st_bytes({"x": t(shape=(3,), off=(0, 8))}, b"\0" * 8),
        "shape_negative.safetensors": st_bytes({"x": t(shape=(-2,), off=(0, 8))}, b"\0" * 8),
        "shape_float.safetensors": st_bytes({"x": t(shape=(2.5,), off=(0, 8))}, b"\0" * 8),
        "shape_string.safetensors": st_bytes({"x": t(shape=("2",), off=(0, 8))}, b"\0" * 8),
        "shape_not_array.safetensors": st_bytes({"x": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}}, b"\0" * 8),
        "shape_overflow.safetensors": st_bytes({"x": t(shape=(2 ** 40, 2 ** 40), off=(0, 8))}, b"\0" * 8),
        "shape_bytes_overflow.safetensors": st_bytes({"x": t(shape=(2 ** 31, 2 ** 31), off=(0, 8))}, b"\0" * 8),
        "shape_rank9.safetensors": st_bytes({"x": t(shape=(1,) * 9, off=(0, 4))}, b"\0" * 4),
        "metadata_not_string.safetensors": st_bytes({"__metadata__": {"a": 1}}),
        "metadata_not_object.safetensors": st_bytes({"__metadata__": "pt"}),
    }
    for name, blob in cases.items():
        with open(os.path.join(out_dir, name), "wb") as fp:
            fp.write(blob)
    print(f"wrote {len(cases)} files to {out_dir}")
    corpus_config(os.path.join(os.path.dirname(out_dir), "config_json"))
    corpus_npy(os.path.join(os.path.dirname(out_dir), "npy"))


def corpus_config(out_dir):
    """Seeds for fuzz_vae_config: diffusers-style configs (valid and each kind of bad)."""
    os.makedirs(out_dir, exist_ok=True)
    good = {"_class_name": "AutoencoderKL", "_diffusers_version": "0.42.1", "act_fn": "silu",
            "block_out_channels": [128, 256, 512, 512], "down_block_types": ["DownEncoderBlock2D"] * 4,
            "up_block_types": ["UpDecoderBlock2D"] * 4, "force_upcast": True, "in_channels": 3,
            "latent_channels": 16, "latents_mean": None, "latents_std": None, "layers_per_block": 2,
            "mid_block_add_attention": True, "norm_num_groups": 32, "out_channels": 3, "sample_size": 1024,
            "scaling_factor": 1.5305, "shift_factor": 0.0609, "use_post_quant_conv": False, "use_quant_conv": False}
    cases = {"valid_sd3.json": json.dumps(good, indent=2).encode(), "valid_empty.json": b"{}"}
    for i, (k, v) in enumerate([("norm_num_groups", 24), ("layers_per_block", 2.5), ("act_fn", "gelu"),
                                ("block_out_channels", []), ("up_block_types", ["UpDecoderBlock2D"]),
                                ("use_quant_conv", 1), ("new_key", 1), ("scaling_factor", -1),
                                ("latent_channels", 1e30), ("_class_name", "AutoencoderTiny")]):
        bad = dict(good)
        bad[k] = v
        cases[f"bad_{i}_{k}.json"] = json.dumps(bad).encode()
    cases["bad_truncated.json"] = json.dumps(good).encode()[:200]
    cases["bad_duplicate.json"] = b'{"latent_channels": 4, "latent_channels": 16}'
    cases["bad_array.json"] = b"[1, 2]"
    for name, blob in cases.items():
        with open(os.path.join(out_dir, name), "wb") as fp:
            fp.write(blob)
    print(f"wrote {len(cases)} files to {out_dir}")


def npy_bytes(descr, shape, data, version=1):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join(f"{d}, " for d in shape) if len(shape) != 1 else f"{shape[0]},")
    pad = (64 - (10 + len(h) + 1) % 64) % 64
    h = (h + " " * pad + "\n").encode()
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<H", len(h)) + h + data


def corpus_npy(out_dir):
    """Seeds for fuzz_npy: latents in each dtype, and malformed headers."""
    os.makedirs(out_dir, exist_ok=True)
    f4 = struct.pack("<6f", 1.0, -2.0, 0.5, float("nan"), float("inf"), 3.0)
    cases = {
        "valid_f4.npy": npy_bytes("<f4", (1, 2, 1, 3), f4),
        "valid_f2.npy": npy_bytes("<f2", (2, 3), struct.pack("<6H", 0x3C00, 1, 0x7BFF, 0x7C00, 0xFC00, 0x7E01)),
        "valid_f8.npy": npy_bytes("<f8", (3,), struct.pack("<3d", 1e300, -1.0, 0.25)),
        "valid_scalar.npy": npy_bytes("<f4", (), struct.pack("<f", 7.0)),
        "bad_dtype.npy": npy_bytes("<i4", (2,), b"\0" * 8),
        "bad_short.npy": npy_bytes("<f4", (4,), b"\0" * 8),
        "bad_fortran.npy": npy_bytes("<f4", (2,), b"\0" * 8).replace(b"False", b"True "),
        "bad_magic.npy": b"\x93NUMPX\x01\x00\x00\x00",
    }
    for name, blob in cases.items():
        with open(os.path.join(out_dir, name), "wb") as fp:
            fp.write(blob)
    print(f"wrote {len(cases)} files to {out_dir}")


def compare(a_path, b_path):
    import numpy as np
    a = np.load(a_path).astype(np.float64)
    b = np.load(b_path).astype(np.float64)
    if a.shape != b.shape:
        print(f"shape mismatch: {a.shape} vs {b.shape}")
        return 1
    d = np.abs(a - b)
    scale = max(float(np.abs(b).max()), 1e-30)
    print(f"max_abs {d.max():.3e}  max_rel(to max|ref|) {d.max() / scale:.3e}  mean_abs {d.mean():.3e}  "
          f"at {np.unravel_index(int(d.argmax()), d.shape)}")
    return 0


# Issue 13: a half decode's error vs float64 may be at most this multiple of diffusers' own.
CONTRACT_FACTOR = 1.5


def contract(cfg_path, tag, out_path):
    """Checks a half decode (convweave's) against the float64 reference and diffusers' own half
    decode that `make` wrote beside cfg_path: max abs and RMS error each <= CONTRACT_FACTOR x
    diffusers'. Returns the exit status (0 met, 1 not)."""
    import numpy as np
    with open(cfg_path) as fp:
        files = json.load(fp)["files"]
    if f"diffusers_{tag}" not in files:
        print(f"{cfg_path} has no diffusers_{tag} decode: make it with --half")
        return 2
    d = os.path.dirname(os.path.abspath(cfg_path))
    ref = np.load(os.path.join(d, files[f"out_{tag}w"])).astype(np.float64)
    peer = np.load(os.path.join(d, files[f"diffusers_{tag}"])).astype(np.float64)
    out = np.load(out_path).astype(np.float64)
    if out.shape != ref.shape:
        print(f"shape mismatch: {out.shape} vs {ref.shape}")
        return 2
    ok = True
    for name, e in (("max abs", lambda a: np.abs(a - ref).max()),
                    ("rms", lambda a: np.sqrt(np.mean((a - ref) ** 2)))):
        mine, theirs = float(e(out)), float(e(peer))
        ratio = mine / theirs if theirs > 0 else float("inf")
        ok &= ratio <= CONTRACT_FACTOR
        print(f"{tag} {name:7s} error vs float64: convweave {mine:.3e}, diffusers {tag} {theirs:.3e}, "
              f"ratio {ratio:.2f} (contract <= {CONTRACT_FACTOR})")
    print("contract met" if ok else "contract NOT met")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--size", type=int, default=None, help="output image side in pixels (latent = size / 8)")
    ap.add_argument("--out", default=None, help="output directory")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--corpus", action="store_true", help="write the safetensors regression corpus")
    ap.add_argument("--compare", nargs=2, metavar=("OUT.npy", "REF.npy"))
    ap.add_argument("--contract", nargs=3, metavar=("CFG.json", "DTYPE", "OUT.npy"),
                    help="issue 13's accuracy contract for a half decode (DTYPE f16 or bf16)")
    ap.add_argument("--half", action="store_true",
                    help="SD-sized configs: also the F16/BF16 weights, references and diffusers' half decodes")
    ap.add_argument("--encoder", action="store_true", help="write the tiny encoder fixtures")
    args = ap.parse_args()

    if args.compare:
        return compare(*args.compare)
    if args.contract:
        if args.contract[1] not in ("f16", "bf16"):
            ap.error("--contract DTYPE: f16 or bf16")
        return contract(*args.contract)
    if args.encoder:
        make_encoder(args.out or os.path.join(ROOT, "tests", "fixtures"), args.seed)
        return 0
    if args.corpus:
        corpus(args.out or os.path.join(ROOT, "tests", "corpus", "safetensors"))
        return 0
    if args.config == "tiny":
        if args.size:
            s = args.size // 8
            hw = (s, s)
        else:
            hw = (8, 12)  # non-square on purpose
        make("tiny", args.out or os.path.join(ROOT, "tests", "fixtures"), "tiny", hw, args.seed, with_half=True)
    else:
        side = (args.size or 256) // 8
        make(args.config, args.out or os.path.join(ROOT, "fixtures-big"), args.config, (side, side), args.seed,
             with_half=args.half, png=False, channels_last=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
