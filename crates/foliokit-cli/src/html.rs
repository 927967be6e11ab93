//! The lab's self-contained index.html: machine summary, every table, the
//! plots inline as SVG, and a self-check a headless browser can read.

use std::fmt::Write as _;
use std::time::Duration;

use crate::args::show_size;
use crate::lab::Entry;
use crate::machine::{flags_line, Machine};
use crate::report::escape;

const STYLE: &str =
    "body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1100px;color:#222}\
h1{margin-bottom:.2rem}h2{margin-top:2.5rem;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.8rem 0;font-size:.85rem}\
td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}th{background:#f4f4f4}\
td:nth-child(2),th:nth-child(2){text-align:left}p.note{font-size:.8rem;color:#555;margin:.15rem 0}\
.machine td{text-align:left}#selfcheck{font-size:.8rem;color:#777}figure{margin:1rem 0}";

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
  const ok = plots.length > 0 && badPlots.length === 0 && tables.length > 0 && empty.length === 0 && window.__errors.length === 0;
  const el = document.getElementById('selfcheck');
  el.dataset.status = ok ? 'ok' : 'fail';
  el.dataset.plots = plots.length;
  el.dataset.tables = tables.length;
  el.dataset.errors = window.__errors.length;
  el.textContent = 'self-check: ' + (ok ? 'ok' : 'FAILED') + ' (' + plots.length + ' plots, ' +
    badPlots.length + ' empty; ' + tables.length + ' tables, ' + empty.length + ' empty; ' +
    window.__errors.length + ' errors)';
  document.title = (ok ? 'ok' : 'FAIL') + ' | ' + document.title;
});
"#;

pub fn page(
    m: &Machine,
    notes: &[String],
    entries: &[Entry],
    scale: &str,
    elapsed: Duration,
) -> String {
    let c = &m.cpu;
    let s = &m.system;
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>foliokit lab</title><style>{STYLE}</style><script>{CHECK}</script></head><body>"
    );
    let _ = write!(
        out,
        "<h1>foliokit lab</h1><p>The seed experiments on this machine ({scale} run, {:.0} s). Ratios compare strategies measured in the same run.</p><p id=\"selfcheck\" data-status=\"pending\">self-check: pending</p>",
        elapsed.as_secs_f64()
    );
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
        ("kernel", s.kernel.clone()),
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
    out += "<h2>Machine</h2><table class=\"machine\"><tbody>";
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
            "<h2 id=\"{}\">{}</h2><p class=\"note\">Seed {}; the seed's own figures are quoted under the table.</p>",
            e.key,
            escape(&e.heading),
            e.seed
        );
        for p in &e.plots {
            let _ = write!(out, "<figure>{p}</figure>");
        }
        out += &e.html_table;
    }
    out += "</body></html>\n";
    out
}
