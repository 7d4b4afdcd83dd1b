"""diffusers' AutoencoderKL run by convweave, in two lines:

    import convweave.diffusers
    convweave.diffusers.enable(vae, budget="256MiB", streams=2)

For the video autoencoders (CogVideoX, Wan, HunyuanVideo, LTX-Video) enable() replaces the
vae's _decode and _encode with their untiled methods exported whole (frame-chunk loops
unrolled), run as convweave segments with PyTorch steps for the nodes convweave lacks; see
enable() and docs/torch-front.md, "Video VAEs".

For AutoencoderKL, enable() replaces vae.decoder.forward and vae.encoder.forward with plans compiled from the
modules' own parameters (read in place, never copied), one plan per input shape and dtype.
diffusers still runs quant_conv, post_quant_conv, slicing and tiling itself, exactly as
before. disable(vae) restores the modules' own forwards. There is no mapping per class: each
part goes through convweave.torch.wrap's front (torch.export, then the ATen op table;
docs/torch-front.md), with nothing left to PyTorch, and makes the plan the hand-written
mapping of earlier versions made (python/tests/test_wrap_models.py checked it, bit for bit,
before that mapping was deleted)."""
import collections
import threading
import warnings

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ._core import ArgumentError, Context, Error, format_bytes, memory_auto_pct, parse_bytes
from . import _lib as C
from .front.runner import Program

__all__ = ["enable", "disable", "is_enabled", "last_plan", "describe", "ConvweaveDecoder", "ConvweaveEncoder",
           "ConvweaveVideo"]

PARTS = ("decoder", "encoder")  # the order enable() checks and wraps them in


_HALF = (torch.float16, torch.bfloat16)


class _Mixed(Error):
    """Parameters of several dtypes (enable() refuses them; a call runs PyTorch)."""


def _unsupported(where, what):
    return Error("CW_ERR_UNSUPPORTED", f"convweave.diffusers: {where}: {what}")


class _Shared:
    """The one cw context the wrapped parts of a VAE share: one budget over their
    temporaries (a plan re-primes the pool with its own arena when it runs after the other
    part's), one set of streams and threads. Made on first use, again if the device changes.
    A copy (deepcopy, pickle) keeps the options and makes its own context when first used."""

    def __init__(self, budget, streams, timing, threads, torch_allocator=False):
        self.budget = parse_bytes(budget)
        self.streams = streams
        self.timing = timing
        self.threads = threads
        self.torch_allocator = torch_allocator
        self.ctx = None
        self.lock = threading.Lock()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("ctx", "lock")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.ctx = None
        self.lock = threading.Lock()

    def context(self, device):
        want = ("cuda" if device.type == "cuda" else "cpu", device.index or 0)
        with self.lock:
            if self.ctx is None or (self.ctx.backend, self.ctx.device) != want:
                ctx = Context(backend=want[0], device=want[1], budget=self.budget if self.budget > 0 else None,
                              streams=self.streams, threads=self.threads, flags=C.CW_FLAG_TIMING if self.timing else 0)
                if self.torch_allocator and ctx.backend == "cuda":  # before any plan: nothing held yet
                    from .torch import use_torch_allocator
                    use_torch_allocator(ctx)
                self.ctx = ctx
            return self.ctx


def _module_forward(module):
    """The module's own PyTorch forward (its class's), bound to it: what enable() replaced."""
    return type(module).forward.__get__(module)


class _Own(nn.Module):
    """What torch.export sees of a part: its class's own forward (enable() replaced the
    instance's), the part as its one submodule, named as in the vae (messages name
    "decoder.mid_block.attentions.0")."""

    def __init__(self, part, name):
        super().__init__()
        self.name = name
        self.add_module(name, part)
        # a part in training mode (a freshly built vae) exports as in eval mode where the two
        # compute the same (no dropout with p > 0, no batch norm); else export refuses it
        self.training = any((isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0) or
                            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in part.modules()) and part.training

    def forward(self, sample):
        return _module_forward(getattr(self, self.name))(sample)


