"""How a PyTorch value sits on a convweave node: the node's dims U (contiguous N, C, (D,) H,
W) and, per logical dim, the group of U's dims it merges, row-major. view, reshape,
permute, transpose, squeeze and unsqueeze only regroup U's dims, so they cost nothing: a
[B, HW, C] attention input is the node [B, C, H, W] with groups ((0,), (2, 3), (1,))."""
import math


class Unsupported(Exception):
    """A node the lowering cannot express; the partitioner runs it in PyTorch."""


class Layout:
    __slots__ = ("udims", "groups")

    def __init__(self, udims, groups):
        self.udims = tuple(int(u) for u in udims)
        # size-1 dims of U carry no index: drop them, so equal layouts compare equal
        self.groups = tuple(tuple(j for j in g if self.udims[j] != 1) for g in groups)

    @classmethod
    def identity(cls, udims):
        return cls(udims, [(j,) for j in range(len(udims))])

    @property
    def shape(self):
        return tuple(math.prod(self.udims[j] for j in g) for g in self.groups)

    def seq(self):
        """U's dims in the logical row-major order."""
        return [j for g in self.groups for j in g]

    def is_identity(self):
        return len(self.groups) == len(self.udims) and \
            all(g == ((i,) if self.udims[i] != 1 else ()) for i, g in enumerate(self.groups))

    def __eq__(self, other):
        return isinstance(other, Layout) and self.udims == other.udims and self.groups == other.groups

    def __hash__(self):
        return hash((self.udims, self.groups))

    def __repr__(self):
        return f"Layout({list(self.udims)}, {[list(g) for g in self.groups]})"

    def reshape(self, shape):
        """view/reshape/flatten/squeeze/unsqueeze: the same row-major order cut anew. A cut
        inside one of U's dims (a channel split into heads) is not a regrouping."""
        seq, groups, i = self.seq(), [], 0
        for s in shape:
            g, n = [], 1
            while n < s and i < len(seq):
                n *= self.udims[seq[i]]
                g.append(seq[i])
                i += 1
            if n != s:
                raise Unsupported(f"reshape to {list(shape)} splits a dim of the node's {list(self.udims)}")
            groups.append(tuple(g))
        if i != len(seq):
            raise Unsupported(f"reshape to {list(shape)} of {list(self.shape)}")
        return Layout(self.udims, groups)

    def permute(self, perm):
        perm = [p % len(self.groups) for p in perm]
        return Layout(self.udims, [self.groups[p] for p in perm])

    def with_channels(self, c):
        """The same regrouping over a node with c channels (dim 1): a 1x1 conv's output."""
        u = list(self.udims)
        u[1] = c
        return Layout(u, [tuple(j for j in g) for g in self._groups_with(1)])

    def _groups_with(self, j):
        """groups with U's dim j placed where a size-1 j would have been dropped (dim 1 of a
        one-channel node is still dim 1 once it has more channels)."""
        if any(j in g for g in self.groups):
            return self.groups
        raise Unsupported(f"dim {j} of {list(self.udims)} has size 1: no logical dim holds it")

    def group_of(self, j):
        """The logical dim holding U's dim j, or None."""
        for i, g in enumerate(self.groups):
            if j in g:
                return i
        return None

    def to_torch(self, u):
        """The logical tensor over the node's tensor u (a view where torch can make one)."""
        seq = self.seq()
        rest = [j for j in range(len(self.udims)) if j not in seq]
        return u.permute(seq + rest).reshape(self.shape)
