"""diffusers' AutoencoderKL run by convweave, in two lines:

    import convweave.diffusers
    convweave.diffusers.enable(vae, budget="256MiB", streams=2)

enable() replaces vae.decoder.forward and vae.encoder.forward with plans compiled from the
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

__all__ = ["enable", "disable", "is_enabled", "last_plan", "ConvweaveDecoder", "ConvweaveEncoder"]

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
                 keep_memory=False, max_plans=4):
        self.module = module
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
        self.last_plan = None
        self.lock = threading.RLock()
        self.warned = set()  # reasons already warned about (PyTorch ran instead)

    # deepcopy / pickle / torch.save of an enabled vae: the options travel, the plans and the
    # context (library handles, device memory) do not; the copy compiles its own on first use
    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("ctx", "plans", "last_plan", "lock", "warned")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    def close(self):
        """Drops every cached plan (disable() calls it); each is freed once no one holds it
        (a Plan kept from last_plan stays readable)."""
        with self.lock:
            self.plans.clear()
            self.last_plan = None

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
                       budget=0, streams=0, patches=self.patches, fuse=self.fuse, memory=self.memory)

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
        return hit

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
        return f"<convweave {self.part}: budget {b}, {self.streams} streams, {len(self.plans)} plan(s)>"


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
           fuse=True, memory=None, torch_allocator=False, keep_memory=False, max_plans=4):
    """Makes vae.decode(z) and vae.encode(x) (vae: a diffusers AutoencoderKL, or its .decoder
    or .encoder alone) run convweave: at most `budget` of temporary memory (bytes, '256MiB',
    or None for no cap; one budget for both parts, which share a context) on `streams`
    streams (1: in order; N: N-1 heavy + 1 light). encoder=False / decoder=False leave that
    part to PyTorch (for a bare Encoder or Decoder only its own flag counts). Plans compile
    on the first call of each input shape; the parameters are read in place. Raises
    convweave.Error naming the first module or setting it does not support; then nothing is
    changed. Enabling again replaces the options and the set of wrapped parts. memory: a cap
    on activations + temporaries of each plan (like budget); where storing every activation
    needs more, blocks recompute their inner activation band by band (exact; stats() counts
    the cost); "auto" ("auto:PCT"): the least memory the memory ladder gives for at most 10
    (PCT) % more conv FLOPs, as cw-vae's default. torch_allocator=True (a CUDA vae): convweave's
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
    where only the encoder is wrapped): .last_plan has describe(), stats(), write_trace()."""
    _check_options(streams, threads, max_plans, patches)
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
                                          keep_memory=bool(keep_memory), max_plans=max_plans)
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
    for mod in _parts_of(vae).values():
        state = mod.__dict__.pop("_convweave", None)
        mod.__dict__.pop("forward", None)
        if state is not None:
            state.close()


def _state(vae, part):
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
        return any("_convweave" in m.__dict__ for m in _parts_of(vae).values())
    return _state(vae, part) is not None


def last_plan(vae, part=None):
    """The plan of the last decode (part 'decoder', the default where there is a decoder) or
    encode (part 'encoder'): describe(), stats(), write_trace(); None before one."""
    state = _state(vae, part)
    return state.last_plan if state else None