class _ConvweavePart:
    """What enable() attaches to a decoder or an encoder: the options, the (shared) context,
    and the compiled plans (one per input shape, dtype and parameter set; at most max_plans,
    least recently used dropped). Every call checks the parameters (dtype, device, memory,
    in-place changes) against the plan it runs, so it never computes with stale state."""
    part = input_name = output_name = what = None  # set by the subclasses

    def __init__(self, module, budget, streams, timing, patches, threads, fuse, memory=None, shared=None,
                 keep_memory=False, max_plans=4, comm=None, gather=True):
        self.module = module
        self.comm, self.gather = comm, gather  # comm: a convweave.dist.Comm, shared (not copied) by deepcopy
        self.shared = shared if shared is not None else _Shared(budget, streams, timing, threads)
        self.budget = self.shared.budget
        self.streams = streams
        self.timing = timing
        self.patches = patches
        self.threads = threads
        self.fuse = fuse
        self.memory = memory
        self.keep_memory = keep_memory
        self.max_plans = max_plans
        self._init_runtime()
        self.dtype = self._params_state()[0]

    def _init_runtime(self):
        self.ctx = None
        self.plans = collections.OrderedDict()  # (shape, dtype, device) -> front.runner.Program
        self.last_plan = self.last_program = None
        self.lock = threading.RLock()
        self.warned = set()  # reasons already warned about (PyTorch ran instead)

    # deepcopy / pickle / torch.save of an enabled vae: the options travel, the plans and the
    # context (library handles, device memory) do not; the copy compiles its own on first use
    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items()
                if k not in ("ctx", "plans", "last_plan", "last_program", "lock", "warned")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    def close(self):
        """Drops every cached plan (disable() calls it); each is freed once no one holds it
        (a Plan kept from last_plan stays readable)."""
        with self.lock:
            self.plans.clear()
            self.last_plan = self.last_program = None

    def _params_state(self):
        """(dtype, device, pointers, versions, parameters) of the module's parameters now,
        checking that they share one dtype (a graph has one element type: float32, float16
        or bfloat16) and sit on cpu or cuda; raises Error naming the first that does not."""
        dtype = device = None
        params = []
        for n, p in self.module.named_parameters():
            if dtype is None:
                if p.dtype not in _HALF and p.dtype != torch.float32:
                    raise _unsupported(f"{self.part}.{n}", f"parameters are {p.dtype}; convweave takes float32, "
                                       "float16 or bfloat16")
                dtype, device = p.dtype, p.device
            elif p.dtype != dtype:
                raise _Mixed("CW_ERR_UNSUPPORTED", f"convweave.diffusers: {self.part}.{n}: parameters are {p.dtype}, "
                             f"others {dtype}: a convweave graph has one element type (cast the whole VAE)")
            elif p.device != device:
                raise _unsupported(f"{self.part}.{n}", f"parameters on {p.device}, others on {device}")
            if p.device.type not in ("cpu", "cuda"):
                raise _unsupported(f"{self.part}.{n}", f"device {p.device}")
            params.append(p)
        return (dtype, device, tuple(p.data_ptr() for p in params), tuple(p._version for p in params), params)

    def _pytorch(self, why, sample, *extra):
        """The module's own forward, warned once per reason."""
        if why not in self.warned:
            self.warned.add(why)
            warnings.warn(f"convweave.diffusers: the {self.part} ran in PyTorch, not convweave: {why}. Warned once.",
                          RuntimeWarning, stacklevel=4)
        return _module_forward(self.module)(sample, *extra)

    def _context(self, device):
        ctx = self.shared.context(device)
        if ctx is not self.ctx:  # a new context (device changed): plans of the old one go
            self.close()
            self.ctx = ctx
        return ctx

    def _program(self, shape, dtype, device, compile=True):
        """The part lowered through convweave.torch.wrap's front (torch.export and the op
        table) for an input of this shape, compiled; nothing may fall back to PyTorch."""
        sample = torch.empty(shape, dtype=dtype, device=device)
        flat, spec = pytree.tree_flatten(((sample,), {}))
        return Program(_Own(self.module, self.part), flat, spec, self._context, fallback=False, compile=compile,
                       budget=0, streams=0, patches=self.patches, fuse=self.fuse, memory=self.memory,
                       comm=self.comm if compile else None, gather=self.gather)

    def probe(self):
        """Lowers (does not compile) the part on the smallest input, so that what convweave
        cannot run raises at enable() time."""
        p = next(self.module.parameters())
        self._program(self.probe_shape(), p.dtype, p.device, compile=False)

    def plan_for(self, sample, state=None):
        """The Program for this input, compiled on first use and again when the parameters
        are not those it read (replaced, recast, or changed in place where it copied them:
        a half model's float32 GroupNorm vectors). Call under self.lock."""
        key = (tuple(sample.shape), sample.dtype, sample.device)
        self._context(sample.device)
        hit = self.plans.get(key)
        if hit is not None and not hit.valid():
            del self.plans[key]
            hit = None
        if hit is None:
            hit = self._program(key[0], sample.dtype, sample.device)
            self.plans[key] = hit
            while len(self.plans) > self.max_plans:
                self.plans.popitem(last=False)
        self.plans.move_to_end(key)
        self.last_plan = hit.plans()[0]
        self.last_program = hit
        return hit

    def bands(self):
        """With a process group and gather=False: per output of the last call, (dim, start,
        stop), the slice of the whole output this rank returned; None otherwise."""
        prog = getattr(self, "last_program", None)
        return prog.bands() if prog is not None else None

    def _run(self, sample, *extra):
        if not isinstance(sample, torch.Tensor) or sample.dim() != 4:
            raise ArgumentError(f"convweave.diffusers: the {self.part} takes a [N, C, h, w] tensor, got "
                                f"{getattr(sample, 'shape', type(sample).__name__)}")
        try:
            state = self._params_state()
        except _Mixed as e:
            # parameters recast in part after enable() (older diffusers' upcast_vae cast
            # conv_in and the mid block back to half; Decoder.forward casts between them):
            # PyTorch runs what one graph dtype cannot
            return self._pytorch(f"its parameters are in several dtypes ({e.message.split(': ', 1)[1]})",
                                 sample, *extra)
        dtype, device, params = state[0], state[1], state[4]
        self.dtype = dtype
        if torch.is_grad_enabled() and (sample.requires_grad or any(p.requires_grad for p in params)):
            # autograd: the module's own forward, so gradients are right (convweave is inference only)
            return self._pytorch(f"grad mode is on and its {self.what} or parameters require grad (convweave "
                                 "computes no gradients; use torch.no_grad() or torch.inference_mode() for convweave)",
                                 sample, *extra)
        if dtype is not None and sample.dtype != dtype:
            raise Error("CW_ERR_INVALID_ARG", f"convweave.diffusers: the {self.what} is {sample.dtype}, the "
                        f"{self.part}'s parameters {dtype} (as torch, convweave takes them in one dtype)")
        if device is not None and device != sample.device:
            raise Error("CW_ERR_INVALID_ARG", f"convweave.diffusers: the {self.what} is on {sample.device}, "
                        f"the {self.part}'s parameters on {device}")
        if sample.shape[0] == 0:
            raise ArgumentError(f"convweave.diffusers: the {self.what} {tuple(sample.shape)} is a batch of 0 samples "
                                f"(the {self.part} takes N >= 1)")
        with self.lock:
            prog = self.plan_for(sample, state)
            return prog.run([sample], self.keep_memory)

    def __repr__(self):
        b = format_bytes(self.budget) if self.budget > 0 else "unlimited"
        ranks = "" if self.comm is None else \
            f", rank {self.comm.rank} of {self.comm.n_ranks} ({'gathered' if self.gather else 'bands'})"
        return f"<convweave {self.part}: budget {b}, {self.streams} streams, {len(self.plans)} plan(s){ranks}>"


