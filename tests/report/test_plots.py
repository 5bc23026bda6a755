"""Every plot is drawn from the CSV files, written as a PNG, and readable: titles, axis labels
(with units where there are units), a legend."""
import numpy as np
import pandas as pd
import pytest

from batchlab.report import pareto, plots, run_plots
from batchlab.report.load import load_requests
from batchlab.run.config import load_user_config
from batchlab.run.sweep import run_sweep

SLO = {"ttft_s": 1.0, "tpot_s": 0.05}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("plots")
    cfg = load_user_config(None, ["traffic.rates=[5, 20]", "traffic.duration_s=12", "traffic.warmup_s=2", "report=false"])
    run_sweep(cfg, out)
    return out, pd.read_csv(out / "summary.csv"), load_requests(out)


def capture(monkeypatch, render: bool) -> list:
    """Keep each figure's parts before it is saved and closed; render=False skips the PNG."""
    seen = []
    original = plots.save

    def keep(fig, path):
        seen.append((path.name, fig.get_suptitle(), [ax for ax in fig.axes if ax.get_visible()],
                     bool(fig.legends) or any(ax.get_legend() for ax in fig.axes)))
        return original(fig, path) if render else plots.plt.close(fig) or path
    monkeypatch.setattr(plots, "save", keep)
    monkeypatch.setattr(run_plots, "save", keep)
    monkeypatch.setattr(pareto, "save", keep)
    return seen


@pytest.fixture
def figures(monkeypatch):
    return capture(monkeypatch, render=True)


@pytest.fixture
def parts(monkeypatch):
    return capture(monkeypatch, render=False)


def draw_all(out, summary, requests):
    yield plots.plot_tradeoff(summary, out, SLO, {"continuous": 20.0})
    yield plots.plot_latency_vs_rate(summary, out, SLO)
    yield pareto.plot_pareto(summary, out)
    yield plots.plot_cdf(requests, out, 20.0, SLO)
    yield run_plots.plot_timeline(requests, out, 20.0, 2.0)
    yield run_plots.plot_requests(requests, out, 5.0, 2.0)
    yield run_plots.plot_breakdown(requests, out)
    yield run_plots.plot_useful_work(requests, out, 20.0, {"naive": 32, "dynamic": 64})
    yield run_plots.plot_burst(requests, out, 5.0, 2.0, (6.0, 9.0), {"naive": 1.0}, 4.0, 20.0)


def test_each_plot_writes_a_png_with_titles_labels_and_a_legend(data, figures):
    out, summary, requests = data
    paths = list(draw_all(out, summary, requests))
    assert len({p.name for p in paths}) == 9
    for p in paths:
        assert p.read_bytes().startswith(b"\x89PNG") and p.stat().st_size > 20_000
    for name, title, axes, has_legend in figures:
        assert title and has_legend, name
        for ax in axes:
            assert ax.get_title() and ax.get_ylabel(), (name, ax.get_title())
            assert ax.get_xlabel() or ax.get_shared_x_axes().get_siblings(ax) != [ax], (name, ax.get_title())


def test_latency_axes_say_seconds_and_are_log_scaled(data, parts):
    figures = parts
    out, summary, requests = data
    plots.plot_tradeoff(summary, out, SLO, {})
    plots.plot_latency_vs_rate(summary, out, SLO)
    for name, _, axes, _ in figures:
        for ax in axes:
            assert "(s, log scale)" in ax.get_ylabel() and ax.get_yscale() == "log", name
    assert "tokens/s" in figures[0][2][-1].get_xlabel()
    assert figures[1][2][0].get_xlabel() == "arrival rate (req/s)"


def test_the_knee_is_marked_on_the_tradeoff_plot(data, parts):
    figures = parts
    out, summary, _ = data
    plots.plot_tradeoff(summary, out, SLO, {"continuous": 20.0})
    ax = figures[0][2][0]
    stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert len(stars) == 1
    row = summary[(summary["strategy"] == "continuous") & (summary["rate"] == 20.0)].iloc[0]
    assert stars[0].get_xdata()[0] == pytest.approx(row["throughput_tok_s"])


# Points with nothing measured (issue #11): left out of their curves with a note, never an axis
# from NaN, never a warning.

