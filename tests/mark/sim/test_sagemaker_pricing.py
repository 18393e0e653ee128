"""SageMaker as users pay it: ml.* hosting prices with their sources, the type the
``sagemaker`` policy runs on, InvokeEndpoint's timeout, and what it costs beside the
kinder ``ec2-target-tracking`` and the lower bound."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from bouncer.latency import BatchLatency
from mark.catalog import load_catalog, load_hosting_prices
from mark.catalog.hosting import family_of
from mark.cli.main import main
from mark.errors import UnknownOffering
from mark.sim.compare import compare
from mark.sim.drive_sagemaker import hosting_option
from mark.sim.engine import FAILED, INSTANCE, Engine, Server
from mark.sim.models import SimModel, paper_model
from mark.sim.policies import POLICIES
from mark.sim.run import SimConfig
from mark.sim.workloads import Workload
from mark.sim.world import model_options

EPOCH = 1_700_000_000.0
HISTORY_S = 2 * 3600
CITATION = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}, \S+")  # owner/repo@commit, path


def test_every_ml_price_has_a_source_and_the_citations_are_the_documented_ones() -> None:
    hosting = load_hosting_prices()
    assert hosting.region == load_catalog().region == "us-east-1"
    cited = {t: p.price_per_hour for t, p in hosting.prices.items() if not p.derived}
    assert cited == {
        "c5.xlarge": 0.204,
        "m5.large": 0.115,
        "m5.xlarge": 0.23,
        "g4dn.xlarge": 0.736,
        "g4dn.12xlarge": 4.89,
        "p3.2xlarge": 3.825,
    }
    for t, p in hosting.prices.items():
        assert p.ml_type == f"ml.{t}" and p.price_per_hour > 0
        if p.derived:
            assert p.rule and family_of(t) in hosting.markups, t
        else:
            assert CITATION.match(p.source), p.source
            assert p.rule is None


def test_derived_prices_are_the_ec2_price_times_the_family_markup() -> None:
    hosting, catalog = load_hosting_prices(), load_catalog()
    # Each markup is what its citations say: ml.* price / EC2 on-demand price.
    cited = ("c5.xlarge", "m5.xlarge", "m5.large", "p3.2xlarge", "g4dn.xlarge", "g4dn.12xlarge")
    ratio = {t: hosting.prices[t].price_per_hour / catalog.on_demand[t] for t in cited}
    assert hosting.markups["c5"].ratio == pytest.approx(ratio["c5.xlarge"]) == 1.2
    assert hosting.markups["m5"].ratio == pytest.approx(ratio["m5.xlarge"])
    assert ratio["m5.large"] == pytest.approx(ratio["m5.xlarge"])  # the two m5 citations agree
    assert hosting.markups["p3"].ratio == pytest.approx(ratio["p3.2xlarge"]) == 1.25
    # g4dn's two citations disagree (1.40 on xlarge, 1.25 on 12xlarge): the lower is used.
    assert ratio["g4dn.xlarge"] == pytest.approx(1.3992, abs=1e-4)
    assert hosting.markups["g4dn"].ratio == pytest.approx(ratio["g4dn.12xlarge"]) == 1.25
    derived = [p for p in hosting.prices.values() if p.derived]
    assert len(derived) >= 10
    for p in derived:
        ec2 = catalog.on_demand[p.instance_type]
        markup = hosting.markups[family_of(p.instance_type)].ratio
        assert p.price_per_hour == pytest.approx(ec2 * markup, abs=5e-5), p.instance_type
        assert p.price_per_hour > ec2
    assert hosting.prices["c5.large"].price_per_hour == 0.102


def test_families_without_a_documented_markup_have_no_price_and_retiring_ones_are_not_offered() -> (
    None
):
    hosting = load_hosting_prices()
    for t in ("p2.xlarge", "inf1.xlarge", "t2.medium", "c6i.large"):
        assert t not in hosting.prices
        with pytest.raises(UnknownOffering, match=f"no SageMaker ml.* hosting price for {t}"):
            hosting.price(t)
    assert "retiring P2" in hosting.why_not("p2.xlarge")
    offered = hosting.offered()
    assert "c5.large" in offered and "g4dn.xlarge" in offered
    assert not any(t.startswith(("p2.", "p3.")) for t in offered)
    assert not hosting.prices["p3.2xlarge"].offered  # priced, used only when asked for


def test_the_sagemaker_type_is_the_cheapest_per_request_among_priced_offered_types() -> None:
    """Inception-v3 on the current types (C5): SageMaker runs on the c5 cheapest per
    request at its ml.* price."""
    model = paper_model("inception-v3")
    options = model_options(model, load_catalog(), ["on-demand"], True, 120.0)
    hosting = load_hosting_prices()
    sm = hosting_option(options, hosting, None, model.name)
    assert sm.instance_type in hosting.offered() and sm.instance_type.startswith("c5.")
    per_request = {
        o.instance_type: hosting.prices[o.instance_type].price_per_hour / o.capacity_rps
        for o in options
        if o.instance_type in hosting.prices
    }
    assert per_request[sm.instance_type] == min(per_request.values())
    # A retiring family is not chosen even when it would be cheapest per request.
    p3 = replace(options[0], instance_type="p3.2xlarge", capacity_rps=1e6)
    assert hosting_option([*options, p3], hosting, None, model.name) == sm
    assert hosting_option([*options, p3], hosting, "p3.2xlarge", model.name) == p3  # asked for


def test_a_retiring_sagemaker_type_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--policies", "mark,sagemaker", "--sagemaker-type", "p2.xlarge"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "--sagemaker-type 'p2.xlarge': AWS is retiring P2 instances" in err
    assert "every policy runs on current types" in err and "c5.large" in err


def test_a_response_later_than_the_invocation_timeout_fails_but_still_takes_the_instance() -> None:
    # 100 requests at t=0 on one instance taking 1 s each, no Bouncer: request k ends at
    # k + 1 s. With InvokeEndpoint's 60 s, the 40 that would end after 60 s fail; the
    # instance still works on them (it is busy until t=100 either way), so one more
    # request at t=99.5 waits 0.5 s and takes 1 s.
    arrivals = np.append(np.zeros(100), 99.5)
    for timeout, failed in ((None, 0), (60.0, 40)):
        eng = Engine(arrivals, 0.5, None, lambda k: 1.0, bouncer=False, timeout_s=timeout)
        srv = Server("i-1", "c5.large", "on-demand", "serving", BatchLatency(((1, 1.0),)))
        eng.set_servers([srv])
        eng.serve_until(200.0)
        assert int(np.count_nonzero(eng.where == FAILED)) == failed
        assert eng.where[-1] == INSTANCE and eng.lat[-1] == pytest.approx(1.5)
        assert srv.served == 101
        assert eng.lat[59] == pytest.approx(60.0)  # not later than 60 s: answered
        if timeout is not None:
            assert np.isinf(eng.lat[60:100]).all()
            assert (eng.where[60:100] == FAILED).all()


def _tiny_model() -> SimModel:
    return SimModel(
        name="tiny",
        rt_max_s=0.6,
        sl_min=0.98,
        latency={
            "c5.large": BatchLatency(((1, 0.2),)),
            "c5.xlarge": BatchLatency(((1, 0.1), (4, 0.25))),
        },
        lambda_t1_s=0.4,
        standby_t1_s=0.2,
    )


async def test_sagemaker_costs_at_least_ec2_target_tracking_and_both_at_least_the_bound() -> None:
    """A load that steps up and down: both target-trackers run on the same type (c5 has one
    markup); SageMaker pays 1.2× for it, reacts a minute later and waits for updates."""
    seconds = 3600
    rates = np.full(seconds, 4.0)
    rates[900:2100] = 20.0
    per_second = np.concatenate([np.full(HISTORY_S, 4.0), rates])
    w = Workload("step", per_second, EPOCH, HISTORY_S, seconds)
    cfg = SimConfig(warmup_s=300, seed=1, boot_s=120)
    sm, ec2 = await compare(
        w,
        _tiny_model(),
        [POLICIES["sagemaker"], POLICIES["ec2-target-tracking"]],
        cfg,
        forecaster=None,
    )
    assert (sm.policy, ec2.policy) == ("sagemaker", "ec2-target-tracking")
    assert sm.extra["sagemaker_type"] == f"ml.{ec2.extra['sagemaker_type']}"
    assert sm.extra["ml_price_per_hour"] == pytest.approx(
        1.2 * load_catalog().on_demand[str(ec2.extra["sagemaker_type"])]
    )
    assert sm.extra["metric_delay_s"] == 60.0 and sm.extra["invocation_timeout_s"] == 60.0
    assert sm.total_cost >= ec2.total_cost > 0
    assert sm.costs["lambda"] == ec2.costs["lambda"] == 0.0
    assert sm.bound is ec2.bound  # the same markets: one bound, in EC2 prices
    for r in (sm, ec2):
        assert r.bound is not None
        floor = r.bound_own.value if r.bound_own is not None else r.bound.value
        assert r.total_cost >= floor * (1 - 1e-6)


async def test_a_sweep_may_skip_the_bound_at_a_runs_own_misses() -> None:
    """SageMaker misses the step's rise: bounded at its own misses unless asked not to
    (``--no-bound-own-misses``), when it keeps the SLO's bound alone."""
    rates = np.full(3600, 4.0)
    rates[900:2100] = 20.0
    w = Workload("step", np.concatenate([np.full(HISTORY_S, 4.0), rates]), EPOCH, HISTORY_S, 3600)
    cfg = SimConfig(warmup_s=300, seed=1, boot_s=120)
    (with_own,) = await compare(w, _tiny_model(), [POLICIES["sagemaker"]], cfg, forecaster=None)
    (without,) = await compare(
        w, _tiny_model(), [POLICIES["sagemaker"]], cfg, forecaster=None, own_misses=False
    )
    assert with_own.bound is not None and with_own.missed > with_own.bound.miss_budget
    assert with_own.bound_own is not None and with_own.bound_own.value > 0
    assert without.bound_own is None and without.bound is not None
    assert without.bound.value == with_own.bound.value and without.missed == with_own.missed
    (unbounded,) = await compare(
        w, _tiny_model(), [POLICIES["sagemaker"]], cfg, forecaster=None, bound=False
    )
    assert unbounded.bound is None and unbounded.bound_own is None
    assert unbounded.total_cost == with_own.total_cost  # the run itself is the same
