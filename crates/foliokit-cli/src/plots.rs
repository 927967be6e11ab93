//! SVG plots for the lab and compare pages (plotters' SVG backend, no fonts
//! needed): labelled axes with units, ± stdev error bars, a colour-blind-safe
//! palette with a distinct marker per series, hollow markers where the
//! spread is large, and the seeds' figures as reference marks.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::CoordTranslate;
use plotters::prelude::*;

pub use foliokit_lab::measure::NOISY_CV;

const W: u32 = 1000;
const H: u32 = 440;
const CAPTION: u32 = 22;
const LABEL: u32 = 16;
const MARGIN: u32 = 14;
const LEFT: u32 = 70;

/// Error bars are drawn at this opacity and nothing else is, so the page's
/// self-check can count them (`polyline[opacity="0.9"]`, `line[...]`).
pub const ERRORBAR_OPACITY: f64 = 0.9;

/// One measured value: its median and standard deviation (the statistic
/// every table, plot and summary line shows).
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub center: f64,
    pub sd: f64,
}

impl Point {
    pub fn noisy(&self) -> bool {
        self.center > 0.0 && self.sd / self.center > NOISY_CV
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

/// Okabe–Ito (yellow left out: too faint on white), then three of Paul
/// Tol's muted set: ten colours, distinguishable with the common
/// colour-vision deficiencies, so a plot of up to ten series (copy: nine
/// strategies) never gives two the same colour.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(136, 34, 85),
    RGBColor(68, 170, 153),
    RGBColor(153, 153, 51),
];

/// Seed marks: dark, apart from the series colours and from each other.
const MARKS: [RGBColor; 4] = [
    RGBColor(90, 90, 90),
    RGBColor(51, 34, 136),
    RGBColor(170, 68, 153),
    RGBColor(17, 119, 51),
];

/// What a legend entry shows: series `i`'s colour and marker, or seed
/// mark `j`'s dash.
#[derive(Clone, Copy)]
enum Swatch {
    Series(usize),
    Mark(usize),
}

fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

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
fn legend(entries: &[(String, Swatch)]) -> String {
    let mut out = String::from("<ul class=\"legend\">");
    for (name, shape) in entries {
        let swatch = match shape {
            Swatch::Series(i) => {
                let fill = hex(color(*i));
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
            Swatch::Mark(j) => format!(
                "<path d=\"M1 7H17\" stroke=\"{}\" stroke-width=\"3\"{}/>",
                hex(MARKS[j % MARKS.len()]),
                if j % 2 == 1 {
                    " stroke-dasharray=\"4 2\""
                } else {
                    ""
                }
            ),
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
        .map(|p| p.center + p.sd)
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
        for (j, r) in refs.iter().enumerate() {
            let c = MARKS[j % MARKS.len()];
            let x0 = r.at as f64;
            let _ = chart.draw_series(std::iter::once(PathElement::new(
                vec![(x0 - 0.35, r.y), (x0 + 0.35, r.y)],
                c.stroke_width(3),
            )));
        }
        let _ = root.present();
    }
    let mut entries: Vec<(String, Swatch)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.clone(), Swatch::Series(i)))
        .collect();
    entries.extend(
        refs.iter()
            .enumerate()
            .map(|(j, r)| (r.label.clone(), Swatch::Mark(j))),
    );
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
    let (lo, hi) = ((p.center - p.sd).max(0.0), p.center + p.sd);
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
            let line: Vec<(f64, f64)> = pts.iter().map(|&(x, p)| (x, p.center)).collect();
            let _ = chart.draw_series(LineSeries::new(line, c.stroke_width(2)));
            for &(x, p) in &pts {
                error_bar(chart, x, p, c, 0.04);
                marker(chart, i, (x, p.center), c, !p.noisy());
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
                Rectangle::new([(x0, 0.0), (x0 + w * 0.9, p.center)], style)
            });
            let _ = chart.draw_series(rects);
            for &(x0, p) in &bars {
                error_bar(chart, x0 + w * 0.45, p, BLACK, w * 0.2);
            }
        }
    })
}

/// One point of a curve: where it lies on x, its y with spread, and a
/// label drawn beside it (e.g. the batch size).
#[derive(Debug, Clone)]
pub struct CurvePoint {
    pub x: f64,
    pub y: Point,
    pub label: String,
}

/// Curves through points with a logarithmic x axis, ± sd bars on y and
/// each point labelled: throughput vs latency, one curve per channel
/// count.
pub fn log_x_curves(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<CurvePoint>)],
) -> String {
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (xmin, xmax, ymax) = pts.fold((f64::MAX, 0.0f64, 0.0f64), |(a, b, c), q| {
        (a.min(q.x), b.max(q.x), c.max(q.y.center + q.y.sd))
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
            let line: Vec<(f64, f64)> = p.iter().map(|q| (q.x, q.y.center)).collect();
            let _ = chart.draw_series(LineSeries::new(line, c.stroke_width(2)));
            for q in p {
                if q.y.sd > 0.0 {
                    let style = c.mix(ERRORBAR_OPACITY).stroke_width(2);
                    let (lo, hi) = ((q.y.center - q.y.sd).max(0.0), q.y.center + q.y.sd);
                    let _ = chart.draw_series([
                        PathElement::new(vec![(q.x, lo), (q.x, hi)], style),
                        PathElement::new(vec![(q.x / 1.04, lo), (q.x * 1.04, lo)], style),
                        PathElement::new(vec![(q.x / 1.04, hi), (q.x * 1.04, hi)], style),
                    ]);
                }
                marker(&mut chart, i, (q.x, q.y.center), c, !q.y.noisy());
                let _ = chart.draw_series(std::iter::once(
                    EmptyElement::at((q.x, q.y.center))
                        + Text::new(q.label.clone(), (6, -16), ("sans-serif", LABEL - 2)),
                ));
            }
        }
        let _ = root.present();
    }
    let entries: Vec<(String, Swatch)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.0.clone(), Swatch::Series(i)))
        .collect();
    let spread = series
        .iter()
        .flat_map(|s| s.1.iter())
        .filter(|q| q.y.sd > 0.0)
        .count();
    tag(svg, x_desc, y_desc, spread) + &legend(&entries)
}
