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
    assert cfg.data.image_size == 224 and cfg.data.resize_size == 256 and cfg.data.crop_scale_min == 0.8
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
