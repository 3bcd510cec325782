"""The config tree: every experiment composes, tgo1 is the published protocol, bad values fail fast."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.conftest import run_cli
from tgo.config import validate_config
from tgo.errors import ConfigError

EXPERIMENTS = ["quickstart", "smoke", "tgo1"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates(compose_cfg, experiment):
    cfg = compose_cfg(f"experiment={experiment}", "data.root=/somewhere")
    validate_config(cfg)
    assert cfg.experiment_name == experiment
    assert cfg.observation.every_n_epochs >= 1
    assert cfg.logger.tensorboard.save_dir == cfg.paths.output_dir


def test_no_arguments_means_quickstart(compose_cfg):
    cfg = compose_cfg()
    assert cfg.experiment_name == "quickstart"
    assert cfg.data.source == "digits"
    assert cfg.model.arch.depth == 12, "quickstart mirrors ViT-S depth"
    assert cfg.trainer.accelerator == "cpu"


def test_tgo1_is_the_published_protocol(compose_cfg):
    cfg = compose_cfg("experiment=tgo1", "data.root=/data/imagenet100")
    assert cfg.model.name == "vit_small_patch16_224" and not cfg.model.pretrained
    assert cfg.model.arch.drop_path_rate == 0.1
    assert cfg.trainer.max_epochs == 100
    assert (cfg.model.lr, cfg.model.weight_decay, cfg.model.schedule, cfg.model.min_lr) == (1e-3, 0.05, "cosine", 1e-6)
    assert cfg.model.label_smoothing == 0.1
    assert cfg.trainer.gradient_clip_val == 1.0
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.accelerator == "gpu"
    assert cfg.data.source == "imagenet100" and cfg.data.batch_size == 32
    assert cfg.data.image_size == 224 and cfg.data.resize_size is None and cfg.data.crop_scale_min == 0.8
    assert round(cfg.data.image_size / 0.875) == 256  # what resize_size null gives: the paper's 256 -> 224
    assert cfg.data.train_transform == "standard"
    assert (cfg.data.analysis.size, cfg.data.analysis.per_class, cfg.data.analysis.seed) == (1000, 10, 2025)


def test_tgo1_devices_and_nodes_are_overridable(compose_cfg):
    cfg = compose_cfg("experiment=tgo1", "data.root=/x", "trainer.devices=8", "trainer.num_nodes=2")
    assert (cfg.trainer.devices, cfg.trainer.num_nodes) == (8, 2)


def test_slurm_launcher_follows_trainer_topology(compose_cfg):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = compose_cfg(
        "experiment=tgo1",
        "data.root=/x",
        "trainer.devices=4",
        "trainer.num_nodes=3",
        "hydra/launcher=slurm",
        hydra_cfg=True,
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (3, 4, 4)


def test_cfg_job_prints_the_composed_tgo1_config(tmp_path):
    result = run_cli(["experiment=tgo1", "data.root=/data/imagenet100", "--cfg", "job"], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    printed = OmegaConf.create(result.stdout)
    assert printed.model.name == "vit_small_patch16_224"
    assert printed.trainer.max_epochs == 100
    assert printed.data.root == "/data/imagenet100"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.max_epochs=0", "trainer.max_epochs"),
        ("trainer.max_epochs=-3", "trainer.max_epochs"),
        ("data.batch_size=0", "data.batch_size"),
        ("data.batch_size=-8", "data.batch_size"),
        ("observation.every_n_epochs=0", "observation.every_n_epochs"),
        ("observation.every_n_epochs=-1", "observation.every_n_epochs"),
        ("data.analysis.per_class=0", "data.analysis.per_class"),
        ("trainer.devices=0", "trainer.devices"),
    ],
)
def test_non_positive_values_are_rejected_naming_the_key(compose_cfg, override, key):
    cfg = compose_cfg("experiment=smoke", override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + ": expected a positive integer"):
        validate_config(cfg)


def test_tgo1_without_data_root_names_the_missing_key(compose_cfg):
    cfg = compose_cfg("experiment=tgo1")
    with pytest.raises(ConfigError, match=r"data\.root: a value is required"):
        validate_config(cfg)


def test_several_problems_are_reported_together(compose_cfg):
    cfg = compose_cfg("experiment=smoke", "trainer.max_epochs=0", "data.batch_size=0")
    with pytest.raises(ConfigError) as error:
        validate_config(cfg)
    assert "trainer.max_epochs" in str(error.value) and "data.batch_size" in str(error.value)


def test_unknown_config_group_option_fails_listing_the_options(tmp_path):
    result = run_cli(["data=imagenet1000"], cwd=tmp_path, timeout=120)
    assert result.returncode != 0
    assert "data/imagenet1000" in result.stderr
    for option in ("digits", "imagenet100", "imagefolder", "synthetic"):
        assert option in result.stderr


def test_bad_value_on_the_command_line_is_one_line_not_a_traceback(tmp_path):
    result = run_cli(["experiment=smoke", "trainer.max_epochs=0"], cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert "tgo.train: error: trainer.max_epochs: expected a positive integer, got 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "outputs" / "smoke").exists() or not list((tmp_path / "outputs").rglob("*.ckpt"))


# Issue 13: values that used to escape validation (a traceback, a raw TypeError, or a silently wrong run). Each is
# refused before any data is read, naming the key and what was expected.
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["observation.fit_range=[5,2]"], r"observation\.fit_range: expected null or \[start, stop\]"),
        (["observation.figures.every_n_observations=0"], r"observation\.figures\.every_n_observations: expected a"),
        (["observation.keep_covariance=5"], r"observation\.keep_covariance: expected one of .* got 5"),
        (["model.label_smoothing=2"], r"model\.label_smoothing: expected a number in \[0, 1\), got 2"),
        (["model.lr=fast"], r"model\.lr: expected a positive number, got 'fast'"),
        (["model.lr=0"], r"model\.lr: expected a positive number, got 0"),
        (["model.weight_decay=-0.1"], r"model\.weight_decay: expected a number >= 0"),
        (["model.betas=[0.9,1.5]"], r"model\.betas: expected \[beta1, beta2\] with both in \[0, 1\)"),
        (["model.schedule=linear"], r"model\.schedule: expected one of \['cosine', 'onecycle', 'constant'\]"),
        (["data.batch_size=3.5"], r"data\.batch_size: expected a positive integer, got 3\.5"),
        (
            ["model.arch.embed_dim=96", "model.arch.num_heads=5"],
            r"model\.arch\.num_heads: the width 96 \(model\.arch\.embed_dim\) does not split into 5 equal heads; "
            r"expected a divisor of 96 such as 4 or 6",
        ),
        (["model.arch.depth=0"], r"model\.arch\.depth: expected a positive integer, got 0"),
        (["model.arch.depth=2.5"], r"model\.arch\.depth: expected a positive integer, got 2\.5"),
        (
            ["data.image_size=18"],
            r"data\.image_size: 18 is not a multiple of the patch size 4, so the last 2 pixel rows and columns would "
            r"be dropped; expected a multiple of 4 such as 16, 20",
        ),
    ],
)
def test_values_that_escaped_validation_are_refused_naming_the_key(compose_cfg, overrides, message):
    cfg = compose_cfg("experiment=smoke", *overrides)
    with pytest.raises(ConfigError, match=message) as error:
        validate_config(cfg)
    assert "\n" not in str(error.value), "one problem, one line"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(label_smoothing=1.0), r"model\.label_smoothing: expected a number in \[0, 1\)"),
        (dict(lr="fast"), r"model\.lr: expected a positive number, got 'fast'"),
        (dict(arch=dict(depth=0)), r"model\.arch\.depth: expected a positive integer, got 0"),
        (dict(img_size=20), r"data\.image_size: 20 is not a multiple of the patch size 16"),  # timm's own
        (dict(arch=dict(num_heads=5)), r"model\.arch: timm cannot build 'vit_tiny_patch16_224'.*num_heads"),
        (dict(num_classes=0), r"model\.num_classes: expected a positive integer, got 0"),
    ],
)
def test_the_model_refuses_what_timm_would_accept_silently_or_assert_on(kwargs, message):
    """The constructor checks too (code can build it without a config): the timm model's own patch size and width,
    which the config does not name, are checked after timm built it or when timm's assertion fires."""
    from tgo.model import ViTClassifier

    with pytest.raises(ConfigError, match=message):
        ViTClassifier(**{"name": "vit_tiny_patch16_224", "num_classes": 3, "img_size": 32, **kwargs})


