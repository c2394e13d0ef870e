//! The SVG plot: time against k for the three paths, one panel per measurement, log-log.
//!
//! Drawn with `plotters` and its SVG backend only: text goes into the SVG as `<text>` elements
//! that the viewer renders, so no font files or system libraries are needed to build or run it.

use std::path::Path;

use plotters::prelude::*;

use crate::measure::{Metric, Samples, Workload};
use crate::stats::Stats;
use crate::workload::{BenchError, Mode, PathId, Result};

/// One line: a path's medians over k, with min–max bars.
struct Line {
    path: PathId,
    workload: Workload,
    /// (k, median, min, max), in microseconds.
    points: Vec<(f64, f64, f64, f64)>,
}

fn color(path: PathId) -> RGBColor {
    match path {
        PathId::Safe => RGBColor(0x1f, 0x77, 0xb4),
        PathId::Raw => RGBColor(0xff, 0x7f, 0x0e),
        PathId::C => RGBColor(0x2c, 0xa0, 0x2c),
    }
}

fn lines(samples: &Samples, ks: &[u32], metric: Metric, with_stream: bool) -> Vec<Line> {
    let mut workloads: Vec<(Workload, Metric)> = Mode::ALL
        .iter()
        .map(|&m| (Workload::Graph(m), metric))
        .collect();
    if with_stream {
        workloads.push((Workload::Stream, Metric::StreamIteration));
    }
    let mut out = Vec::new();
    for (workload, metric) in workloads {
        for path in PathId::ALL {
            let points: Vec<_> = ks
                .iter()
                .filter_map(|&k| {
                    let s = Stats::of(samples.get(&(workload, k, metric, path))?)?;
                    Some((f64::from(k), s.median / 1e3, s.min / 1e3, s.max / 1e3))
                })
                .collect();
            if !points.is_empty() {
                out.push(Line {
                    path,
                    workload,
                    points,
                });
            }
        }
    }
    out
}

/// `path`'s figure over C's, paired round by round as the table pairs them (a metric with a
/// [`Metric::paired`] ratio), as lines for the safe and raw paths and the two chains whose
/// allocations do not escape (the targets are theirs).
fn ratio_lines(samples: &Samples, ks: &[u32], metric: Metric) -> Vec<Line> {
    let mut out = Vec::new();
    for mode in Mode::FREED {
        let workload = Workload::Graph(mode);
        for path in [PathId::Safe, PathId::Raw] {
            let points: Vec<_> = ks
                .iter()
                .filter_map(|&k| {
                    let paired = metric.paired()?;
                    let s = Stats::of(samples.get(&(workload, k, paired, path))?)?;
                    Some((f64::from(k), s.median, s.min, s.max))
                })
                .collect();
            if !points.is_empty() {
                out.push(Line {
                    path,
                    workload,
                    points,
                });
            }
        }
    }
    out
}

fn plot_error(e: impl std::fmt::Display) -> BenchError {
    BenchError(format!("drawing the plot: {e}"))
}