class ConvweaveDecoder(_ConvweavePart):
    """enable()'s state on vae.decoder: forward(latent) -> image."""
    part, input_name, output_name, what = "decoder", "latent", "sample", "latent"

    @property
    def decoder(self):
        return self.module

    def probe_shape(self):
        return (1, self.module.conv_in.in_channels, 1, 1)

    @torch.compiler.disable  # opaque to torch.compile: dynamo does not trace into ctypes
    def forward(self, sample, latent_embeds=None):
        if latent_embeds is not None:
            raise _unsupported("decoder", "latent_embeds (SpatialNorm decoders, as in MoVQ) are not supported")
        return self._run(sample)


class ConvweaveEncoder(_ConvweavePart):
    """enable()'s state on vae.encoder: forward(image) -> moments (mean and logvar, before
    quant_conv, which diffusers applies)."""
    part, input_name, output_name, what = "encoder", "image", "moments", "image"

    @property
    def encoder(self):
        return self.module

    def probe_shape(self):
        # the smallest side every stride-2 conv leaves >= 1 row: 2^(number of downsamplers)
        n = sum(len(getattr(b, "downsamplers", None) or ()) for b in self.module.down_blocks)
        return (1, self.module.conv_in.in_channels, 1 << n, 1 << n)

    @torch.compiler.disable  # opaque to torch.compile: dynamo does not trace into ctypes
    def forward(self, sample):
        return self._run(sample)


# ---- video autoencoders ---------------------------------------------------------------------
# CogVideoX, Wan, HunyuanVideo and LTX-Video decode and encode through methods of the vae
# itself (_decode, _encode), not one forward of a part: CogVideoX and Wan loop over frame
# chunks carrying conv caches in Python. enable() lowers the whole untiled method through
# torch.export for a fixed input shape, which unrolls those loops into one graph, and runs
# it as convweave segments with PyTorch steps between them (the nodes the op table lacks).
# The tiling and framewise switches are forced off while exporting: convweave's memory
# scheduling replaces them, and its result is the untiled one.
_VIDEO = ("AutoencoderKLCogVideoX", "AutoencoderKLWan", "AutoencoderKLHunyuanVideo", "AutoencoderKLLTXVideo")
# The parts whose diffusers method is a loop over frame chunks with a cache: run as one chunk
# step wrapped once per cache kind (convweave.video), so their programs and their peak do not
# grow with the frame count; the others export their method whole.
_STREAMED = {("AutoencoderKLWan", "decoder"): "wan_decoder", ("AutoencoderKLWan", "encoder"): "wan_encoder",
             ("AutoencoderKLCogVideoX", "decoder"): "cogvideox_decoder",
             ("AutoencoderKLCogVideoX", "encoder"): "cogvideox_encoder"}
_TILING = ("use_tiling", "use_framewise_encoding", "use_framewise_decoding")