def test_logger_null_disables_the_logger_and_the_callback_that_needs_one(compose_cfg):
    """``logger.tensorboard=null`` is the documented way to turn TensorBoard off: with no logger left, the learning
    rate monitor (which Lightning refuses to run without a logger) is dropped instead of failing the run."""
    from lightning.pytorch.callbacks import LearningRateMonitor

    from tgo.train import instantiate_named, without_logger_only_callbacks

    cfg = compose_cfg("experiment=smoke", "logger.tensorboard=null", "callbacks.spectral_geometry=null")
    validate_config(cfg)
    loggers = instantiate_named(cfg.logger)
    callbacks = instantiate_named(cfg.callbacks)
    assert loggers == [] and any(isinstance(c, LearningRateMonitor) for c in callbacks)
    kept = without_logger_only_callbacks(callbacks, loggers)
    assert not any(isinstance(c, LearningRateMonitor) for c in kept) and len(kept) == len(callbacks) - 1
    assert without_logger_only_callbacks(callbacks, [object()]) == callbacks, "kept while any logger is on"


# ------------------------------------------------------------------------- impossible settings (issue 33, item 6)
def test_zero_accumulated_batches_are_refused_before_work(compose_cfg):
    """Before: ``+trainer.accumulate_grad_batches=0`` ended in a traceback inside Lightning."""
    cfg = compose_cfg("experiment=smoke", "trainer.accumulate_grad_batches=0")
    with pytest.raises(ConfigError, match=r"^trainer\.accumulate_grad_batches: expected a positive integer, got 0$"):
        validate_config(cfg)


