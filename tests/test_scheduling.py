"""The order modules reach xdist workers in (tests/scheduling.py): nothing lost, a module's
tests kept together, the slowest modules first."""

from __future__ import annotations

from types import SimpleNamespace

from tests.scheduling import measured_seconds, slowest_modules_first


def item(nodeid: str):
    return SimpleNamespace(
        nodeid=nodeid, iter_markers=lambda: [], get_closest_marker=lambda _: None
    )


def test_modules_stay_together_the_slowest_first():
    items = [item(n) for n in ("a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "b.py::t2")]
    measured = {"b.py::t1": 30.0, "c.py::t1": 40.0, "a.py::t2": 5.0}
    ordered = [i.nodeid for i in slowest_modules_first(items, measured)]
    assert ordered == ["c.py::t1", "b.py::t1", "b.py::t2", "a.py::t1", "a.py::t2"]


def test_the_durations_file_adds_up_the_phases_of_a_test(tmp_path):
    path = tmp_path / "durations.txt"
    path.write_text(
        "12.50s call     tests/a.py::test_x\n"
        "2.00s setup    tests/a.py::test_x\n"
        "0.25s teardown tests/b.py::test_y[1-2]\n"
        "slowest durations\n"
    )
    assert measured_seconds(path) == {"tests/a.py::test_x": 14.5, "tests/b.py::test_y[1-2]": 0.25}
