"""Data for TGO: the DataModule, its four sources, the frozen analysis subset with its manifest, and
`stratified_subset` for an analysis set drawn from any labelled dataset."""

from tgo.data.analysis import MANIFEST_NAME, AnalysisItem, AnalysisSubset, load_manifest, select_analysis_indices
from tgo.data.datamodule import DEFAULT_ANALYSIS_PER_CLASS, TGODataModule
from tgo.data.errors import AnalysisManifestMismatch, DataConfigError
from tgo.data.folders import default_class_list_path, read_class_list
from tgo.data.sources import build_source, register_source, source_names, unregister_source
from tgo.data.subsets import AnalysisSetError, StratifiedSubset, dataset_labels, stratified_subset

__all__ = [
    "DEFAULT_ANALYSIS_PER_CLASS",
    "MANIFEST_NAME",
    "AnalysisItem",
    "AnalysisManifestMismatch",
    "AnalysisSetError",
    "AnalysisSubset",
    "DataConfigError",
    "StratifiedSubset",
    "TGODataModule",
    "build_source",
    "dataset_labels",
    "default_class_list_path",
    "load_manifest",
    "read_class_list",
    "register_source",
    "select_analysis_indices",
    "source_names",
    "stratified_subset",
    "unregister_source",
]
