"""diffusers' AutoencoderKL decoder run by convweave, in two lines:

    import convweave.diffusers
    convweave.diffusers.enable(vae, budget="256MiB", streams=2)

enable() replaces vae.decoder.forward with a plan compiled from the module's own
parameters (read in place, never copied), one plan per input shape and dtype. diffusers
still runs post_quant_conv, slicing and tiling itself, exactly as before. disable(vae)
restores the module's own forward. The graph mirrors demos/vae/vae.c's decoder:
conv_in, mid block (ResNet, attention, ResNet), up blocks (ResNets, nearest 2x + conv),
GroupNorm + SiLU + conv_out."""
import threading

import torch
from torch import nn

from ._core import Context, Error, Graph, format_bytes, parse_bytes
from . import _lib as C

__all__ = ["enable", "disable", "is_enabled", "last_plan", "ConvweaveDecoder"]


def _unsupported(where, what):
    return Error("CW_ERR_UNSUPPORTED", f"convweave.diffusers: {where}: {what}")


class _Builder:
    """Walks the decoder's modules into a cw graph; every check names the module."""

    def __init__(self, graph, names):
        self.g, self.names = graph, names

    def name(self, mod):
        return self.names.get(mod, type(mod).__name__)

    def const(self, mod, tensor, shape=None):
        name = f"{self.name(mod)}.{'weight' if tensor is mod.weight else 'bias'}"
        return self.g.constant(name, tensor.detach() if shape is None else tensor.detach().view(shape))

    def conv(self, x, mod):
        where = self.name(mod)
        if not isinstance(mod, nn.Conv2d):
            raise _unsupported(where, f"{type(mod).__name__} is not an nn.Conv2d")
        if mod.padding_mode != "zeros":
            raise _unsupported(where, f"padding_mode={mod.padding_mode!r} (only 'zeros')")
        k = mod.kernel_size
        if isinstance(mod.padding, str):
            if mod.padding == "valid":
                pre = post = (0, 0)
            else:  # 'same': stride 1, the odd row after as torch does
                tot = [d * (kk - 1) for d, kk in zip(mod.dilation, k)]
                pre, post = tuple(t // 2 for t in tot), tuple(t - t // 2 for t in tot)
        else:
            pre = post = tuple(mod.padding)
        from ._core import conv_params
        p = conv_params(2, mod.stride, mod.dilation, pre, post, mod.groups)
        w = self.const(mod, mod.weight)
        b = self.const(mod, mod.bias) if mod.bias is not None else None
        return self.g.conv(x, w, b, p)

    def linear_as_conv(self, x, mod):
        """nn.Linear over channels == a 1x1 conv; its weight is viewed [out, in, 1, 1]."""
        where = self.name(mod)
        if not isinstance(mod, nn.Linear):
            raise _unsupported(where, f"{type(mod).__name__} is not an nn.Linear")
        from ._core import conv_params
        w = self.const(mod, mod.weight, (mod.out_features, mod.in_features, 1, 1))
        b = self.const(mod, mod.bias) if mod.bias is not None else None
        return self.g.conv(x, w, b, conv_params(2, (1, 1), (1, 1), (0, 0), (0, 0), 1))

    def group_norm(self, x, mod):
        where = self.name(mod)
        if not isinstance(mod, nn.GroupNorm):
            raise _unsupported(where, f"{type(mod).__name__} (only nn.GroupNorm; SpatialNorm is not supported)")
        if not mod.affine:
            raise _unsupported(where, "GroupNorm without affine weights")
        return self.g.group_norm(x, self.const(mod, mod.weight), self.const(mod, mod.bias), mod.num_groups,
                                 mod.eps)

    def act(self, x, mod):
        if not isinstance(mod, nn.SiLU):
            raise _unsupported(self.name(mod), f"activation {type(mod).__name__} (only SiLU)")
        return self.g.silu(x)

    def resnet(self, x, mod):
        where = self.name(mod)
        if type(mod).__name__ != "ResnetBlock2D":
            raise _unsupported(where, f"{type(mod).__name__} (only ResnetBlock2D)")
        if mod.time_emb_proj is not None or mod.upsample is not None or mod.downsample is not None:
            raise _unsupported(where, "a ResNet block with a time embedding, upsample or downsample")
        if mod.output_scale_factor != 1:
            raise _unsupported(where, f"output_scale_factor={mod.output_scale_factor} (only 1)")
        h = self.act(self.group_norm(x, mod.norm1), mod.nonlinearity)
        h = self.conv(h, mod.conv1)
        h = self.act(self.group_norm(h, mod.norm2), mod.nonlinearity)
        h = self.conv(h, mod.conv2)  # dropout: identity in eval and at p = 0
        sc = self.conv(x, mod.conv_shortcut) if mod.conv_shortcut is not None else x
        return self.g.add(sc, h)

    def attention(self, x, mod):
        where = self.name(mod)
        if getattr(mod, "heads", 1) != 1:
            raise _unsupported(where, f"attention with {mod.heads} heads (only 1, as AutoencoderKL builds it)")
        if mod.spatial_norm is not None or mod.group_norm is None:
            raise _unsupported(where, "attention without GroupNorm, or with SpatialNorm")
        if not mod.residual_connection or mod.rescale_output_factor != 1:
            raise _unsupported(where, "attention without a residual connection or with rescale_output_factor != 1")
        h = self.group_norm(x, mod.group_norm)
        q = self.linear_as_conv(h, mod.to_q)
        k = self.linear_as_conv(h, mod.to_k)
        v = self.linear_as_conv(h, mod.to_v)
        o = self.g.attention(q, k, v, float(mod.scale))
        o = self.linear_as_conv(o, mod.to_out[0])
        return self.g.add(o, x)

    def upsampler(self, x, mod):
        where = self.name(mod)
        if type(mod).__name__ != "Upsample2D" or not mod.use_conv or mod.use_conv_transpose or \
                not mod.interpolate or mod.norm is not None:
            raise _unsupported(where, "only Upsample2D with nearest 2x interpolation and a conv")
        return self.conv(self.g.upsample2x(x), mod.conv if mod.name == "conv" else mod.Conv2d_0)

    def decoder(self, x, dec):
        x = self.conv(x, dec.conv_in)
        mid = dec.mid_block
        x = self.resnet(x, mid.resnets[0])
        for attn, res in zip(mid.attentions, mid.resnets[1:]):
            if attn is not None:
                x = self.attention(x, attn)
            x = self.resnet(x, res)
        for blk in dec.up_blocks:
            if type(blk).__name__ != "UpDecoderBlock2D":
                raise _unsupported(self.name(blk), f"{type(blk).__name__} (only UpDecoderBlock2D)")
            for res in blk.resnets:
                x = self.resnet(x, res)
            for up in blk.upsamplers or ():
                x = self.upsampler(x, up)
        x = self.act(self.group_norm(x, dec.conv_norm_out), dec.conv_act)
        return self.conv(x, dec.conv_out)


class ConvweaveDecoder:
    """What enable() attaches to a decoder: the options, the context, and the compiled plans
    (one per input shape, dtype and parameter set)."""

    def __init__(self, decoder, budget, streams, timing, patches, threads, fuse, memory=None):
        self.decoder = decoder
        self.budget = parse_bytes(budget)
        self.streams = streams
        self.timing = timing
        self.patches = patches
        self.threads = threads
        self.fuse = fuse
        self.memory = memory
        self.ctx = None
        self.plans = {}  # (shape, dtype, device, parameter pointers) -> (plan, out shape)
        self.last_plan = None
        self.lock = threading.Lock()
        self._params = list(decoder.parameters())
        self._check_params()

    def _check_params(self):
        for n, p in self.decoder.named_parameters():
            if p.dtype != torch.float32:
                raise _unsupported(f"decoder.{n}", f"parameters are {p.dtype}; only torch.float32 is supported for "
                                   "now (half precision comes later): keep the VAE in float32")
            if p.device.type not in ("cpu", "cuda"):
                raise _unsupported(f"decoder.{n}", f"device {p.device}")

    def _context(self, device):
        want = ("cuda" if device.type == "cuda" else "cpu", device.index or 0)
        if self.ctx is None or (self.ctx.backend, self.ctx.device) != want:
            self.plans.clear()
            self.ctx = Context(backend=want[0], device=want[1], budget=self.budget if self.budget > 0 else None,
                               streams=self.streams, threads=self.threads,
                               flags=C.CW_FLAG_TIMING if self.timing else 0)
        return self.ctx

    def plan_for(self, sample):
        """The plan for this input (compiled on first use)."""
        self._check_params()
        ptrs = tuple(p.data_ptr() for p in self.decoder.parameters())
        key = (tuple(sample.shape), sample.dtype, sample.device, ptrs)
        with self.lock:
            hit = self.plans.get(key)
            if hit is None:
                ctx = self._context(sample.device)
                if any(k[3] != ptrs for k in self.plans):  # parameters replaced: old plans hold the old ones
                    self.plans.clear()
                names = {m: f"decoder.{n}" if n else "decoder" for n, m in self.decoder.named_modules()}
                g = Graph(ctx)
                x = g.input("latent", tuple(sample.shape))
                y = _Builder(g, names).decoder(x, self.decoder)
                g.output(y, "sample")
                hit = (g.compile(budget=0, streams=0, patches=self.patches, fuse=self.fuse, memory=self.memory), g.shape(y))
                self.plans[key] = hit
            self.last_plan = hit[0]
            return hit

    def forward(self, sample, latent_embeds=None):
        if latent_embeds is not None:
            raise _unsupported("decoder", "latent_embeds (SpatialNorm decoders, as in MoVQ) are not supported")
        if not isinstance(sample, torch.Tensor) or sample.dim() != 4:
            raise ValueError(f"convweave.diffusers: the decoder takes a [N, C, h, w] tensor, got "
                             f"{getattr(sample, 'shape', type(sample).__name__)}")
        if sample.dtype != torch.float32:
            raise _unsupported("decoder", f"input dtype {sample.dtype}; only torch.float32 for now "
                               "(half precision comes later)")
        p0 = self._params[0] if self._params else None
        if p0 is not None and p0.device != sample.device:
            raise Error("CW_ERR_INVALID_ARG", f"convweave.diffusers: the latent is on {sample.device}, "
                        f"the decoder's parameters on {p0.device}")
        plan, out_shape = self.plan_for(sample)
        if sample.device.type == "cuda":
            self.ctx.use_cuda_stream(torch.cuda.current_stream(sample.device).cuda_stream)
        out = torch.empty(out_shape, dtype=sample.dtype, device=sample.device)
        plan.run([sample.detach().contiguous()], [out])
        return out

    def __repr__(self):
        b = format_bytes(self.budget) if self.budget > 0 else "unlimited"
        return f"<convweave decoder: budget {b}, {self.streams} streams, {len(self.plans)} plan(s)>"


def _decoder_of(vae):
    dec = getattr(vae, "decoder", vae)
    for attr in ("conv_in", "mid_block", "up_blocks", "conv_norm_out", "conv_act", "conv_out"):
        if not hasattr(dec, attr):
            raise _unsupported(type(vae).__name__, f"no decoder with '{attr}' (expected diffusers' AutoencoderKL "
                               "or its Decoder)")
    return dec


def enable(vae, budget="256MiB", streams=2, *, timing=True, patches=None, threads=0, fuse=True, memory=None):
    """Makes vae.decode(z) (vae: a diffusers AutoencoderKL, or its .decoder) run convweave:
    at most `budget` of temporary memory (bytes, '256MiB', or None for no cap) on `streams`
    streams (1: in order; N: N-1 heavy + 1 light). Plans compile on the first decode of
    each shape; the decoder's parameters are read in place. Raises convweave.Error naming
    the first module or setting it does not support; then nothing is changed. memory: a cap
    on activations + temporaries (like budget); where storing every activation needs more,
    blocks recompute their inner activation band by band (exact; stats() counts the cost).
    Returns the ConvweaveDecoder attached to the decoder (its .last_plan has describe(),
    stats(), write_trace())."""
    dec = _decoder_of(vae)
    if is_enabled(vae):
        disable(vae)
    state = ConvweaveDecoder(dec, budget, streams, timing, patches, threads, fuse, memory)
    # Build the graph once on a 1x1 latent now, so an unsupported module fails here.
    names = {m: f"decoder.{n}" if n else "decoder" for n, m in dec.named_modules()}
    probe = Graph(state._context(next(dec.parameters()).device))
    _Builder(probe, names).decoder(probe.input("latent", (1, dec.conv_in.in_channels, 1, 1)), dec)
    probe.close()
    dec._convweave = state
    dec.forward = state.forward
    return state


def disable(vae):
    """Restores the decoder's own forward and frees its plans. A no-op if not enabled."""
    dec = _decoder_of(vae)
    state = dec.__dict__.pop("_convweave", None)
    dec.__dict__.pop("forward", None)
    if state is not None:
        state.plans.clear()
        state.last_plan = None


def is_enabled(vae):
    return "_convweave" in _decoder_of(vae).__dict__


def last_plan(vae):
    """The plan of the last decode (describe(), stats(), write_trace()); None before one."""
    state = _decoder_of(vae).__dict__.get("_convweave")
    return state.last_plan if state else None
