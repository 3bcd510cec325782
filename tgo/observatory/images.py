"""Per-image vectors of every observation point, gathered to rank 0 by the observation's own sum all-reduce.

The hypothesis probes (``docs/hypotheses.md``) need one vector per analysis image and point: the mean of the point's
tokens (for the law of total covariance over images), its CLS token and the mean of its patch tokens (for
class-conditional geometry, decoding probes, CKA). `ImageTable` holds them as float64 ``[n_images, D]`` matrices in
which every rank writes only the rows of its own images, at their index in the analysis subset, and leaves zeros
elsewhere. Summing the tables of all ranks (the second of the observation's two collectives, packed with the
covariance states) therefore *gathers* them exactly: adding zeros is exact. The same trick gives the per-dimension
``max |x|`` of every rank (row = rank) for the massive-activation probe, and a per-image visit count that proves every
image was seen exactly once.

Memory: ``n_images x D x 8`` bytes per vector kind and point (1,000 images x 384 x 8 = 3 MB; about 120 MB for the
15 points of ViT-S, which has three kinds at 13 points), once on every rank and once in the reduction buffer. A
model with more than one prefix token (registers, a distillation token) also keeps every prefix token of every
image at its sequence points (``prefix`` tokens more vectors per image: 5 with 4 registers, ~15 MB more per point at
1,000 images and D = 384), which the ``patch`` and ``prefix`` views need.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ImageTable", "ImageVectors", "TokenLayout"]


@dataclass(frozen=True)
class TokenLayout:
    """What the rows a point hands to its accumulator are, per image.

    Attributes:
        tokens: The point's token selection (``all``, ``cls``, ``patch``, ``mean``).
        prefix: Class + register tokens at the start of each image's rows (0 for the patch embedding and for
            selections without prefix tokens).
        class_token: Whether the first prefix token is a class token (a model without one may still have register
            tokens: those are ``prefix`` tokens, never ``cls``).
    """

    tokens: str
    prefix: int = 0
    class_token: bool = True

    @property
    def kinds(self) -> tuple[str, ...]:
        """The per-image vectors this point provides.

        ``mean``: the mean of the image's rows (selections with several rows per image); ``cls``: the class token;
        ``patch``: the mean of the patch tokens; ``prefix``: every prefix token (``[prefix, D]`` per image), only where
        there is more than a class token (registers, a distillation token), so that the ``patch`` view can remove
        all of them and the ``prefix`` view hold them. A selection without prefix tokens (``patch``, or ``all`` at the
        patch embedding) has ``patch`` equal to ``mean``, stored once as ``mean``.
        """
        kinds: list[str] = []
        if self.tokens in ("all", "patch"):
            kinds.append("mean")
        if self.tokens == "cls" or (self.tokens == "all" and self.prefix >= 1 and self.class_token):
            kinds.append("cls")
        if self.tokens == "mean" or (self.tokens == "all" and self.prefix >= 1):
            kinds.append("patch")
        if self.tokens == "all" and (self.prefix > 1 or (self.prefix == 1 and not self.class_token)):
            kinds.append("prefix")
        return tuple(kinds)

    def shape_of(self, kind: str, dim: int) -> tuple[int, ...]:
        """The shape of one image's entry of a kind: ``(prefix, D)`` for ``prefix``, ``(D,)`` otherwise."""
        return (self.prefix, dim) if kind == "prefix" else (dim,)


class ImageVectors:
    """The per-image vectors, per-rank ``max |x|`` and rows-per-image of one point on one rank.

    Args:
        n_images: Size of the analysis subset (rows of every matrix).
        dim: Feature dimension.
        layout: What the point's rows are.
        rank: This rank (its row of ``max_abs`` and ``rows_per_image``).
        world_size: Number of ranks.
        device: Where the matrices live (the accumulators' device, so the collective stays there).
    """

    def __init__(
        self,
        n_images: int,
        dim: int,
        layout: TokenLayout,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str | None = None,
    ) -> None:
        self.n_images, self.dim, self.layout = int(n_images), int(dim), layout
        self.rank, self.world_size = int(rank), int(world_size)
        device = torch.device(device) if device is not None else torch.device("cpu")
        with torch.inference_mode(False):
            self.values = {
                k: torch.zeros(self.n_images, *layout.shape_of(k, self.dim), dtype=torch.float64, device=device)
                for k in layout.kinds
            }
            self.max_abs = torch.zeros(self.world_size, self.dim, dtype=torch.float64, device=device)
            self.rows_per_image = torch.zeros(self.world_size, dtype=torch.float64, device=device)
        self.batch_index: torch.Tensor | None = None

    @property
    def packed_size(self) -> int:
        """Length of the flat state: rows per image ``[W]``, ``max |x|`` ``[W, D]``, each kind ``[n_images, D]`` (or
        ``[n_images, prefix, D]``)."""
        return self.world_size * (1 + self.dim) + sum(t.numel() for t in self.values.values())

    def update(self, x: torch.Tensor) -> None:
        """Writes the vectors of the images of one batch at their subset indices (``batch_index``)."""
        index = self.batch_index
        if index is None or index.shape[0] != x.shape[0]:
            raise RuntimeError(
                f"ImageVectors.update: batch_index must hold the subset index of each image of the batch "
                f"({x.shape[0]}); got {None if index is None else tuple(index.shape)}"
            )
        rows = x.detach().flatten(1, -2) if x.dim() > 2 else x.detach()[:, None, :]
        index = index.to(device=self.max_abs.device, dtype=torch.long)
        with torch.inference_mode(False):
            self.rows_per_image[self.rank] = float(rows.shape[1])
            peak = rows.abs().amax(dim=(0, 1)).to(device=self.max_abs.device, dtype=torch.float64)
            self.max_abs[self.rank] = torch.maximum(self.max_abs[self.rank], peak)
            prefix = self.layout.prefix if self.layout.tokens == "all" else 0
            for kind, table in self.values.items():
                if kind == "mean":
                    vec = rows.mean(dim=1, dtype=torch.float64)
                elif kind == "prefix":  # [B, prefix, D]: every prefix token of each image
                    vec = rows[:, :prefix].to(torch.float64)
                elif kind == "cls" or self.layout.tokens == "mean":
                    vec = rows[:, 0].to(torch.float64)
                else:  # patch tokens of a sequence with prefix tokens
                    vec = rows[:, prefix:].mean(dim=1, dtype=torch.float64)
                table.index_copy_(0, index, vec.to(table.device))

    def pack_into(self, out: torch.Tensor) -> None:
        """Writes the flat state into ``out`` (a float64 slice of the observation's reduction buffer)."""
        w, d = self.world_size, self.dim
        out[:w].copy_(self.rows_per_image)
        out[w : w + w * d].view(w, d).copy_(self.max_abs)
        offset = w + w * d
        for table in self.values.values():
            out[offset : offset + table.numel()].view(table.shape).copy_(table)
            offset += table.numel()

    def unpack_(self, flat: torch.Tensor) -> None:
        """Takes the summed state (views of ``flat``, which the reduction owns)."""
        w, d = self.world_size, self.dim
        self.rows_per_image = flat[:w]
        self.max_abs = flat[w : w + w * d].view(w, d)
        offset = w + w * d
        for kind, table in self.values.items():
            self.values[kind] = flat[offset : offset + table.numel()].view(table.shape)
            offset += table.numel()

    # ------------------------------------------------------------------ after the reduction (rank 0)
    @property
    def tokens_per_image(self) -> int:
        """Rows each image contributed (the same on every rank that saw images)."""
        return int(self.rows_per_image.max().item()) if self.rows_per_image.numel() else 0

    def peak_abs(self) -> torch.Tensor:
        """Per-dimension ``max |x|`` over every rank, float64 ``[D]``."""
        return self.max_abs.amax(dim=0)


