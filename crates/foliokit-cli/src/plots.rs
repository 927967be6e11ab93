//! SVG plots for the lab and compare pages (plotters' SVG backend, no fonts
//! needed): labelled axes with units, ± stdev error bars, a colour-blind-safe
//! palette with a distinct marker per series, hollow markers where the
//! spread is large, and the seeds' figures as reference marks.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::CoordTranslate;
use plotters::prelude::*;

const W: u32 = 1000;
const H: u32 = 440;
const CAPTION: u32 = 22;
const LABEL: u32 = 16;
const MARGIN: u32 = 14;
const LEFT: u32 = 70;

/// A row whose stdev exceeds this share of its mean is flagged as noisy
/// (hollow marker here, a mark in the tables).
pub const NOISY_CV: f64 = 0.10;

/// Error bars are drawn at this opacity and nothing else is, so the page's
/// self-check can count them (`polyline[opacity="0.9"]`, `line[...]`).
pub const ERRORBAR_OPACITY: f64 = 0.9;

/// One measured value: mean and standard deviation.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub mean: f64,
    pub sd: f64,
}

impl Point {
    pub fn noisy(&self) -> bool {
        self.mean > 0.0 && self.sd / self.mean > NOISY_CV
    }
}

/// One named series over the plot's categories; `None` leaves a gap.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<Option<Point>>,
}

/// A figure quoted from a seed, drawn as a dashed tick at category `at`.
#[derive(Debug, Clone)]
pub struct Reference {
    pub at: usize,
    pub y: f64,
    pub label: String,
}

/// Okabe–Ito: distinguishable with the common colour-vision deficiencies
/// (yellow left out: too faint on white).
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Draws marker shape `i` (cycled at a different period than the colours,
/// so every series of up to 35 differs in colour or shape) at `at`.
fn marker<CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<SVGBackend, CT>,
    i: usize,
    at: (f64, f64),
    c: RGBColor,
    filled: bool,
) {
    let style = if filled {
        c.filled()
    } else {
        c.stroke_width(2)
    };
    let e = EmptyElement::at(at);
    let _ = match i % 5 {
        0 => chart.draw_series(std::iter::once(e + Circle::new((0, 0), 5, style))),
        1 => chart.draw_series(std::iter::once(e + TriangleMarker::new((0, 0), 6, style))),
        2 => chart.draw_series(std::iter::once(
            e + Rectangle::new([(-5, -5), (5, 5)], style),
        )),
        3 => chart.draw_series(std::iter::once(
            e + Cross::new((0, 0), 5, c.stroke_width(3)),
        )),
        _ => chart.draw_series(std::iter::once(
            e + Polygon::new(vec![(0, -6), (6, 0), (0, 6), (-6, 0)], style),
        )),
    };
}

/// An HTML legend under a plot: the plotting area keeps all its room and
/// the text stays readable at any width. Each entry shows the series'
/// colour and marker shape (`Some(i)`) or a reference mark's grey dash.
fn legend(entries: &[(String, Option<usize>)]) -> String {
    let mut out = String::from("<ul class=\"legend\">");
    for (name, shape) in entries {
        let swatch = match shape {
            Some(i) => {
                let c = color(*i);
                let fill = format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
                match i % 5 {
                    0 => format!("<circle cx=\"9\" cy=\"7\" r=\"5\" fill=\"{fill}\"/>"),
                    1 => format!("<polygon points=\"9,1 15,12 3,12\" fill=\"{fill}\"/>"),
                    2 => format!(
                        "<rect x=\"4\" y=\"2\" width=\"10\" height=\"10\" fill=\"{fill}\"/>"
                    ),
                    3 => format!(
                        "<path d=\"M4 2L14 12M14 2L4 12\" stroke=\"{fill}\" stroke-width=\"3\"/>"
                    ),
                    _ => format!("<polygon points=\"9,1 15,7 9,13 3,7\" fill=\"{fill}\"/>"),
                }
            }
            None => "<path d=\"M1 7H17\" stroke=\"#5A5A5A\" stroke-width=\"3\"/>".to_string(),
        };
        out += &format!(
            "<li><svg width=\"18\" height=\"14\" aria-hidden=\"true\">{swatch}</svg>{}</li>",
            crate::report::escape(name)
        );
    }
    out + "</ul>"
}

/// Marks the SVG so the page's self-check can find it, with its axis
/// titles (checked against the drawn text) and the number of points with a
/// spread (each must have an error bar).
fn tag(svg: String, x_desc: &str, y_desc: &str, spread: usize) -> String {
    let attrs = format!(
        "<svg class=\"plot\" data-x=\"{}\" data-y=\"{}\" data-spread=\"{spread}\" ",
        crate::report::escape(x_desc),
        crate::report::escape(y_desc)
    );
    svg.replacen("<svg ", &attrs, 1)
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn ymax(series: &[Series], refs: &[Reference]) -> f64 {
    series
        .iter()
        .flat_map(|s| s.points.iter().flatten())
        .map(|p| p.mean + p.sd)
        .chain(refs.iter().map(|r| r.y))
        .fold(0.0f64, f64::max)
}

/// What a categorical plot shows: its title, the categories along x and
/// the axis titles (with units).
pub struct Frame<'a> {
    pub title: &'a str,
    pub x_desc: &'a str,
    pub x: &'a [String],
    pub y_desc: &'a str,
}

