"""Streaming a video VAE over time: one chunk step, exported once per cache kind and run
chunk by chunk.

diffusers' Wan and CogVideoX VAEs decode (and Wan encodes) a few frames at a time, carrying a
cache of the last frames each causal conv saw. `Stream` turns that loop into one step
function, `step(x_chunk, kind, *cache_tensors) -> (y_chunk, *new_cache_tensors)`, wrapped by
`convweave.torch.wrap`: the cache tensors are plan inputs and outputs, handed from one step
to the next without copies, and what is not a tensor in a cache (Wan's first-chunk `None`s
and its `"Rep"` sentinel, the first-chunk flag, CogVideoX's dict keys) makes the step's
*kind*, a constant of its export. A decode compiles one program per kind (two or three),
whatever its frame count, and holds one chunk's activations at a time, so its peak does not
grow with the frames. The output is written chunk by chunk into one tensor (or handed to a
callback), and the result is the model's own chunked decode: the same chunks, the same
caches, the same arithmetic up to the determinism contract.

    dec = convweave.video.wan_decoder(vae, memory="2GiB")
    video = dec(z)                               # vae.decode(z).sample, tiling off
    dec(z, callback=lambda y, t0: save(y, t0))   # frames t0.. as they come, nothing kept
"""
import torch
import torch.utils._pytree as pytree

from ._core import Error

__all__ = ["Stream", "wan_decoder", "wan_encoder", "cogvideox_decoder", "cogvideox_encoder"]


class _Tensor:
    """Where a cache structure holds a tensor."""

    def __repr__(self):
        return "<tensor>"


_TENSOR = _Tensor()


def _split(cache):
    """(structure, tensors) of a cache: its pytree spec with non-tensor leaves kept (tensors
    as _TENSOR), and its tensors in order."""
    leaves, spec = pytree.tree_flatten(cache)
    return (spec, tuple(_TENSOR if isinstance(v, torch.Tensor) else v for v in leaves)), \
        tuple(v for v in leaves if isinstance(v, torch.Tensor))


def _join(structure, tensors):
    spec, template = structure
    it = iter(tensors)
    return pytree.tree_unflatten([next(it) if v is _TENSOR else v for v in template], spec)


class _Kinds:
    """The cache structures a step has seen (kind i: kinds[i]) and, per kind, the kind of the
    cache its step returns. Not a module attribute of plain containers: torch.export restores
    those after tracing, and the step records `next` while it is traced."""

    def __init__(self):
        self.kinds, self.next = [], {}

    def of(self, cache):
        """(kind, tensors) of a cache."""
        structure, tensors = _split(cache)
        if structure in self.kinds:
            return f"kind{self.kinds.index(structure)}", tensors
        self.kinds.append(structure)
        return f"kind{len(self.kinds) - 1}", tensors

    def cache(self, kind, tensors):
        return _join(self.kinds[int(kind[4:])], tensors)


class _Step(torch.nn.Module):
    """step(x, kind, *tensors) -> (y, *new_tensors): run(owner, x, cache) on the cache that kind
    and tensors make (the export runs forward once per kind, recording the kind it returns)."""

    def __init__(self, owner, run):
        super().__init__()
        self.owner = owner
        self.run = run
        self.k = _Kinds()

    def forward(self, x, kind, *tensors):
        y, new = self.run(self.owner, x, self.k.cache(kind, tensors))
        nkind, ntensors = self.k.of(new)
        self.k.next[kind] = nkind
        return (y, *ntensors)


