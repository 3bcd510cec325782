"""The report's Optimisation geometry section: what the optimisation families recorded, drawn from the records."""

from __future__ import annotations

import shutil
from pathlib import Path

from tgo.report.context import judge
from tgo.report.optimisation import optimisation_section
from tgo.report.runs import load_run_data


def _with_network_rows(run: Path, rows: list[tuple[int, str, float, float]]) -> None:
    """Sets ``(epoch, metric, value, stderr)`` rows of the last point's network view in the run's metrics.csv (the
    smoke run's own, NaN without two batch sizes, are replaced: one row per epoch, point, view and metric)."""
    path = run / "geometry" / "metrics.csv"
    replaced = {(str(epoch), metric) for epoch, metric, _, _ in rows}
    kept = [
        line
        for line in path.read_text(encoding="utf-8").splitlines()
        if not ((cells := line.split(","))[2:4] == ["cls", "network"] and (cells[0], cells[4]) in replaced)
    ]
    step = {cells[0]: cells[1] for cells in (line.split(",") for line in kept[1:])}
    added = [f"{epoch},{step[str(epoch)]},cls,network,{metric},{value!r},{se!r}" for epoch, metric, value, se in rows]
    path.write_text("\n".join([*kept, *added]) + "\n", encoding="utf-8")


def test_the_smoke_run_draws_its_weight_spectra_and_says_why_it_has_no_noise_scale(smoke_run: Path, tmp_path: Path):
    (section,) = optimisation_section(judge([load_run_data(smoke_run)], figures_dir=tmp_path / "figures"))
    paths = [f.path for f in section.figures]
    assert paths == [  # one device, no accumulation: no noise scale; the weights' trajectory over the network
        "figures/optimisation_weights.png",
        "figures/optimisation_weights_trajectory.png",
    ]
    assert (tmp_path / "figures" / "optimisation_weights.png").stat().st_size > 10_000


def test_the_network_metrics_are_tabled_and_the_sharpness_is_read_against_its_threshold(smoke_run: Path, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(smoke_run, run)
    _with_network_rows(
        run,
        [
            (1, "gradient_noise_scale", 120.0, 15.0),
            (2, "gradient_noise_scale", 180.0, 20.0),
            (1, "preconditioned_sharpness", 30_000.0, float("nan")),
            (2, "preconditioned_sharpness", 37_000.0, float("nan")),
            (1, "edge_of_stability_threshold", 38_000.0, float("nan")),
            (2, "edge_of_stability_threshold", 38_000.0, float("nan")),
        ],
    )
    (section,) = optimisation_section(judge([load_run_data(run)], figures_dir=tmp_path / "figures"))
    assert [f.path for f in section.figures] == [  # each family's declared grid (`tgo.panels.grid_figure`)
        "figures/optimisation_weights.png",
        "figures/optimisation_weights_trajectory.png",
        "figures/optimisation_noise_scale.png",
        "figures/optimisation_curvature.png",
    ]
    (table,) = section.tables
    cells = {row[0]: row[1:] for row in table.rows}
    assert cells["gradient_noise_scale"] == ["2", "180 ± 20"]
    assert cells["preconditioned_sharpness"] == ["2", "3.7e+04"]
    (reading,) = [p for p in section.paragraphs if "edge-of-stability" in p]
    assert "0.97 times" in reading and "at the edge of stability" in reading  # 37,000 / 38,000
