//! The lab's self-contained index.html: machine summary, every table, the
//! plots inline as SVG, and a self-check a headless browser can read.

use serde_json::Value;
use std::fmt::Write as _;
use std::time::Duration;

use crate::args::show_size;
use crate::machine::{flags_line, Machine};
use crate::report::escape;
use foliokit_lab::summary::Line;

/// One experiment's outputs, whatever its row type.
pub struct Entry {
    pub key: &'static str,
    pub heading: String,
    pub seed: &'static str,
    pub json: Value,
    pub csv: String,
    pub html_table: String,
    /// The rows that matter, where the experiment names them.
    pub key_table: Option<String>,
    pub rows: usize,
    pub plots: Vec<String>,
}

const STYLE: &str =
    "body{font-family:system-ui,sans-serif;margin:1.5rem auto;max-width:1100px;color:#222;font-size:17px}\
h1{margin-bottom:.2rem}h2{margin-top:2.2rem;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.8rem 0;font-size:.9rem}\
td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}th{background:#f4f4f4}\
td:nth-child(2),th:nth-child(2){text-align:left}p.note{font-size:.85rem;color:#555;margin:.15rem 0}\
.machine td,.summary td,.summary th{text-align:left}\
tr.noisy td{background:#fff4e0}tr.noisy td:first-child::before{content:'! '}\
td.yes{color:#05603a}td.no{color:#8a4b00}nav{font-size:.9rem;margin:.5rem 0 1rem}nav a{margin-right:1rem}\
#selfcheck{display:none}figure{margin:1rem 0}figure svg{max-width:100%;height:auto}details{margin:.5rem 0}\
ul.legend{list-style:none;padding:0;margin:.2rem 0 0 70px;display:flex;flex-wrap:wrap;gap:.3rem 1.2rem;font-size:.9rem}\
ul.legend svg{vertical-align:middle;margin-right:.3rem}";

/// Runs in the browser: every plot drew something, every table has rows,
/// nothing logged an error. The verdict lands in #selfcheck and the title.
const CHECK: &str = r#"
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message)));
const __ce = console.error;
console.error = (...a) => { window.__errors.push(a.join(' ')); __ce(...a); };
window.addEventListener('load', () => {
  const plots = [...document.querySelectorAll('svg.plot')];
  const badPlots = plots.filter(s => {
    const r = s.getBoundingClientRect();
    return r.width < 100 || r.height < 100 || s.querySelectorAll('path,polyline,rect,circle,line').length < 5;
  });
  const tables = [...document.querySelectorAll('table.data')];
  const empty = tables.filter(t => t.querySelectorAll('tbody tr').length === 0);
  // Every plot names both axes with text it really draws, and has an error
  // bar (drawn at the error-bar opacity) for each point with a spread.
  const texts = s => [...s.querySelectorAll('text')].map(t => t.textContent.trim());
  const unlabelled = plots.filter(s => !s.dataset.x || !s.dataset.y ||
    !texts(s).includes(s.dataset.x) || !texts(s).includes(s.dataset.y));
  const noBars = plots.filter(s => {
    const want = Number(s.dataset.spread || 0);
    const bars = s.querySelectorAll('[opacity="' + ERRORBAR_OPACITY + '"]').length / 3;
    return bars < want;
  });
  const summary = document.querySelectorAll('table.summary tbody tr').length;
  const ok = plots.length > 0 && badPlots.length === 0 && unlabelled.length === 0 && noBars.length === 0 &&
    tables.length > 0 && empty.length === 0 && window.__errors.length === 0 && summary > 0;
  const el = document.getElementById('selfcheck');
  el.dataset.status = ok ? 'ok' : 'fail';
  el.dataset.plots = plots.length;
  el.dataset.tables = tables.length;
  el.dataset.errors = window.__errors.length;
  el.dataset.unlabelled = unlabelled.length;
  el.dataset.nobars = noBars.length;
  el.dataset.summary = summary;
  el.textContent = 'self-check: ' + (ok ? 'ok' : 'FAILED') + ' (' + plots.length + ' plots, ' +
    badPlots.length + ' empty, ' + unlabelled.length + ' unlabelled, ' + noBars.length + ' missing error bars; ' +
    summary + ' summary lines; ' + tables.length + ' tables, ' + empty.length + ' empty; ' +
    window.__errors.length + ' errors)';
  document.title = (ok ? 'ok' : 'FAIL') + ' | ' + document.title;
});
"#;

/// The page's head: style and the self-check (with the error-bar opacity
/// the plots use).
pub fn head(title: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style><script>const ERRORBAR_OPACITY = '{}';{CHECK}</script></head><body>",
        escape(title),
        crate::plots::ERRORBAR_OPACITY
    )
}

/// The hidden element the self-check writes its verdict into.
pub const SELFCHECK: &str = "<p id=\"selfcheck\" data-status=\"pending\">self-check: pending</p>";

