"""dsrt: background-dispatch image datastore and augmentation pipeline.

The Python face of libdsrt's input side. A Datastore indexes samples (a folder of
class sub-folders, a CSV manifest, IDX or CIFAR files); a Pipeline makes batches
of augmented samples from it in background threads, in order and bit-identical
for a seed whatever the thread count. Each Batch's ``images`` and ``labels``
are lent without a copy: ``torch.from_dlpack(batch.images)`` and
``numpy.from_dlpack(batch.images)`` view the pipeline's pinned host memory, and
the slot goes back to the pipeline when the last such view is freed.

TorchLoader wraps a Pipeline as a drop-in for ``torch.utils.data.DataLoader``:
iterating it yields ``(images, labels)`` torch tensors, one epoch at a time, or
``(images, soft_labels)`` when the pipeline mixes (mixup, cutmix) or smooths the
labels, as torchvision's and timm's mixup hand out their targets.

``Pipeline(..., rank=r, world_size=n)`` (or ``rank="env"``) gives a process of a
data-parallel job its share of every epoch, as DistributedSampler does.

``Net.load("model.dsrt" | "model.onnx")`` runs a trained network, as ``dstrain
classify`` does: ``predict`` on NumPy arrays or DLPack tensors, ``classify`` on
image files. ``Net`` and ``onnx_import`` live in the extension dsrt._nn, which
links libdsrt_train and oneDNN: it is loaded the first time either name is
used, so a program that only reads data never maps them.
"""

from ._dsrt import Batch, Datastore, Error, Pipeline, Tensor, options, version

# Net and onnx_import are left out of __all__: a star import loads no compute library.
__all__ = ["Batch", "Datastore", "Error", "Pipeline", "Tensor", "TorchLoader", "options", "version"]
__version__ = version()

_NN_NAMES = ("Net", "onnx_import")


def __getattr__(name):
    """Loads dsrt._nn (libdsrt_train, oneDNN) on first use of Net or onnx_import."""
    if name not in _NN_NAMES:
        raise AttributeError(f"module 'dsrt' has no attribute {name!r}")
    try:
        from . import _nn
    except ImportError as e:
        raise ImportError(
            f"dsrt.{name} needs dsrt's network library libdsrt_train (and oneDNN), which could "
            f"not be loaded: {e}. It is looked for beside the dsrt package, in the build tree "
            f"it was built in, in the library folder of `cmake --install`, and on "
            f"LD_LIBRARY_PATH; the data classes (Datastore, Pipeline) work without it."
        ) from e
    for n in _NN_NAMES:
        globals()[n] = getattr(_nn, n)
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(_NN_NAMES))


class TorchLoader:
    """An iterable of ``(images, labels)`` torch tensors over a Pipeline.

    When the pipeline makes soft labels (``mixup_alpha``, ``cutmix_alpha``,
    ``cutmix_minmax`` or ``label_smoothing``), each item is ``(images, targets)``
    instead, targets the float32 ``(count, classes)`` soft labels, each row
    summing to 1: what ``nn.CrossEntropyLoss`` takes as class probabilities and
    what timm's ``Mixup`` and torchvision's ``MixUp``/``CutMix`` return. With
    ``with_labels=True`` it is ``(images, labels, targets)``, the hard labels
    (each sample's own class) kept for accuracy.

    Usable where a ``torch.utils.data.DataLoader`` was: each ``iter()`` yields the
    batches of one epoch, ``len()`` is the batches per epoch. ``images`` is the
    batch itself (a zero-copy view of the pipeline's memory, float32 NCHW or
    uint8 NHWC); ``labels`` are converted to ``labels_dtype`` (int64 by default,
    what ``nn.CrossEntropyLoss`` takes; ``None`` keeps the int32 view).

    With ``device`` (e.g. ``"cuda"``) each batch is copied there asynchronously
    from the pinned memory; the host batch is kept until the copy has finished
    (a CUDA event), so the slot is never reused under a copy in flight.

    A host-side tensor keeps its slot lent while it lives: keep at most
    ``pipeline.slots - 1`` batches referenced while taking the next one.
    """

    def __init__(self, pipeline, device=None, non_blocking=True, labels_dtype="int64",
                 with_labels=False):
        import torch

        self.with_labels = with_labels
        self.pipeline = pipeline
        self.device = torch.device(device) if device is not None else None
        self.non_blocking = non_blocking
        self.labels_dtype = getattr(torch, labels_dtype) if isinstance(labels_dtype, str) else labels_dtype
        self._torch = torch

    def __len__(self):
        return len(self.pipeline)

    def __iter__(self):
        torch = self._torch
        on_gpu = self.device is not None and self.device.type == "cuda"
        pending = None  # (host batch, event) of the copy in flight
        for batch in self.pipeline:
            x = torch.from_dlpack(batch.images)
            y = torch.from_dlpack(batch.labels)
            if self.labels_dtype is not None and y.dtype != self.labels_dtype:
                y = y.to(self.labels_dtype)
            soft = batch.soft_labels
            t = torch.from_dlpack(soft) if soft is not None else None
            if self.device is not None:
                x = x.to(self.device, non_blocking=self.non_blocking)
                y = y.to(self.device, non_blocking=self.non_blocking)
                if t is not None:
                    t = t.to(self.device, non_blocking=self.non_blocking)
                if on_gpu and self.non_blocking:
                    event = torch.cuda.Event()
                    event.record()
                    if pending is not None:
                        pending[1].synchronize()
                    pending = (batch, event)
            del batch, soft
            if t is None:
                yield x, y
            elif self.with_labels:
                yield x, y, t
            else:
                yield x, t
        if pending is not None:
            pending[1].synchronize()
