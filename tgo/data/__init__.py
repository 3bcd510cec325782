"""Data for TGO: the DataModule, its four sources and the frozen analysis subset with its manifest."""

from tgo.data.analysis import MANIFEST_NAME, AnalysisItem, AnalysisSubset, load_manifest, select_analysis_indices
from tgo.data.datamodule import TGODataModule
from tgo.data.errors import AnalysisManifestMismatch, DataConfigError
from tgo.data.folders import default_class_list_path, read_class_list
from tgo.data.sources import build_source, register_source, source_names, unregister_source

__all__ = [
    "MANIFEST_NAME",
    "AnalysisItem",
    "AnalysisManifestMismatch",
    "AnalysisSubset",
    "DataConfigError",
    "TGODataModule",
    "build_source",
    "default_class_list_path",
    "load_manifest",
    "read_class_list",
    "register_source",
    "select_analysis_indices",
    "source_names",
    "unregister_source",
]
