"""Fail-fast validation of a composed config, before any data is read or any weight is updated.

Hydra checks that keys exist, not that values make sense: a zero batch size would surface minutes later inside
Lightning. `validate_config` raises one ``ConfigError`` listing every problem; the model's hyper-parameters are
checked too (`model_problems`), since a zero depth would train a model that ignores what was asked.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from tgo.errors import ConfigError
from tgo.observatory.settings import ObservationSettings, ObservationSettingsError

CONFIG_MODULE = "tgo.conf"
"""Where Hydra finds the config tree: ``conf/`` as package data, the same from any directory or wheel."""

_MISSING = object()

SCHEDULES = ("cosine", "onecycle", "constant")
"""The learning-rate schedules of `tgo.model.ViTClassifier` (``model.schedule``)."""

Rule = Callable[[Any], "str | None"]


def _is_number(value: Any) -> bool:
    """A real, finite number (``true`` is not a number here, and YAML's ``.nan`` / ``.inf`` are not usable rates)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return f"expected a positive integer, got {value!r}"
    return None


def _optional_positive_int(value: Any) -> str | None:
    return None if value is None else _positive_int(value)


def _devices(value: Any) -> str | None:
    if value == "auto" or value == -1:
        return None
    if isinstance(value, (list, tuple)) or OmegaConf.is_list(value):
        return None if len(value) > 0 else "expected a non-empty list of device ids"
    return _positive_int(value)


def _seed(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32:
        return None
    return f"expected an integer in [0, 2**32 - 1] (numpy's and torch's seed range), got {value!r}"


def _positive_number(value: Any) -> str | None:
    return None if _is_number(value) and value > 0 else f"expected a positive number, got {value!r}"


def _non_negative_number(value: Any) -> str | None:
    return None if _is_number(value) and value >= 0 else f"expected a number >= 0, got {value!r}"


def _fraction(value: Any) -> str | None:
    return None if _is_number(value) and 0 <= value < 1 else f"expected a number in [0, 1), got {value!r}"


def _betas(value: Any) -> str | None:
    pair = list(value) if isinstance(value, (list, tuple)) or OmegaConf.is_list(value) else None
    if pair is None or len(pair) != 2 or _fraction(pair[0]) or _fraction(pair[1]):
        return f"expected [beta1, beta2] with both in [0, 1), got {value!r}"
    return None


def _schedule(value: Any) -> str | None:
    return None if value in SCHEDULES else f"expected one of {list(SCHEDULES)}, got {value!r}"


def _limit(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return f"expected null, a positive number of batches or a fraction in (0, 1], got {value!r}"
    return None


# key -> rule; a key absent from the config is skipped (callbacks can be disabled with null).
RULES: dict[str, Rule] = {
    "seed": _seed,
    "trainer.max_epochs": _positive_int,
    "trainer.devices": _devices,
    "trainer.num_nodes": _positive_int,
    "trainer.accumulate_grad_batches": _positive_int,  # 0 would divide by zero inside Lightning's loop
    "trainer.limit_train_batches": _limit,
    "trainer.limit_val_batches": _limit,
    "data.batch_size": _positive_int,
    "data.image_size": _positive_int,
    "data.analysis.size": _optional_positive_int,
    "data.analysis.per_class": _optional_positive_int,
    "callbacks.trajectory_checkpoint.every_n_epochs": _optional_positive_int,
}

# The hyper-parameters of `tgo.model.ViTClassifier`, relative to the ``model`` node; an absent key is skipped (the
# architecture keys default to the timm model's own values). Checked here, before any data is read, and again by the
# model's constructor for code that builds it directly.
MODEL_RULES: dict[str, Rule] = {
    "lr": _positive_number,
    "weight_decay": _non_negative_number,
    "min_lr": _non_negative_number,
    "warmup_epochs": _non_negative_number,
    "label_smoothing": _fraction,
    "betas": _betas,
    "schedule": _schedule,
    "arch.depth": _positive_int,
    "arch.embed_dim": _positive_int,
    "arch.num_heads": _positive_int,
    "arch.patch_size": _positive_int,
    "arch.drop_path_rate": _fraction,
}


def _lookup(values: Mapping[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def image_size_problem(image_size: Any, patch_size: Any) -> str | None:
    """Why ``data.image_size`` cannot be cut into patches (timm would silently drop the remainder), or ``None``."""
    if _positive_int(image_size) or _positive_int(patch_size) or image_size % patch_size == 0:
        return None
    lower, upper = image_size - image_size % patch_size, image_size - image_size % patch_size + patch_size
    return (
        f"data.image_size: {image_size} is not a multiple of the patch size {patch_size}, so the last "
        f"{image_size % patch_size} pixel rows and columns would be dropped; expected a multiple of {patch_size} "
        f"such as {', '.join(str(n) for n in (lower, upper) if n > 0)}"
    )


def _divisors_near(n: int, target: int) -> str:
    """The two divisors of ``n`` closest to ``target`` (what a user most likely meant), for error messages."""
    divisors = sorted((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - target), d))[:2]
    return " or ".join(str(d) for d in sorted(divisors))


def model_problems(model: Mapping[str, Any], image_size: Any = None, *, prefix: str = "model") -> list[str]:
    """Every problem with `tgo.model.ViTClassifier`'s hyper-parameters, one ``<key>: ...; expected ...`` each."""
    problems = []
    for key, rule in MODEL_RULES.items():
        value = _lookup(model, key)
        message = None if value is _MISSING else rule(value)
        if message:
            problems.append(f"{prefix}.{key}: {message}")
    width, heads = _lookup(model, "arch.embed_dim"), _lookup(model, "arch.num_heads")
    if not (_positive_int(width) or _positive_int(heads)) and width % heads:
        problems.append(
            f"{prefix}.arch.num_heads: the width {width} ({prefix}.arch.embed_dim) does not split into {heads} equal "
            f"heads; expected a divisor of {width} such as {_divisors_near(width, heads)}"
        )
    patch = _lookup(model, "arch.patch_size")
    message = None if patch is _MISSING else image_size_problem(image_size, patch)
    if message:
        problems.append(message)
    return problems


ACTIVATIONS_PER_TOKEN_AND_WIDTH = 12
"""A lower bound on the values a timm ViT block keeps per token and unit of width for backward: the MLP's hidden layer
twice (8), q, k, v (3) and the input (1)."""

_TIMM_VIT = re.compile(r"^(?:vit|deit)_(tiny|small|base|large|huge)_patch(\d+)_")
_TIMM_SIZES = {"tiny": (192, 12), "small": (384, 12), "base": (768, 12), "large": (1024, 24), "huge": (1280, 32)}


def _architecture(model: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """``(patch size, width, depth)`` of a model node (``arch``, else the timm name), ``None`` where unknown."""
    match = _TIMM_VIT.match(str(model.get("name", "")))
    width, depth = _TIMM_SIZES[match.group(1)] if match else (None, None)
    patch = int(match.group(2)) if match else None
    arch = model.get("arch") or {}
    patch, width, depth = (arch.get(k, d) for k, d in (("patch_size", patch), ("embed_dim", width), ("depth", depth)))
    if any(_positive_int(v) for v in (patch, width, depth)):
        return None
    return int(patch), int(width), int(depth)  # type: ignore[arg-type]


def _gpu_memory() -> int | None:
    """The smallest GPU's memory on this node from NVML (``None``: none): asking torch would initialise CUDA here, after
    which a forked DDP rank cannot use it."""
    import ctypes

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        sizes = []
        for index in range(count.value):
            handle, memory = ctypes.c_void_p(), Memory()
            found = nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
            if found and nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0:
                sizes.append(int(memory.total))
        return min(sizes) if sizes else None
    finally:
        nvml.nvmlShutdown()


def available_memory(accelerator: Any) -> tuple[int, str]:
    """``(bytes, what)`` of one training process's memory: the smallest GPU's where one may be used, else RAM."""
    if str(accelerator).lower() in {"gpu", "cuda", "auto"}:
        gpu = _gpu_memory()
        if gpu is not None:
            return gpu, "GPU memory"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "memory on this machine"


def training_memory_problem(
    model: Mapping[str, Any], image_size: Any, batch_size: Any, precision: Any, memory: tuple[int, str]
) -> str | None:
    """Why one training batch cannot fit ``memory`` (``None`` when it may), by a lower bound so nothing that fits is
    refused: ``data.image_size=2048`` at patch 4 (>= 928 GB for 64 images) would otherwise end in an OOM kill."""
    known = _architecture(model)
    if known is None or _positive_int(image_size) or _positive_int(batch_size):
        return None
    patch, width, depth = known
    size = 2 if "16" in str(precision) else 8 if str(precision).startswith("64") else 4
    per_token = batch_size * depth * ACTIVATIONS_PER_TOKEN_AND_WIDTH * width * size
    patches = (image_size // patch) ** 2
    need = per_token * (patches + 1)
    total, what = memory
    if need <= total:
        return None
    side = math.isqrt(max(total // per_token - 1, 0)) * patch
    fits = (
        f"at most {side} px at this batch size (a lower bound: less in practice)"
        if side >= patch
        else "a smaller batch size or model"
    )
    return (
        f"data.image_size: {image_size} px in patches of {patch} is {patches:,} patches per image, and training a "
        f"batch of {batch_size} keeps at least {need / 1e9:,.0f} GB of activations for the backward pass ({depth} "
        f"blocks of width {width}, {size}-byte values), more than the {total / 2**30:,.0f} GiB of {what}; expected "
        f"{fits}"
    )


def _select(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=True)
    except MissingMandatoryValue:
        raise ConfigError(f"{key}: a value is required (it is ??? in the config); pass {key}=...") from None


def validate_config(cfg: DictConfig) -> None:
    """Checks the composed config and raises one ``ConfigError`` naming every bad key and what was expected."""
    problems = []
    for key, rule in RULES.items():
        value = _select(cfg, key)
        if value is _MISSING:
            continue
        message = rule(value)
        if message:
            problems.append(f"{key}: {message}")
    for key in ("data.root",):
        _select(cfg, key)  # raises on ??? (tgo1 needs the dataset location)
    model = cfg.get("model")
    if isinstance(model, DictConfig) and model.get("_target_") == "tgo.model.ViTClassifier":
        image_size = _select(cfg, "data.image_size")
        problems += model_problems(model, None if image_size is _MISSING else image_size)
        batch, precision = _select(cfg, "data.batch_size"), OmegaConf.select(cfg, "trainer.precision", default="32")
        if image_size is not _MISSING and batch is not _MISSING:
            accelerator = OmegaConf.select(cfg, "trainer.accelerator", default="auto")
            message = training_memory_problem(model, image_size, batch, precision, available_memory(accelerator))
            if message:
                problems.append(message)
    if "observation" in cfg:
        try:
            ObservationSettings.from_config(cfg.observation)
        except ObservationSettingsError as err:
            problems.append(str(err))
    if problems:
        raise problems_error(problems)


def problems_error(problems: list[str]) -> ConfigError:
    """One ``ConfigError`` for a non-empty list of problems: the problem itself, or a list when there are several."""
    return ConfigError("invalid config:\n  " + "\n  ".join(problems) if len(problems) > 1 else problems[0])
