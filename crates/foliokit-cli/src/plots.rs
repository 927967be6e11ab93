//! SVG plots for the lab report (plotters' SVG backend, no fonts needed).

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

const W: u32 = 760;
const H: u32 = 380;

/// Marks the SVG so the page's self-check can find it.
fn tag(svg: String) -> String {
    svg.replacen("<svg ", "<svg class=\"plot\" ", 1)
}

fn color(i: usize) -> RGBColor {
    let c = Palette99::pick(i).to_rgba();
    RGBColor(c.0, c.1, c.2)
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A chart over categorical x positions `0..x.len()` labelled with `x`;
/// `draw` adds the series, then the legend goes to `legend`.
fn categorical(
    title: &str,
    x: &[String],
    y_desc: &str,
    ymax: f64,
    legend: SeriesLabelPosition,
    draw: impl FnOnce(&mut Chart),
) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        let _ = root.fill(&WHITE);
        let n = x.len().max(1);
        let Ok(mut chart) = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..ymax.max(1e-9) * 1.15)
        else {
            // An empty plot; the page's self-check reports it.
            return String::new();
        };
        let _ = chart
            .configure_mesh()
            .x_labels(n)
            .x_label_formatter(&|v| {
                let i = v.round();
                if (v - i).abs() < 1e-6 && i >= 0.0 {
                    x.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .disable_x_mesh()
            .y_desc(y_desc)
            .draw();
        draw(&mut chart);
        let _ = chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(legend)
            .draw();
        let _ = root.present();
    }
    tag(svg)
}

/// One line per series over categorical x positions (e.g. folio sizes).
/// `None` values leave a gap.
pub fn lines(
    title: &str,
    x: &[String],
    y_desc: &str,
    series: &[(String, Vec<Option<f64>>)],
) -> String {
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().flatten())
        .fold(0.0f64, |a, &b| a.max(b));
    categorical(
        title,
        x,
        y_desc,
        ymax,
        SeriesLabelPosition::UpperLeft,
        |chart| {
            for (i, (name, ys)) in series.iter().enumerate() {
                let c = color(i);
                let pts: Vec<(f64, f64)> = ys
                    .iter()
                    .enumerate()
                    .filter_map(|(k, y)| y.map(|y| (k as f64, y)))
                    .collect();
                if let Ok(s) = chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2))) {
                    s.label(name.clone()).legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                    });
                }
                let _ = chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())));
            }
        },
    )
}

/// Grouped bars: one group per category, one bar per series.
pub fn bars(title: &str, cats: &[String], y_desc: &str, series: &[(String, Vec<f64>)]) -> String {
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter())
        .fold(0.0f64, |a, &b| a.max(b));
    let w = 0.8 / series.len().max(1) as f64;
    categorical(
        title,
        cats,
        y_desc,
        ymax,
        SeriesLabelPosition::UpperRight,
        |chart| {
            for (i, (name, vals)) in series.iter().enumerate() {
                let c = color(i);
                let rects = vals.iter().enumerate().map(move |(g, &v)| {
                    let x0 = g as f64 - 0.4 + i as f64 * w;
                    Rectangle::new([(x0, 0.0), (x0 + w * 0.9, v)], c.filled())
                });
                if let Ok(s) = chart.draw_series(rects) {
                    s.label(name.clone()).legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled())
                    });
                }
            }
        },
    )
}

/// Curves through (x, y) points with a logarithmic x axis: throughput vs
/// latency, one curve per channel count.
pub fn log_x_curves(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (xmin, xmax, ymax) = pts.fold((f64::MAX, 0.0f64, 0.0f64), |(a, b, c), &(x, y)| {
        (a.min(x), b.max(x), c.max(y))
    });
    let (xmin, xmax) = if xmin <= xmax {
        (xmin.max(1.0) / 1.5, xmax * 1.5)
    } else {
        (1.0, 10.0)
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        let _ = root.fill(&WHITE);
        let Ok(mut chart) = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(52)
            .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..ymax.max(1e-9) * 1.15)
        else {
            // An empty plot; the page's self-check reports it.
            return String::new();
        };
        let _ = chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw();
        for (i, (name, p)) in series.iter().enumerate() {
            let c = color(i);
            if let Ok(s) = chart.draw_series(LineSeries::new(p.clone(), c.stroke_width(2))) {
                s.label(name.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                });
            }
            let _ = chart.draw_series(p.iter().map(|&q| Circle::new(q, 3, c.filled())));
        }
        let _ = chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw();
        let _ = root.present();
    }
    tag(svg)
}
