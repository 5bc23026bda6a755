"""Every plot is drawn from the CSV files, written as a PNG, and readable: titles, axis labels
(with units where there are units), a legend."""
import pandas as pd
import pytest

from batchlab.core.config import load_user_config
from batchlab.report import plots, run_plots
from batchlab.report.report import load_requests
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
    yield plots.plot_cdf(requests, out, 20.0, SLO)
    yield run_plots.plot_timeline(requests, out, 20.0, 2.0)
    yield run_plots.plot_requests(requests, out, 5.0, 2.0)
    yield run_plots.plot_breakdown(requests, out)
    yield run_plots.plot_useful_work(requests, out, 20.0, {"naive": 32, "dynamic": 64})
    yield run_plots.plot_burst(requests, out, 5.0, 2.0, (6.0, 9.0), {"naive": 1.0}, 4.0, 20.0)


def test_each_plot_writes_a_png_with_titles_labels_and_a_legend(data, figures):
    out, summary, requests = data
    paths = list(draw_all(out, summary, requests))
    assert len({p.name for p in paths}) == 8
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
    assert "requests/s" in figures[1][2][0].get_xlabel()


def test_the_knee_is_marked_on_the_tradeoff_plot(data, parts):
    figures = parts
    out, summary, _ = data
    plots.plot_tradeoff(summary, out, SLO, {"continuous": 20.0})
    ax = figures[0][2][0]
    stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert len(stars) == 1
    row = summary[(summary["strategy"] == "continuous") & (summary["rate"] == 20.0)].iloc[0]
    assert stars[0].get_xdata()[0] == pytest.approx(row["throughput_tok_s"])