class ImageTable:
    """Every point's `ImageVectors` plus, per image, its label and how many times a rank streamed it.

    After the reduction ``visits`` must be 1 for every image: 0 means an image was never observed, 2 that two ranks
    (or one, twice) counted it; either would silently bias every observable, so `check_visits` refuses it.
    """

    def __init__(
        self, n_images: int, *, rank: int = 0, world_size: int = 1, device: torch.device | str | None = None
    ) -> None:
        self.n_images, self.rank, self.world_size = int(n_images), int(rank), int(world_size)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        with torch.inference_mode(False):
            self.visits = torch.zeros(self.n_images, dtype=torch.float64, device=self.device)
            self.labels = torch.zeros(self.n_images, dtype=torch.float64, device=self.device)
        self.points: dict[str, ImageVectors] = {}
        self.batch_index: torch.Tensor | None = None
        """Subset indices of the batch being streamed (set by the streaming loop before each forward)."""
        self.order: list[str] = []
        """Point names in the order every rank packs them (the observation's point order)."""

    def add_point(self, name: str, dim: int, layout: TokenLayout) -> ImageVectors:
        """Creates (or returns) the point's vectors."""
        if name not in self.points:
            self.points[name] = ImageVectors(
                self.n_images, dim, layout, rank=self.rank, world_size=self.world_size, device=self.device
            )
        return self.points[name]

    def record_batch(self, index: torch.Tensor, labels: torch.Tensor) -> None:
        """Counts one visit of each image of the batch and stores its label."""
        index = index.to(device=self.device, dtype=torch.long)
        with torch.inference_mode(False):
            self.visits.index_add_(0, index, torch.ones(index.shape[0], dtype=torch.float64, device=self.device))
            self.labels.index_copy_(0, index, labels.to(device=self.device, dtype=torch.float64))

    def _packed_points(self) -> list[ImageVectors]:
        # Hooks fire in forward order and a rank without images creates its vectors afterwards, so the packing order
        # is the explicit point order, identical on every rank.
        missing = [n for n in self.order if n not in self.points]
        if missing or len(self.order) != len(self.points):
            raise RuntimeError(f"ImageTable: points {sorted(self.points)} do not match the point order {self.order}")
        return [self.points[n] for n in self.order]

    @property
    def packed_size(self) -> int:
        return 2 * self.n_images + sum(v.packed_size for v in self._packed_points())

    def pack_into(self, out: torch.Tensor) -> None:
        n = self.n_images
        out[:n].copy_(self.visits)
        out[n : 2 * n].copy_(self.labels)
        offset = 2 * n
        for vectors in self._packed_points():
            vectors.pack_into(out[offset : offset + vectors.packed_size])
            offset += vectors.packed_size

    def unpack_(self, flat: torch.Tensor, *, copy: bool = False) -> None:
        n = self.n_images
        self.visits, self.labels = flat[:n], flat[n : 2 * n]
        offset = 2 * n
        for vectors in self._packed_points():
            vectors.unpack_(flat[offset : offset + vectors.packed_size])
            offset += vectors.packed_size

    def check_visits(self) -> None:
        """Raises unless every image of the subset was streamed exactly once over all ranks."""
        visits = self.visits.detach().cpu()
        wrong = torch.nonzero(visits != 1).reshape(-1)
        if wrong.numel():
            first = [(int(i), int(visits[i].item())) for i in wrong[:5]]
            raise RuntimeError(
                f"observation: {wrong.numel()} of {self.n_images} analysis images were not streamed exactly once "
                f"(index, times): {first}; every image must be observed once over all ranks"
            )