def _video_class(vae):
    """The name of the diffusers video autoencoder class vae is (or subclasses), else None."""
    try:
        import diffusers
    except ImportError:
        return None
    for name in _VIDEO:
        cls = getattr(diffusers, name, None)
        if cls is not None and isinstance(vae, cls):
            return name
    return None


class _Untiled(nn.Module):
    """What torch.export sees of a video vae's decode or encode: the class's own _decode
    (_encode) with tiling off (and framewise off where exact), returning the tensor."""

    def __init__(self, vae, part, exact):
        super().__init__()
        self.vae = vae
        self.method = "_decode" if part == "decoder" else "_encode"
        self.off = tuple(f for f in _TILING if hasattr(vae, f) and (f == "use_tiling" or exact))
        # as _Own: a vae in training mode exports as in eval where the two compute the same
        self.training = any((isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0) or
                            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in vae.modules()) and vae.training

    def forward(self, x, *extra):
        vae = self.vae
        saved = {f: getattr(vae, f) for f in self.off}
        try:
            for f in self.off:
                setattr(vae, f, False)
            fn = getattr(type(vae), self.method)
            if self.method == "_encode":
                return fn(vae, x)
            out = fn(vae, x, *extra, return_dict=False)
            return out[0]
        finally:
            for f, v in saved.items():
                setattr(vae, f, v)


class ConvweaveVideo(_ConvweavePart):
    """enable()'s state on one part of a video autoencoder, installed as the vae's _decode
    (part "decoder": latent [N, C, T, h, w] -> video) or _encode (part "encoder": video
    [N, 3, T, H, W] -> moments, before DiagonalGaussianDistribution), so vae.decode and
    vae.encode keep diffusers' return types and slicing. One compiled Program per input
    signature (shape, dtype, device, LTX's temb), at most max_plans; nodes the op table lacks
    run in PyTorch between convweave segments (describe()["fallbacks"])."""

    def __init__(self, vae, part, exact, *args, **kwargs):
        self.part = part
        self.what = "latent" if part == "decoder" else "video"
        self.cls = _video_class(vae)
        self.exact = exact
        self.streamed = _STREAMED.get((self.cls, part))
        self.stream = None
        super().__init__(vae, *args, **kwargs)

    def _program(self, flat, compile=True):
        spec = pytree.tree_flatten(((*flat,), {}))[1]
        return Program(_Untiled(self.module, self.part, self.exact), list(flat), spec, self._context, fallback=True,
                       compile=compile, budget=0, streams=0, patches=self.patches, fuse=self.fuse, memory=self.memory)

    def probe(self):
        """Exports and lowers (does not compile) the part on a small input, so that an
        export failure raises at enable() time."""
        p = next(self.module.parameters())
        cfg = self.module.config
        if self.part == "decoder":
            c = getattr(cfg, "latent_channels", None) or getattr(cfg, "z_dim", None)
            shape = (1, c, 1, 2, 2)
        else:
            s = getattr(self.module, "spatial_compression_ratio", None) or 8
            shape = (1, getattr(cfg, "in_channels", 3), 1, s, s)
        ins = [torch.zeros(shape, dtype=p.dtype, device=p.device)]
        if self.part == "decoder" and getattr(cfg, "timestep_conditioning", False):
            ins.append(torch.zeros(1, dtype=p.dtype, device=p.device))  # LTX 0.9.1+: decode(z, temb)
        self._program(ins, compile=False)

    def _pytorch(self, why, x, *extra):
        if why not in self.warned:
            self.warned.add(why)
            warnings.warn(f"convweave.diffusers: the {self.cls} {self.part} ran in PyTorch, not convweave: {why}. "
                          "Warned once.", RuntimeWarning, stacklevel=4)
        fn = getattr(type(self.module), "_decode" if self.part == "decoder" else "_encode")
        if self.part == "encoder":
            return fn(self.module, x)
        return fn(self.module, x, *extra, return_dict=False)[0]

    def program_for(self, inputs):
        """The Program for these inputs, compiled on first use and again when the parameters
        are not those it read. Call under self.lock."""
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        self._context(inputs[0].device)
        hit = self.plans.get(key)
        if hit is not None and not hit.valid():
            del self.plans[key]
            hit = None
        if hit is None:
            hit = self._program(inputs)
            self.plans[key] = hit
            while len(self.plans) > self.max_plans:
                self.plans.popitem(last=False)
        self.plans.move_to_end(key)
        self.last_program = hit
        plans = hit.plans()
        self.last_plan = plans[0] if plans else None
        return hit

    def _init_runtime(self):
        super()._init_runtime()
        self.last_program = None
        self.stream = None  # convweave.video's runner of a streamed part, made at its first call

    def __getstate__(self):
        return {k: v for k, v in super().__getstate__().items() if k not in ("last_program", "stream")}

    def close(self):
        with self.lock:
            super().close()
            self.last_program = None
            self.stream = None

    def describe(self):
        """The last call's Program: its convweave segments (each plan's stats()), the nodes
        run by convweave, folded, and run by PyTorch (op, shape, bytes, reason, source line);
        None before the first call."""
        return self.last_program.describe() if self.last_program is not None else None

    def run(self, x, *extra):
        """The untiled _decode(x, *extra) (_encode(x)) tensor, run by convweave."""
        if not isinstance(x, torch.Tensor) or x.dim() != 5:
            raise ArgumentError(f"convweave.diffusers: the {self.cls} {self.part} takes a [N, C, T, H, W] tensor, got "
                                f"{getattr(x, 'shape', type(x).__name__)}")
        extra = tuple(e for e in extra if e is not None)
        on = [f for f in _TILING if getattr(self.module, f, False) and (f == "use_tiling" or self.exact)]
        if on:
            why = ", ".join(on)
            if why not in self.warned:
                self.warned.add(why)
                warnings.warn(f"convweave.diffusers: {self.cls}.{why} is set but enable()d {self.part}s compute the "
                              "untiled result (convweave bounds the memory instead); disable(vae) for diffusers' "
                              "tiled one. Warned once.", RuntimeWarning, stacklevel=4)
        try:
            state = self._params_state()
        except _Mixed as e:
            return self._pytorch(f"its parameters are in several dtypes ({e.message.split(': ', 1)[1]})", x, *extra)
        dtype, device, params = state[0], state[1], state[4]
        self.dtype = dtype
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
            return self._pytorch(f"grad mode is on and its {self.what} or parameters require grad (convweave "
                                 "computes no gradients; use torch.no_grad() or torch.inference_mode() for convweave)",
                                 x, *extra)
        if x.dtype != dtype:
            raise Error("CW_ERR_INVALID_ARG", f"convweave.diffusers: the {self.what} is {x.dtype}, the "
                        f"{self.cls}'s parameters {dtype} (as torch, convweave takes them in one dtype)")
        if x.device != device:
            raise Error("CW_ERR_INVALID_ARG", f"convweave.diffusers: the {self.what} is on {x.device}, "
                        f"the {self.cls}'s parameters on {device}")
        if x.shape[0] == 0:
            raise ArgumentError(f"convweave.diffusers: the {self.what} {tuple(x.shape)} is a batch of 0 samples")
        with self.lock:
            if self.streamed:
                return self._run_stream(x)
            prog = self.program_for((x, *extra))
            with torch.no_grad():
                return prog.run([x, *extra], self.keep_memory)

    def _run_stream(self, x):
        """Wan's and CogVideoX's chunked loop, one chunk step at a time (convweave.video)."""
        if self.stream is None:
            from . import video
            self.stream = getattr(video, self.streamed)(
                self.module, budget=self.budget if self.budget > 0 else None, streams=self.streams,
                patches=self.patches, fuse=self.fuse, memory=self.memory, keep_memory=self.keep_memory,
                max_plans=max(4, self.max_plans), threads=self.threads, timing=self.timing)
        with torch.no_grad():
            out = self.stream(x)
        w = self.stream.stream.wrapped
        self.last_program = w.last_program
        plans = w.plans()
        self.last_plan = plans[0] if plans else None
        return out

    def __repr__(self):
        b = format_bytes(self.budget) if self.budget > 0 else "unlimited"
        return f"<convweave {self.cls} {self.part}: budget {b}, {self.streams} streams, {len(self.plans)} plan(s)>"


