"""convweave.torch.wrap's machinery, one room per job: export (torch.export and the
placeholders), layout (views as regroupings of a node's dims), ops (the ATen op table),
partition (the walk: segments, folds, PyTorch fallbacks), runner (the wrapped module)."""
from .runner import Wrapped

__all__ = ["Wrapped"]
