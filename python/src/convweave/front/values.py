"""What the lowering knows of each value of the exported graph: a constant (a parameter,
buffer or something folded from them), a tensor PyTorch makes at run time, a convweave node
seen through a Layout, or a zero pad waiting for the conv that folds it."""


class Const:
    """A tensor known when compiling. roots: the module's tensors it reads (their version
    is checked on every call); copied: bytes convweave made for it (0: it is a root, or a
    view of one, read in place)."""
    __slots__ = ("tensor", "roots", "copied")

    def __init__(self, tensor, roots=(), copied=0):
        self.tensor, self.roots, self.copied = tensor, tuple(roots), copied

    @property
    def shape(self):
        return tuple(self.tensor.shape)

    @property
    def dtype(self):
        return self.tensor.dtype


class Torch:
    """A tensor PyTorch computes at run time: a user input or a fallen-back node's output."""
    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name, val):
        self.name, self.shape, self.dtype = name, tuple(val.shape), val.dtype


class Cw:
    """Node `node` of segment `seg`'s graph, seen through `layout`."""
    __slots__ = ("seg", "node", "layout", "dtype")

    def __init__(self, seg, node, layout, dtype):
        self.seg, self.node, self.layout, self.dtype = seg, node, layout, dtype

    @property
    def shape(self):
        return self.layout.shape


class Pad:
    """constant_pad_nd(base, 0) read only by convs: per spatial dim, rows before and after."""
    __slots__ = ("base", "pre", "post", "shape")

    def __init__(self, base, pre, post, shape):
        self.base, self.pre, self.post, self.shape = base, pre, post, shape

    @property
    def dtype(self):
        return self.base.dtype


class Bcast:
    """expand(base, shape) of a one-channel value over C channels, read only as the second
    operand of a binary op (which broadcasts it); anything else reads base.expand(shape)."""
    __slots__ = ("base", "shape")

    def __init__(self, base, shape):
        self.base, self.shape = base, tuple(shape)

    @property
    def dtype(self):
        return self.base.dtype


class Split:
    """reshape of a node's channels (logical dim pos of base) into (k, C / k), read only by
    selects along the k: each select is a slice of the channels (Wan's upsampler splits a
    conv's output into two halves this way); anything else reads base.reshape(shape)."""
    __slots__ = ("base", "pos", "shape")

    def __init__(self, base, pos, shape):
        self.base, self.pos, self.shape = base, pos, tuple(shape)

    @property
    def dtype(self):
        return self.base.dtype


class Shuffle:
    """A depth-to-space on its way through views (LTX-Video's upsampler: reshape [B, C*F, T, H,
    W] to [B, C, fd, fh, fw, T, H, W], permute, flatten): base (an identity-layout 5-D node)
    seen as the virtual tensor of `vudims` = that 8-D split, regrouped by `vlay`. Once vlay
    merges (T, fd), (H, fh), (W, fw), it is cw_graph_depth_to_space's output; anything else
    reads base.reshape(vudims) through vlay."""
    __slots__ = ("base", "vlay", "factors")

    def __init__(self, base, vlay, factors):
        self.base, self.vlay, self.factors = base, vlay, tuple(factors)

    @property
    def shape(self):
        return self.vlay.shape

    @property
    def dtype(self):
        return self.base.dtype


def is_tensor(v):
    return isinstance(v, (Const, Torch, Cw, Pad, Bcast, Split, Shuffle))