/// A chart over categorical x positions `0..x.len()` labelled with `x`;
/// `draw` adds the series, then the references are drawn and the legend
/// follows.
fn categorical(
    f: &Frame,
    series: &[Series],
    refs: &[Reference],
    draw: impl FnOnce(&mut Chart),
) -> String {
    let Frame {
        title,
        x_desc,
        x,
        y_desc,
    } = *f;
    let top = ymax(series, refs);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        let _ = root.fill(&WHITE);
        let n = x.len().max(1);
        let Ok(mut chart) = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", CAPTION))
            .margin(MARGIN)
            .x_label_area_size(56)
            .y_label_area_size(LEFT)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top.max(1e-9) * 1.15)
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
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style(("sans-serif", LABEL))
            .axis_desc_style(("sans-serif", LABEL + 1))
            .draw();
        draw(&mut chart);
        for r in refs {
            let gray = RGBColor(90, 90, 90);
            let x0 = r.at as f64;
            let _ = chart.draw_series(std::iter::once(PathElement::new(
                vec![(x0 - 0.35, r.y), (x0 + 0.35, r.y)],
                gray.stroke_width(3),
            )));
        }
        let _ = root.present();
    }
    let mut entries: Vec<(String, Option<usize>)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.clone(), Some(i)))
        .collect();
    entries.extend(refs.iter().map(|r| (r.label.clone(), None)));
    tag(svg, x_desc, y_desc, with_spread(series)) + &legend(&entries)
}

/// Points with a spread, which get error bars.
fn with_spread(series: &[Series]) -> usize {
    series
        .iter()
        .flat_map(|s| s.points.iter().flatten())
        .filter(|p| p.sd > 0.0)
        .count()
}

/// A vertical ± sd bar at `x`, the only element drawn at
/// [`ERRORBAR_OPACITY`].
fn error_bar(chart: &mut Chart, x: f64, p: Point, c: RGBColor, half: f64) {
    if p.sd <= 0.0 {
        return;
    }
    let style = c.mix(ERRORBAR_OPACITY).stroke_width(2);
    let (lo, hi) = ((p.mean - p.sd).max(0.0), p.mean + p.sd);
    let _ = chart.draw_series([
        PathElement::new(vec![(x, lo), (x, hi)], style),
        PathElement::new(vec![(x - half, lo), (x + half, lo)], style),
        PathElement::new(vec![(x - half, hi), (x + half, hi)], style),
    ]);
}

/// One line per series over categorical x positions (e.g. folio sizes),
/// means with ± sd bars.
pub fn lines(f: &Frame, series: &[Series], refs: &[Reference]) -> String {
    // Series at one category are nudged apart so their bars do not hide
    // each other.
    let spread = 0.3 / series.len().max(1) as f64;
    categorical(f, series, refs, |chart| {
        for (i, s) in series.iter().enumerate() {
            let c = color(i);
            let dx = (i as f64 - (series.len() as f64 - 1.0) / 2.0) * spread;
            let pts: Vec<(f64, Point)> = s
                .points
                .iter()
                .enumerate()
                .filter_map(|(k, p)| p.map(|p| (k as f64 + dx, p)))
                .collect();
            let line: Vec<(f64, f64)> = pts.iter().map(|&(x, p)| (x, p.mean)).collect();
            let _ = chart.draw_series(LineSeries::new(line, c.stroke_width(2)));
            for &(x, p) in &pts {
                error_bar(chart, x, p, c, 0.04);
                marker(chart, i, (x, p.mean), c, !p.noisy());
            }
        }
    })
}

/// Grouped bars: one group per category, one bar per series, ± sd bars.
pub fn bars(f: &Frame, series: &[Series], refs: &[Reference]) -> String {
    let w = 0.8 / series.len().max(1) as f64;
    categorical(f, series, refs, |chart| {
        for (i, s) in series.iter().enumerate() {
            let c = color(i);
            let bars: Vec<(f64, Point)> = s
                .points
                .iter()
                .enumerate()
                .filter_map(|(g, p)| p.map(|p| (g as f64 - 0.4 + i as f64 * w, p)))
                .collect();
            let rects = bars.iter().map(|&(x0, p)| {
                // A noisy bar is drawn as an outline.
                let style = if p.noisy() {
                    c.stroke_width(2)
                } else {
                    c.filled()
                };
                Rectangle::new([(x0, 0.0), (x0 + w * 0.9, p.mean)], style)
            });
            let _ = chart.draw_series(rects);
            for &(x0, p) in &bars {
                error_bar(chart, x0 + w * 0.45, p, BLACK, w * 0.2);
            }
        }
    })
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
            .caption(title, ("sans-serif", CAPTION))
            .margin(MARGIN)
            .x_label_area_size(56)
            .y_label_area_size(LEFT)
            .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..ymax.max(1e-9) * 1.15)
        else {
            // An empty plot; the page's self-check reports it.
            return String::new();
        };
        let _ = chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style(("sans-serif", LABEL))
            .axis_desc_style(("sans-serif", LABEL + 1))
            .draw();
        for (i, (_, p)) in series.iter().enumerate() {
            let c = color(i);
            let _ = chart.draw_series(LineSeries::new(p.clone(), c.stroke_width(2)));
            for &q in p {
                marker(&mut chart, i, q, c, true);
            }
        }
        let _ = root.present();
    }
    let entries: Vec<(String, Option<usize>)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.0.clone(), Some(i)))
        .collect();
    tag(svg, x_desc, y_desc, 0) + &legend(&entries)
}
