"""Every view the records can hold is named where `docs/observables.md` explains views (section 3, "Views and
hypothesis probes"): the covariance views of `tgo.records.VIEWS` and every family's own (issue 37: `prefix` was not)."""

from __future__ import annotations

import tgo.observatory.families  # noqa: F401  # registers the families' catalogue entries and their views
from tests.test_docs import OBSERVABLES, backticked
from tgo.records import VIEWS
from tgo.spectral import CATALOGUE


def test_every_view_the_records_can_hold_is_named_where_views_are_explained():
    text = OBSERVABLES.read_text(encoding="utf-8")
    section = backticked(text[text.index("### Views and hypothesis probes") : text.index("## 4. Degenerate cases")])
    views = dict.fromkeys([*VIEWS, *(view for o in CATALOGUE.family_entries for view in o.views)])
    missing = [view for view in views if view not in section]
    assert not missing, f"docs/observables.md section 3 'Views and hypothesis probes' names no view {missing}"