class _VideoDecode:
    """The vae's _decode while enabled: diffusers' decode() calls it per slice."""

    def __init__(self, state):
        self.state = state

    @torch.compiler.disable
    def __call__(self, z, *args, return_dict=True, temb=None):
        # LTX-Video's is _decode(z, temb=None, return_dict=True), the others' _decode(z, return_dict=True)
        if self.state.cls == "AutoencoderKLLTXVideo":
            args = args + (temb, return_dict)[len(args):]
            temb, return_dict = args[0], args[1]
        elif args:
            return_dict = args[0]
        from diffusers.models.autoencoders.vae import DecoderOutput
        out = self.state.run(z, temb)
        return DecoderOutput(sample=out) if return_dict else (out,)


class _VideoEncode:
    """The vae's _encode while enabled: the moments diffusers' encode() wraps in a
    DiagonalGaussianDistribution."""

    def __init__(self, state):
        self.state = state

    @torch.compiler.disable
    def __call__(self, x):
        return self.state.run(x)


def _enable_video(vae, name, want, exact, **opts):
    """enable() on a video autoencoder (name: its class): every check, then the change."""
    shared = _Shared(opts.pop("budget"), opts["streams"], opts["timing"], opts["threads"], opts.pop("torch_allocator"))
    states = {}
    for part in PARTS:
        if not want[part]:
            continue
        if not isinstance(getattr(vae, part, None), nn.Module):
            raise _unsupported(name, f"no {part} to wrap ({part}=True; pass {part}=False)")
        states[part] = ConvweaveVideo(vae, part, exact, shared.budget, opts["streams"], opts["timing"],
                                      opts["patches"], opts["threads"], opts["fuse"], opts["memory"], shared,
                                      keep_memory=bool(opts["keep_memory"]), max_plans=opts["max_plans"])
        try:
            states[part].probe()
        except Error as e:
            if e.status != "CW_ERR_UNSUPPORTED":
                raise
            raise _unsupported(f"{name}.{part}", f"cannot export its untiled {part} ({e.message})") from e
    disable(vae)
    on = [f for f in _TILING if getattr(vae, f, False) and (f == "use_tiling" or exact)]
    if getattr(vae, "use_tiling", False):  # the framewise switches are on by default (HunyuanVideo): no warning
        warnings.warn(f"convweave.diffusers: enable() turned {name}.use_tiling off: convweave computes the "
                      "untiled result under its memory cap; disable(vae) turns it back on", RuntimeWarning,
                      stacklevel=3)
    vae.__dict__["_convweave_video"] = {"states": states, "saved": {f: getattr(vae, f) for f in on}}
    for f in on:
        setattr(vae, f, False)
    if "decoder" in states:
        vae.__dict__["_decode"] = _VideoDecode(states["decoder"])
    if "encoder" in states:
        vae.__dict__["_encode"] = _VideoEncode(states["encoder"])
    return states.get("decoder") or states["encoder"]