class Stream:
    """Runs a chunked model through one wrapped step. `run(owner, x_chunk, cache) -> (y_chunk,
    new_cache)` is the model's own chunk step, a function of the chunk and the cache alone (a
    cache: tensors, None and other constants in lists, tuples and dicts); `first` is the cache
    of the first chunk. owner (an nn.Module) holds the parameters. wrap_opts go to
    convweave.torch.wrap (memory, budget, streams, dtype, fallback, keep_memory, threads);
    max_plans defaults to 4, enough for every kind of a decode."""

    def __init__(self, owner, run, first, **wrap_opts):
        self.step = _Step(owner, run).train(owner.training)
        self.first = first
        self.opts = {"max_plans": 4, **wrap_opts}
        self.wrapped = None

    def __call__(self, chunks, *, out=None, callback=None, post=None):
        """Runs the step over `chunks` (a list of tensors, consecutive along dim 2) and returns
        their outputs joined along dim 2: in `out` when given, else in a tensor made once the
        second output shows the size of the later ones (they must all have it). post(y) is
        applied to each output first (in place: a clamp). With callback(y, t0) each output
        goes there instead (frames t0..), nothing is kept, and None is returned. Unless
        keep_memory is set, the wrapped step's empty_cache() runs at the end: the heap the
        chunks' freed caches and outputs leave goes back to the system."""
        import convweave.torch as cwt
        cache, t0, first_out = self.first, 0, None
        for i, x in enumerate(chunks):
            kind, tensors = self.step.k.of(cache)
            if i == 0:  # the caller's: a step may write its new cache into the tensors it is given
                tensors = tuple(t.clone() for t in tensors)
            if self.wrapped is None:  # the old cache's tensors are given up: the new cache's can take them
                self.wrapped = cwt.wrap(self.step, (x, kind, *tensors), donate=slice(2, None), **self.opts)
            y, *tensors = self.wrapped(x, kind, *tensors)
            cache = self.step.k.cache(self.step.k.next[kind], tensors)
            if post is not None:
                post(y)
            if callback is not None:
                callback(y, t0)
            elif i == 0 and out is None and len(chunks) > 1:
                first_out = y  # the output is made at the second chunk
            else:
                if out is None:
                    n0 = first_out.shape[2] if first_out is not None else 0
                    frames = n0 + (len(chunks) - (1 if first_out is not None else 0)) * y.shape[2]
                    out = y.new_empty(*y.shape[:2], frames, *y.shape[3:])
                    if first_out is not None:
                        out[:, :, :n0].copy_(first_out)
                        first_out = None
                _check_out(out, y, t0)
                out[:, :, t0:t0 + y.shape[2]].copy_(y)
            t0 += y.shape[2]
        cache = tensors = y = None  # the last chunk's caches: freed before the heap goes back
        if self.wrapped is not None and not self.opts.get("keep_memory"):
            self.wrapped.empty_cache()
        if callback is None and out.shape[2] != t0:
            raise Error("CW_ERR_INVALID_ARG", f"convweave.video: the chunks made {t0} frames, out has {out.shape[2]}")
        return None if callback is not None else out

    def describe(self):
        """The wrapped step's last program (convweave.torch.wrap's describe()), the kinds seen
        and the programs compiled."""
        w = self.wrapped
        return {"kinds": dict(self.step.k.next), "programs": len(w._programs) if w else 0,
                "last": w.describe() if w else None}


def _check_out(out, y, t0):
    if out.shape[:2] != y.shape[:2] or out.shape[3:] != y.shape[3:] or out.shape[2] < t0 + y.shape[2] or \
            out.dtype != y.dtype:
        raise Error("CW_ERR_INVALID_ARG", f"convweave.video: out {tuple(out.shape)} {out.dtype} cannot take "
                    f"frames {t0}..{t0 + y.shape[2]} of a chunk {tuple(y.shape)} {y.dtype}")


# ---- diffusers' chunked video VAEs -------------------------------------------------------------
def _wan_decode(vae, x, cache):
    first, feats = cache
    feats = list(feats)
    if vae.post_quant_conv is not None:
        x = vae.post_quant_conv(x)
    y = vae.decoder(x, feat_cache=feats, feat_idx=[0], first_chunk=first)
    if vae.config.patch_size is not None:
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify
        y = unpatchify(y, patch_size=vae.config.patch_size)
    return torch.clamp(y, min=-1.0, max=1.0), (False, feats)


