"""The order tests reach xdist workers in (tests/scheduling.py): nothing lost, the slowest
spread over the workers' chunks."""

from __future__ import annotations

from tests.scheduling import measured_seconds, snake_chunks


def test_the_snake_deals_every_item_once_slowest_first_in_every_chunk():
    ranked = list(range(10))  # 0 the slowest
    dealt = snake_chunks(ranked, 3)
    assert sorted(dealt) == ranked
    assert dealt == [0, 5, 6, 1, 4, 7, 2, 3, 8, 9]  # chunks of 3, 3, 4, as xdist splits 10


def test_the_durations_file_adds_up_the_phases_of_a_test(tmp_path):
    path = tmp_path / "durations.txt"
    path.write_text(
        "12.50s call     tests/a.py::test_x\n"
        "2.00s setup    tests/a.py::test_x\n"
        "0.25s teardown tests/b.py::test_y[1-2]\n"
        "slowest durations\n"
    )
    assert measured_seconds(path) == {"tests/a.py::test_x": 14.5, "tests/b.py::test_y[1-2]": 0.25}
