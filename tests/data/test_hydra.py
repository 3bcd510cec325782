"""The DataModule as Hydra builds it: instantiation from a config node, and conf/data/*.yaml keys vs. the signature."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tgo.data import TGODataModule

CONF_DATA = Path(__file__).resolve().parents[2] / "conf" / "data"
PARAMS = set(inspect.signature(TGODataModule.__init__).parameters) - {"self"}


def test_instantiate_from_config_node_with_listconfig_values() -> None:
    cfg = OmegaConf.create(
        {
            "_target_": "tgo.data.TGODataModule",
            "source": "synthetic",
            "num_classes": 3,
            "image_size": 12,
            "batch_size": 4,
            "train_size": 12,
            "val_size": 9,
            "mean": [0.5, 0.5, 0.5],
            "std": [0.25, 0.25, 0.25],
            "analysis_size": 6,
            "analysis_per_class": None,
        }
    )
    dm = instantiate(cfg)
    dm.setup()
    assert isinstance(dm, TGODataModule) and dm.mean == (0.5, 0.5, 0.5) and len(dm.analysis_dataset) == 6


@pytest.mark.parametrize("path", sorted(CONF_DATA.glob("*.yaml")), ids=lambda p: p.stem)
def test_data_config_keys_are_constructor_arguments(path: Path) -> None:
    cfg = OmegaConf.load(path)
    keys = {k for k in cfg if not str(k).startswith("_")}
    unknown = sorted(keys - PARAMS)
    assert not unknown, f"{path.name}: keys {unknown} are not TGODataModule arguments ({sorted(PARAMS)})"
    assert cfg.get("_target_") in ("tgo.data.TGODataModule", "tgo.data.datamodule.TGODataModule")