NOTHING = ["throughput_tok_s", "requests_per_s", "goodput"] + [f"{k}_p{q}" for k in ("ttft", "tpot", "e2e")
                                                              for q in (50, 90, 99)]


def finite_limits(axes) -> bool:
    return all(np.isfinite(ax.get_xlim()).all() and np.isfinite(ax.get_ylim()).all() for ax in axes)


def notes(axes) -> list[str]:
    return [t.get_text() for t in axes[0].figure.texts]


@pytest.mark.filterwarnings("error")
def test_a_point_with_nothing_measured_is_left_out_of_its_curve_and_named(data, figures):
    out, summary, _ = data
    summary = summary.copy()
    summary.loc[(summary["strategy"] == "naive") & (summary["rate"] == 20.0), NOTHING] = np.nan
    plots.plot_tradeoff(summary, out, SLO, {})
    plots.plot_latency_vs_rate(summary, out, SLO)
    for name, _, axes, _ in figures:
        naive = [line for line in axes[0].get_lines() if line.get_color() == plots.color("naive")]
        assert naive and all(len(line.get_xdata()) == 1 for line in naive), name      # its 5 req/s point only
        assert any("naive at 20 req/s" in t for t in notes(axes)), name
        assert finite_limits(axes), name


@pytest.mark.filterwarnings("error")
def test_with_nothing_measured_anywhere_every_panel_says_so(data, figures):
    out, summary, requests = data
    summary = summary.copy()
    summary[NOTHING] = np.nan
    failed = requests.assign(status="failed", ttft=np.nan, tpot=np.nan, e2e=np.nan, completion_time=np.nan)
    plots.plot_tradeoff(summary, out, SLO, {"naive": 5.0})
    plots.plot_latency_vs_rate(summary, out, SLO)
    plots.plot_cdf(failed, out, 20.0, SLO)
    for name, _, axes, _ in figures:
        for ax in axes:
            assert not [line for line in ax.get_lines() if line.get_label() in ("naive", "dynamic", "continuous")]
            assert "no requests finished" in [t.get_text() for t in ax.texts], name
        assert finite_limits(axes), name
        assert any("naive at every rate" in t or "naive at 20 req/s" in t for t in notes(axes)), name
    assert run_plots.plot_breakdown(failed, out) is None


@pytest.mark.filterwarnings("error")
def test_run_plots_at_a_rate_with_no_requests_or_none_finished(data, figures):
    out, _, requests = data
    run_plots.plot_timeline(requests, out, 7.0, 2.0)                   # no point at 7 req/s
    run_plots.plot_requests(requests[requests["warmup"] == 1], out, 5.0, 2.0)
    failed = requests.assign(status="failed", ttft=np.nan, scheduled_time=np.nan, first_token_time=np.nan,
                             completion_time=np.nan)
    run_plots.plot_burst(failed, out, 5.0, 2.0, (6.0, 9.0), {"naive": float("nan")}, 4.0, 20.0)
    (_, _, timeline, _), (_, title, bars, _), (_, _, burst, _) = figures
    assert all("no requests at 7 req/s" in [t.get_text() for t in ax.texts] for ax in timeline)
    assert title == "No request arrived after the warm-up at 5 req/s"
    assert "no requests finished" in [t.get_text() for t in burst[1].texts] and not burst[1].get_lines()
    assert any("naive at 5 req/s" in t for t in notes(burst))
    assert finite_limits(timeline + bars + burst)


@pytest.mark.filterwarnings("error")
def test_useful_work_names_a_lockstep_strategy_with_no_finished_batch(data, parts):
    out, _, requests = data
    at20 = (requests["strategy"] == "naive") & (requests["rate"] == 20.0)
    failed = requests.assign(status=requests["status"].where(~at20, "failed"))
    run_plots.plot_useful_work(failed, out, 5.0, {"naive": 32})
    _, _, axes, _ = parts[0]
    naive = [line for line in axes[-2].get_lines() if str(line.get_label()).startswith("naive")]
    assert naive and all(list(line.get_xdata()) == [5.0] for line in naive)
    assert any("naive at 20 req/s" in t for t in notes(axes))