_CLASSES = {"decoder": ConvweaveDecoder, "encoder": ConvweaveEncoder}
_LAYOUT = {"decoder": ("conv_in", "mid_block", "up_blocks", "conv_norm_out", "conv_act", "conv_out"),
           "encoder": ("conv_in", "down_blocks", "mid_block", "conv_norm_out", "conv_act", "conv_out")}


def _parts_of(vae):
    """{'decoder': module, 'encoder': module} of an AutoencoderKL (the parts it has), or of a
    bare Encoder (has down_blocks) or Decoder (anything else) as its one part. Unchecked."""
    if hasattr(vae, "decoder") or hasattr(vae, "encoder"):
        return {p: getattr(vae, p) for p in PARTS if isinstance(getattr(vae, p, None), nn.Module)}
    return {"encoder" if hasattr(vae, "down_blocks") else "decoder": vae}


def _check_layout(vae, part, mod):
    for attr in _LAYOUT[part]:
        if not hasattr(mod, attr):
            raise _unsupported(type(vae).__name__, f"no {part} with '{attr}' (expected diffusers' AutoencoderKL "
                               f"or its {part.capitalize()})")


def _check_class(vae, part, mod):
    """The part must be diffusers' own Decoder / Encoder with its own forward (the one the
    graph mirrors and enable() replaces): AsymmetricAutoencoderKL's MaskConditionDecoder,
    the video VAEs' causal 3-D parts and subclasses with another forward are refused."""
    try:
        from diffusers.models.autoencoders.vae import Decoder, Encoder
    except ImportError:  # no diffusers: modules of the same layout, checked by the builder
        return
    cls = Decoder if part == "decoder" else Encoder
    if not isinstance(mod, cls) or type(mod).forward is not cls.forward:
        where = part if mod is vae else f"{type(vae).__name__}.{part}"
        raise _unsupported(where, f"{type(mod).__name__} (only diffusers' {cls.__name__}, as AutoencoderKL has: "
                           f"convweave replaces its forward with a graph of that forward)")