def wan_decoder(vae, **wrap_opts):
    """AutoencoderKLWan's decode through convweave, one latent frame per step as diffusers runs
    it (post_quant_conv, the decoder with its feature cache, unpatchify, clamp):
    `wan_decoder(vae, **opts)(z, out=None, callback=None)` gives `vae.decode(z).sample` with
    tiling off."""
    s = Stream(vae, _wan_decode, None, **wrap_opts)

    def decode(z, out=None, callback=None):
        s.first = (True, [None] * vae._cached_conv_counts["decoder"])
        return s([z[:, :, i:i + 1] for i in range(z.shape[2])], out=out, callback=callback)
    decode.stream = s
    return decode


def _cogvideox_decode(vae, z, cache):
    if vae.post_quant_conv is not None:
        z = vae.post_quant_conv(z)
    return vae.decoder(z, conv_cache=cache)


def cogvideox_decoder(vae, **wrap_opts):
    """AutoencoderKLCogVideoX's decode through convweave in diffusers' latent-frame batches
    (`num_latent_frames_batch_size`, the remainder in the first), each with its conv cache:
    `cogvideox_decoder(vae, **opts)(z, out=None, callback=None)` gives `vae.decode(z).sample`
    with tiling off. Its GroupNorms are per batch of frames, as diffusers' own."""
    s = Stream(vae, _cogvideox_decode, None, **wrap_opts)

    def decode(z, out=None, callback=None):
        return s(_batches(z, vae.num_latent_frames_batch_size), out=out, callback=callback)
    decode.stream = s
    return decode


def _wan_encode(vae, x, feats):
    feats = list(feats)
    h = vae.encoder(x, feat_cache=feats, feat_idx=[0])
    return vae.quant_conv(h), feats  # quant_conv: kernel 1, frame by frame


def wan_encoder(vae, **wrap_opts):
    """AutoencoderKLWan's encode through convweave, in diffusers' chunks (the first frame, then
    4 frames at a time) with its feature cache, quant_conv per chunk (a 1x1x1 conv):
    `wan_encoder(vae, **opts)(x)` gives the moments `h` of `vae.encode(x).latent_dist`
    (DiagonalGaussianDistribution(h)) with tiling off."""
    s = Stream(vae, _wan_encode, None, **wrap_opts)

    def encode(x, out=None, callback=None):
        if vae.config.patch_size is not None:
            from diffusers.models.autoencoders.autoencoder_kl_wan import patchify
            x = patchify(x, patch_size=vae.config.patch_size)
        s.first = [None] * vae._cached_conv_counts["encoder"]
        n = 1 + (x.shape[2] - 1) // 4
        chunks = [x[:, :, :1]] + [x[:, :, 1 + 4 * (i - 1):1 + 4 * i] for i in range(1, n)]
        return s(chunks, out=out, callback=callback)
    encode.stream = s
    return encode


def _cogvideox_encode(vae, x, cache):
    h, cache = vae.encoder(x, conv_cache=cache)
    return (vae.quant_conv(h) if vae.quant_conv is not None else h), cache


def cogvideox_encoder(vae, **wrap_opts):
    """AutoencoderKLCogVideoX's encode through convweave in diffusers' frame batches
    (`num_sample_frames_batch_size`, the remainder in the first) with the conv cache:
    `cogvideox_encoder(vae, **opts)(x)` gives the moments `h` of `vae.encode(x).latent_dist`
    with tiling off."""
    s = Stream(vae, _cogvideox_encode, None, **wrap_opts)

    def encode(x, out=None, callback=None):
        return s(_batches(x, vae.num_sample_frames_batch_size), out=out, callback=callback)
    encode.stream = s
    return encode


def _batches(x, fbs):
    """CogVideoX's chunks of x along dim 2: batches of fbs frames, the remainder in the first."""
    n = x.shape[2]
    rem, batches = n % fbs, max(n // fbs, 1)
    return [x[:, :, fbs * i + (0 if i == 0 else rem):fbs * (i + 1) + rem] for i in range(batches)]
