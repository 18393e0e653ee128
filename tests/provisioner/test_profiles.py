"""Parsing the paper's published profiles shipped with the package."""

from pathlib import Path

import pytest

from provisioner.profiles import load_paper_profiles

SHARED = Path(__file__).resolve().parents[3] / "shared/data/profiles/mark-paper.json"


def test_shipped_copy_parses_the_four_models() -> None:
    models = load_paper_profiles()
    assert set(models) == {"tf", "kr", "nmt", "mx"}
    tf = models["tf"]
    assert (tf.model, tf.rt_max_s, tf.sl_min) == ("Inception-v3", 0.6, 0.98)
    assert tf.instance("c5.large").capacity_rps == pytest.approx(284 / 60)
    assert tf.instance("c5.large").latency_ms == (210.0, 182.5)


def test_batch_written_capacities_give_per_batch_times() -> None:
    nmt = load_paper_profiles()["nmt"]
    # AllCapacity = 40 * HANDLE_SIZE_C5X: 40 batches of 2 per minute.
    assert nmt.instance("c5.xlarge").batch_latency_s() == {2: pytest.approx(1.5)}
    # Inception on c5.xlarge is written as a plain 490 r/m: per request.
    tf = load_paper_profiles()["tf"]
    assert tf.instance("c5.xlarge").batch_latency_s() == {1: pytest.approx(60 / 490)}


def test_placeholders_are_dropped() -> None:
    mx = load_paper_profiles()["mx"]
    assert set(mx.instances) == {"c5.xlarge"}
    with pytest.raises(KeyError, match=r"p2\.xlarge"):
        mx.instance("p2.xlarge")


@pytest.mark.skipif(not SHARED.exists(), reason="shared data not beside the project")
def test_shipped_copy_matches_shared_data() -> None:
    shipped = Path(__file__).resolve().parents[2] / "provisioner/data/mark-paper.json"
    assert shipped.read_bytes() == SHARED.read_bytes()
    assert load_paper_profiles(SHARED)["tf"] == load_paper_profiles()["tf"]