fn summary_table(lines: &[Line]) -> String {
    let mut out = String::from(
        "<table class=\"summary data\"><thead><tr><th>seed</th><th>experiment</th><th>seed's figure</th><th>ours, same shape</th><th>share of limit</th><th>verdict</th></tr></thead><tbody>",
    );
    for l in lines {
        let class = if l.verdict.starts_with("reproduced") {
            "yes"
        } else {
            "no"
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td></tr>",
            l.seed,
            escape(&l.what),
            escape(&l.seed_figure),
            escape(&l.ours),
            l.of_limit
                .map_or("not measured".to_string(), |x| format!("{:.0}%", x * 100.0)),
            escape(&l.verdict)
        );
    }
    out += "</tbody></table>";
    out
}

/// A long table is collapsed; the rows that matter (when the experiment
/// names them) stay in view.
fn table_block(e: &Entry) -> String {
    const LONG: usize = 12;
    match (&e.key_table, e.rows > LONG) {
        (Some(key), _) => format!(
            "<p class=\"note\">The rows that matter: baseline, auto and the best named strategy per folio size and channel count.</p>{key}<details><summary>all {} rows</summary>{}</details>",
            e.rows, e.html_table
        ),
        (None, true) => format!(
            "<details><summary>table: {} rows</summary>{}</details>",
            e.rows, e.html_table
        ),
        (None, false) => e.html_table.clone(),
    }
}

pub fn page(
    m: &Machine,
    notes: &[String],
    summary: &[Line],
    entries: &[Entry],
    scale: &str,
    elapsed: Duration,
) -> String {
    let c = &m.cpu;
    let s = &m.system;
    let mut out = head("foliokit lab");
    let _ = write!(
        out,
        "<h1>foliokit lab</h1><p>The seed experiments on this machine ({scale} run, {:.0} s). Ratios compare strategies measured in the same run; plots show mean ± stdev, hollow markers and outlined bars are rows whose stdev exceeds {:.0}% of the mean.</p>{SELFCHECK}",
        elapsed.as_secs_f64(),
        foliokit_lab::measure::NOISY_CV * 100.0
    );
    if let Some(e) = &m.emulated {
        let _ = write!(
            out,
            "<p class=\"note\"><strong>Warning: {}</strong></p>",
            escape(e)
        );
    }
    out += "<nav><a href=\"#summary\">Summary</a><a href=\"#machine\">Machine</a>";
    for e in entries {
        let _ = write!(out, "<a href=\"#{}\">{}</a>", e.key, escape(&e.heading));
    }
    out += "</nav>";
    out += "<h2 id=\"summary\">Summary: the seeds' figures and ours</h2>";
    out += &summary_table(summary);
    let rows = [
        (
            "CPU",
            format!(
                "{} ({:?}, {} logical CPUs)",
                c.model, c.vendor, c.logical_cpus
            ),
        ),
        ("flags", flags_line(c)),
        (
            "caches",
            format!(
                "L1d {} L2 {} LLC {} ({})",
                show_size(c.caches.l1d),
                show_size(c.caches.l2),
                show_size(c.caches.llc),
                c.caches.source
            ),
        ),
        (
            "kernel",
            match &m.guest {
                Some(g) => format!(
                    "{} in a guest booted from {} ({}; nodes {})",
                    s.kernel,
                    g.kernel_image,
                    match g.accel {
                        crate::guest::Accel::Kvm => "KVM",
                        _ => "QEMU software emulation",
                    },
                    g.numa.join(" ")
                ),
                None => s.kernel.clone(),
            },
        ),
        ("NUMA nodes", format!("{:?}", s.numa_nodes)),
        (
            "THP",
            format!(
                "enabled={} defrag={}",
                s.thp.enabled.as_deref().unwrap_or("unsupported"),
                s.thp.defrag.as_deref().unwrap_or("-")
            ),
        ),
        ("calibration", m.profile.note.clone()),
    ];
    out += "<h2 id=\"machine\">Machine</h2><table class=\"machine\"><tbody>";
    for (k, v) in rows {
        let _ = write!(
            out,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(k),
            escape(&v)
        );
    }
    out += "</tbody></table>";
    for n in notes {
        let _ = write!(out, "<p class=\"note\">note: {}</p>", escape(n));
    }
    for e in entries {
        let _ = write!(
            out,
            "<h2 id=\"{}\">{}</h2><p class=\"note\">Seed {}; the seed's own figures are quoted under the table and drawn as grey marks where the shape is the same.</p>",
            e.key,
            escape(&e.heading),
            e.seed
        );
        for p in &e.plots {
            let _ = write!(out, "<figure>{p}</figure>");
        }
        out += &table_block(e);
    }
    out += "</body></html>\n";
    out
}