def _check_options(streams, threads, max_plans, patches):
    if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= C.PLAN_STREAM_COUNT:
        raise ArgumentError(f"convweave.diffusers: streams={streams!r}: expected an int in 1..{C.PLAN_STREAM_COUNT}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ArgumentError(f"convweave.diffusers: threads={threads!r}: expected an int >= 0 (0: every core)")
    if isinstance(max_plans, bool) or not isinstance(max_plans, int) or max_plans < 1:
        raise ArgumentError(f"convweave.diffusers: max_plans={max_plans!r}: expected an int >= 1")
    if patches is not None and patches != "none" and (isinstance(patches, bool) or not isinstance(patches, int) or
                                                      patches < 1):
        raise ArgumentError(f"convweave.diffusers: patches={patches!r}: expected None, 'none' or an int >= 1")


def enable(vae, budget="256MiB", streams=2, *, encoder=True, decoder=True, timing=True, patches=None, threads=0,
           fuse=True, memory=None, torch_allocator=False, keep_memory=False, max_plans=4, exact=True,
           process_group=None, gather=True):
    """Makes vae.decode(z) and vae.encode(x) (vae: a diffusers AutoencoderKL, or its .decoder
    or .encoder alone; or one of the video autoencoders AutoencoderKLCogVideoX, AutoencoderKLWan,
    AutoencoderKLHunyuanVideo, AutoencoderKLLTXVideo, see below) run convweave: at most
    `budget` of temporary memory (bytes, '256MiB',
    or None for no cap; one budget for both parts, which share a context) on `streams`
    streams (1: in order; N: N-1 heavy + 1 light). encoder=False / decoder=False leave that
    part to PyTorch (for a bare Encoder or Decoder only its own flag counts). Plans compile
    on the first call of each input shape; the parameters are read in place. Raises
    convweave.Error naming the first module or setting it does not support; then nothing is
    changed. Enabling again replaces the options and the set of wrapped parts. memory: a cap
    on activations + temporaries of each plan (like budget); where storing every activation
    needs more, blocks recompute their inner activation band by band (exact; stats() counts
    the cost); "auto" ("auto:PCT"): the least memory the memory ladder gives for at most 10
    (PCT) % more conv time (the backend's cost model; on cuda, which ranks its algorithms
    without times, % more conv FLOPs), as cw-vae's default. torch_allocator=True (a CUDA vae): convweave's
    memory (temporaries within the budget, activations) comes from PyTorch's caching
    allocator, so torch.cuda.memory_allocated() counts it and the two share cached memory
    (convweave.torch.use_torch_allocator); raises Error CW_ERR_UNSUPPORTED for a vae on cpu.
    keep_memory=False (the default): after each call its plan gives its activation arena and
    temporaries back (Plan.release; on cuda to PyTorch's caching allocator where
    torch_allocator=True), so nothing is held between calls; keep_memory=True keeps them for
    the next call of that shape (saves the allocation and first-touch cost; see the README).
    max_plans: the most compiled plans kept per part (one per input shape and dtype), least
    recently used dropped first. Every call checks the parameters' dtype, device, memory and
    in-place versions against its plan: replaced parameters (vae.to(dtype), load_state_dict
    with assign) compile a new plan, parameters changed in place are read in place (half
    GroupNorm vectors' float32 copies refreshed). With grad mode on and the input or a
    parameter requiring grad, the module's own PyTorch forward runs (a warning says so once),
    so gradients are right; use torch.no_grad() for convweave. The forward is opaque to
    torch.compile (torch.compiler.disable). deepcopy / pickle / torch.save of an enabled vae
    work: the copy is enabled with the same options and compiles its own plans.
    Returns the ConvweaveDecoder attached to the decoder (the ConvweaveEncoder
    where only the encoder is wrapped): .last_plan has describe(), stats(), write_trace().

    Video autoencoders: the vae's own _decode / _encode (diffusers' decode() and encode() call
    them, so their return types and slicing stay) are replaced by the untiled method exported
    whole through convweave.torch.wrap's front for each input shape (CogVideoX's and Wan's
    frame-chunk loops with their conv caches unroll into one graph); nodes the op table lacks
    run in PyTorch between convweave segments (ConvweaveVideo.describe()["fallbacks"], or
    convweave.diffusers.describe(vae)). The result is the untiled one: enable() turns
    use_tiling off (a warning when it was on) and disable() turns it back on; tiling switched
    on later is ignored (warned once). exact=True (the default): HunyuanVideo's and LTX's
    use_framewise_encoding / use_framewise_decoding are turned off too, so the result is the
    true un-windowed decode (HunyuanVideo turns framewise decoding on by default: diffusers'
    decode of more than 4 latent frames blends overlapping windows and differs from it);
    exact=False keeps them as set and computes diffusers' framewise result. Returns the
    ConvweaveVideo of the decoder (of the encoder where only it is wrapped).

    process_group (an AutoencoderKL on cpu): a torch.distributed gloo process group
    (dist.group.WORLD) or a convweave.dist.Comm: each decode and encode is split across the
    group's processes as convweave.torch.wrap does (see it), bit-identical to one process
    with the same patches=N. Every rank calls vae.decode / vae.encode with the same input
    (the plan's compile checks shapes, weights and options agree, else convweave.Error on
    every rank naming what differs). gather=True: every rank gets the whole image or
    moments; gather=False: each rank its band of rows (dim 2; the decoder's
    ConvweaveDecoder.bands() after a call names them), which diffusers' post-processing
    (quant_conv, the latent distribution) handles row by row. CUDA vaes and the video
    autoencoders with a process group raise convweave.Error (CW_ERR_UNSUPPORTED). A vae
    enabled with a process group cannot be pickled (deepcopy shares its Comm)."""
    _check_options(streams, threads, max_plans, patches)
    if not isinstance(gather, bool):
        raise ArgumentError(f"convweave.diffusers: gather={gather!r}: expected True or False")
    found = _parts_of(vae)
    want = {"decoder": decoder, "encoder": encoder}
    if len(found) == 1 and not hasattr(vae, "decoder") and not hasattr(vae, "encoder"):
        part = next(iter(found))  # a bare Decoder or Encoder
        if not want[part]:
            raise ArgumentError(f"convweave.diffusers: {part}=False on a bare {part}: nothing to wrap")
        want = {p: p == part for p in PARTS}
    if not any(want.values()):
        raise ArgumentError("convweave.diffusers: encoder=False and decoder=False: nothing to wrap")
    if memory is not None and memory_auto_pct(memory) is None:
        parse_bytes(memory)  # a bad size raises here, before anything is wrapped
    video = _video_class(vae)
    if process_group is not None:
        if video is not None:
            raise _unsupported(video, "process_group: the video autoencoders do not run across processes yet")
        devices = {p.device.type for m in found.values() for p in m.parameters()}
        if devices - {"cpu"}:
            raise _unsupported(type(vae).__name__, f"process_group with parameters on {', '.join(sorted(devices))}: "
                               "convweave.dist moves host memory through gloo; NCCL from Python is not supported")
    from .dist import as_comm
    comm = as_comm(process_group)
    if video is not None:
        if not isinstance(exact, bool):
            raise ArgumentError(f"convweave.diffusers: exact={exact!r}: expected True or False")
        return _enable_video(vae, video, want, exact, budget=budget, streams=streams, timing=timing, patches=patches,
                             threads=threads, fuse=fuse, memory=memory, torch_allocator=torch_allocator,
                             keep_memory=keep_memory, max_plans=max_plans)
    if torch_allocator:
        devices = {p.device.type for m in found.values() for p in m.parameters()}
        if devices != {"cuda"}:
            raise _unsupported(type(vae).__name__, f"torch_allocator=True takes PyTorch's CUDA caching allocator, "
                               f"the vae's parameters are on {', '.join(sorted(devices)) or 'no device'} (move it to "
                               "CUDA first)")
    shared = _Shared(budget, streams, timing, threads, torch_allocator)
    states = {}
    for part in PARTS:  # every check before any change
        if not want[part]:
            continue
        if part not in found:
            raise _unsupported(type(vae).__name__, f"no {part} to wrap ({part}=True; pass {part}=False)")
        _check_layout(vae, part, found[part])
        _check_class(vae, part, found[part])
        try:
            states[part] = _CLASSES[part](found[part], budget, streams, timing, patches, threads, fuse, memory, shared,
                                          keep_memory=bool(keep_memory), max_plans=max_plans, comm=comm,
                                          gather=gather)
            states[part].probe()
        except Error as e:  # what the front cannot lower whole (an export failure, a PyTorch node)
            if e.status != "CW_ERR_UNSUPPORTED":
                raise
            raise _unsupported(part if found[part] is vae else f"{type(vae).__name__}.{part}",
                               f"cannot map {type(found[part]).__name__} ({e.message})") from e
    disable(vae)
    for part, state in states.items():
        found[part]._convweave = state
        found[part].forward = state.forward
    return states.get("decoder") or states["encoder"]


def disable(vae):
    """Restores the decoder's and the encoder's own forwards and frees their plans. A no-op
    for a part that is not enabled."""
    video = vae.__dict__.pop("_convweave_video", None) if isinstance(vae, nn.Module) else None
    if video is not None:
        vae.__dict__.pop("_decode", None)
        vae.__dict__.pop("_encode", None)
        for f, v in video["saved"].items():
            setattr(vae, f, v)
        for state in video["states"].values():
            state.close()
    for mod in _parts_of(vae).values():
        state = mod.__dict__.pop("_convweave", None)
        mod.__dict__.pop("forward", None)
        if state is not None:
            state.close()


def _state(vae, part):
    video = vae.__dict__.get("_convweave_video") if isinstance(vae, nn.Module) else None
    if video is not None:
        if part is not None and part not in PARTS:
            raise ArgumentError(f"convweave.diffusers: part {part!r}: expected 'decoder' or 'encoder'")
        states = video["states"]
        return states.get(part) if part else states.get("decoder") or states.get("encoder")
    found = _parts_of(vae)
    if part is None:
        part = "decoder" if "decoder" in found else "encoder"
    elif part not in PARTS:
        raise ArgumentError(f"convweave.diffusers: part {part!r}: expected 'decoder' or 'encoder'")
    mod = found.get(part)
    return mod.__dict__.get("_convweave") if mod is not None else None


def is_enabled(vae, part=None):
    """Whether enable() wrapped the vae's `part` ('decoder' or 'encoder'); part None: either."""
    if part is None:
        return _state(vae, None) is not None or any("_convweave" in m.__dict__ for m in _parts_of(vae).values())
    return _state(vae, part) is not None


def last_plan(vae, part=None):
    """The plan of the last decode (part 'decoder', the default where there is a decoder) or
    encode (part 'encoder'): describe(), stats(), write_trace(); None before one."""
    state = _state(vae, part)
    return state.last_plan if state else None


def describe(vae, part=None):
    """What the last decode (part 'decoder', the default where there is one) or encode ran:
    for a video autoencoder, its Program's segments (each plan's stats()), the nodes run by
    convweave, folded and run by PyTorch (describe()["fallbacks"]: op, shape, bytes, reason,
    source line); for an AutoencoderKL, its one plan's describe(). None before a call."""
    state = _state(vae, part)
    if state is None:
        return None
    if isinstance(state, ConvweaveVideo):
        return state.describe()
    return state.last_plan.describe() if state.last_plan is not None else None