def test_every_trainer_key_tgo_advises_is_in_the_config_so_it_needs_no_plus(compose_cfg):
    """The run's notices advise ``trainer.accumulate_grad_batches >= 2``; Hydra refuses an override of a key the
    config lacks without a ``+``, so every ``trainer.<key>=`` / ``>=`` / ``<=`` a message advises must be one the
    config has."""
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    named = set()
    for path in [*root.joinpath("tgo").rglob("*.py"), *root.joinpath("callbacks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named |= set(re.findall(r"\btrainer\.([a-z_]+) ?(?:=(?!=)|>=|<=)", node.value))  # advice: key=v
    assert "accumulate_grad_batches" in named  # the advice the issue found
    cfg = compose_cfg("experiment=smoke")
    assert not named - set(cfg.trainer), named - set(cfg.trainer)
    assert compose_cfg("experiment=smoke", "trainer.accumulate_grad_batches=2").trainer.accumulate_grad_batches == 2


def test_an_image_size_whose_training_batch_cannot_fit_memory_is_refused_with_the_reason(compose_cfg):
    """Before: ``data.image_size=2048`` ended in a traceback. 16,384 px in patches of 4 is 16.8 M patches per image;
    the smoke run's batch keeps at least batch x depth x 12 x width float32 values per token: 6.6 TB, more than
    any machine's memory."""
    cfg = compose_cfg("experiment=smoke", "data.image_size=16384")
    with pytest.raises(ConfigError) as error:
        validate_config(cfg)
    message = str(error.value)
    batch, depth, width = cfg.data.batch_size, cfg.model.arch.depth, cfg.model.arch.embed_dim
    need = batch * depth * 12 * width * 4 * (4096**2 + 1)
    assert need > 10**12  # 6.6 TB
    assert "\n" not in message and message.startswith("data.image_size: 16384 px in patches of 4 is 16,777,216 patches")
    assert f"a batch of {batch} keeps at least {need / 1e9:,.0f} GB of activations for the backward pass" in message
    assert f"({depth} blocks of width {width}, 4-byte values)" in message and "px at this batch size" in message


def test_the_memory_bound_is_the_stated_arithmetic_and_refuses_nothing_that_fits():
    from tgo.config import training_memory_problem

    quick = {"name": "vit_tiny_patch16_224", "arch": {"patch_size": 4, "embed_dim": 96, "depth": 12}}
    need = 64 * 12 * 12 * 96 * 4 * ((2048 // 4) ** 2 + 1)  # batch x depth x 12 values x width x float32, per token
    assert training_memory_problem(quick, 2048, 64, "32-true", (need, "memory")) is None  # exactly fits
    message = training_memory_problem(quick, 2048, 64, "32-true", (need - 1, "memory"))
    assert message is not None and f"at least {need / 1e9:,.0f} GB" in message
    side = int(((need - 1) // (64 * 12 * 12 * 96 * 4) - 1) ** 0.5) * 4
    assert f"expected at most {side} px at this batch size" in message and side == 2044
    # ViT-S/16 (widths read from timm's name) at 224 px, bf16, batch 256: 6.0 GB fits a 16 GiB GPU, not a 4 GiB one
    small = {"name": "vit_small_patch16_224", "arch": {"drop_path_rate": 0.1}}
    assert training_memory_problem(small, 224, 256, "bf16-mixed", (16 * 2**30, "GPU memory")) is None
    refused = training_memory_problem(small, 224, 256, "bf16-mixed", (4 * 2**30, "GPU memory"))
    assert refused is not None and "196 patches" in refused and "(12 blocks of width 384, 2-byte values)" in refused
    assert training_memory_problem({"name": "my_net"}, 4096, 64, "32-true", (1, "memory")) is None  # unknown: no bound