/// Writes the plot to `file`; `subtitle` names the GPU and the date.
pub fn svg(file: &Path, samples: &Samples, ks: &[u32], subtitle: &str) -> Result<()> {
    let root = SVGBackend::new(file, (1400, 1500)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (head, body) = root.split_vertically(56);
    head.draw(&Text::new(
        "cuda-graph-bench: time against k (chain of k segments alloc → kernel → free)",
        (20, 10),
        ("sans-serif", 22).into_font(),
    ))
    .map_err(plot_error)?;
    head.draw(&Text::new(
        subtitle.to_string(),
        (20, 36),
        ("sans-serif", 14).into_font().color(&RGBColor(80, 80, 80)),
    ))
    .map_err(plot_error)?;

    let panels = body.split_evenly((3, 2));
    let specs = [
        (
            "build + instantiate (safe: checks on)",
            Metric::BuildInstantiate,
            false,
        ),
        ("first launch + synchronize", Metric::FirstLaunch, false),
        (
            "steady launch, per launch (no graph: per iteration)",
            Metric::Steady,
            true,
        ),
        (
            "launch + synchronize, per launch",
            Metric::LaunchSync,
            false,
        ),
    ];
    let k_range = (
        f64::from(ks.iter().copied().min().unwrap_or(1)) / 1.5,
        f64::from(ks.iter().copied().max().unwrap_or(1000)) * 1.5,
    );
    for (area, (title, metric, with_stream)) in panels.iter().zip(specs) {
        let lines = lines(samples, ks, metric, with_stream);
        time_panel(area, title, &lines, k_range)?;
    }
    let ratio_specs = [
        (
            format!(
                "ratio to C: build + instantiate (target: safe ≤ {} explicit, {} captured)",
                crate::report::TARGET_BUILD_EXPLICIT,
                crate::report::TARGET_BUILD_CAPTURED
            ),
            Metric::BuildInstantiate,
            crate::report::TARGET_BUILD_EXPLICIT,
        ),
        (
            format!(
                "ratio to C: steady launch (target: safe ≤ {})",
                crate::report::TARGET_STEADY
            ),
            Metric::Steady,
            crate::report::TARGET_STEADY,
        ),
    ];
    for (area, (title, metric, target)) in panels[4..].iter().zip(ratio_specs) {
        let lines = ratio_lines(samples, ks, metric);
        ratio_panel(area, &title, &lines, k_range, target)?;
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

/// The style, legend name and marker of a line.
fn style_of(line: &Line) -> (ShapeStyle, &'static str) {
    let c = color(line.path);
    match line.workload {
        Workload::Graph(Mode::Explicit) => (c.stroke_width(2), "explicit"),
        Workload::Graph(Mode::Capture) => (c.mix(0.75).stroke_width(1), "captured"),
        Workload::Graph(Mode::Escaping) => (c.mix(0.6).stroke_width(1), "escaping"),
        Workload::Stream => (c.mix(0.5).stroke_width(1), "no graph"),
        Workload::Update => (c.mix(0.5).stroke_width(1), "kernel chain"),
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Draws `lines` (medians, min–max bars, markers) and the legend on a chart.
fn draw_lines<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    lines: &[Line],
    floor: f64,
) -> Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for line in lines {
        let (style, label) = style_of(line);
        let centre: Vec<(f64, f64)> = line.points.iter().map(|p| (p.0, p.1)).collect();
        chart
            .draw_series(LineSeries::new(centre.clone(), style))
            .map_err(plot_error)?
            .label(format!("{} {label}", line.path.name()))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], style));
        chart
            .draw_series(
                line.points
                    .iter()
                    .map(|p| PathElement::new(vec![(p.0, p.2.max(floor)), (p.0, p.3)], style)),
            )
            .map_err(plot_error)?;
        match line.workload {
            Workload::Graph(Mode::Explicit) => {
                chart.draw_series(centre.iter().map(|&p| Circle::new(p, 3, style.filled())))
            }
            Workload::Graph(Mode::Capture) => {
                chart.draw_series(centre.iter().map(|&p| TriangleMarker::new(p, 4, style)))
            }
            Workload::Graph(Mode::Escaping) => chart.draw_series(
                centre
                    .iter()
                    .map(|&p| EmptyElement::at(p) + Rectangle::new([(-3, -3), (3, 3)], style)),
            ),
            Workload::Stream | Workload::Update => {
                chart.draw_series(centre.iter().map(|&p| Cross::new(p, 4, style)))
            }
        }
        .map_err(plot_error)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

/// A log-log panel of times in microseconds.
fn time_panel(area: &Area<'_>, title: &str, lines: &[Line], k: (f64, f64)) -> Result<()> {
    let lo = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.2))
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let hi = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.3))
        .fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo / 1.6, hi * 1.6)
    } else {
        (0.1, 10.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(72)
        .build_cartesian_2d((k.0..k.1).log_scale(), (lo..hi).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("k")
        .y_desc("µs")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| {
            if *y >= 10.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.2}")
            }
        })
        .draw()
        .map_err(plot_error)?;
    draw_lines(&mut chart, lines, lo)
}

/// A panel of ratios to C over log k, with the target and 1.0 drawn.
fn ratio_panel(
    area: &Area<'_>,
    title: &str,
    lines: &[Line],
    k: (f64, f64),
    target: f64,
) -> Result<()> {
    let lo = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.2))
        .fold(0.95_f64, f64::min);
    let hi = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.3))
        .fold(target + 0.03, f64::max);
    let pad = (hi - lo) * 0.08;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(72)
        .build_cartesian_2d((k.0..k.1).log_scale(), (lo - pad)..(hi + pad))
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("k")
        .y_desc("÷ C")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()
        .map_err(plot_error)?;
    for (y, style) in [
        (1.0, BLACK.mix(0.5).stroke_width(1)),
        (target, RED.mix(0.7).stroke_width(2)),
    ] {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(k.0, y), (k.1, y)],
                style,
            )))
            .map_err(plot_error)?;
    }
    draw_lines(&mut chart, lines, lo - pad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Samples;

    /// Made-up figures: the plot is drawn and written without a GPU.
    pub fn fake_samples(ks: &[u32]) -> Samples {
        let mut samples = Samples::new();
        for &k in ks {
            let k_ns = f64::from(k);
            for (pi, path) in PathId::ALL.into_iter().enumerate() {
                let f = 1.0 + 0.02 * pi as f64;
                for (mode, base) in [
                    (Mode::Explicit, 1.0),
                    (Mode::Capture, 1.3),
                    (Mode::Escaping, 1.1),
                ] {
                    let w = Workload::Graph(mode);
                    for (metric, per_k) in [
                        (Metric::BuildInstantiate, 3000.0),
                        (Metric::FirstLaunch, 2500.0),
                        (Metric::Steady, 2000.0),
                        (Metric::LaunchSync, 2600.0),
                    ] {
                        let v = (5000.0 + per_k * k_ns) * base * f;
                        samples.insert((w, k, metric, path), vec![v * 0.97, v, v * 1.05]);
                    }
                }
                let v = 6000.0 * k_ns * f;
                samples.insert(
                    (Workload::Stream, k, Metric::StreamIteration, path),
                    vec![v * 0.98, v, v * 1.01],
                );
            }
        }
        samples
    }

    #[test]
    fn writes_an_svg() {
        let ks = [1, 10, 100, 1000];
        let dir =
            std::env::temp_dir().join(format!("cuda-graph-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bench.svg");
        svg(&file, &fake_samples(&ks), &ks, "made-up figures").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.starts_with("<svg"));
        assert!(text.contains("safe explicit") && text.contains("C no graph"));
        assert!(text.contains("raw escaping"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
