//! The seeds' summary (computed by `foliokit_lab::summary` from the typed
//! results) as terminal lines.

use foliokit_lab::summary::Line;

/// The summary as terminal lines.
pub fn text(lines: &[Line]) -> String {
    let mut out = String::from("# summary: the seeds' figures and ours, in the same shape\n");
    for l in lines {
        let limit = l
            .of_limit
            .map(|x| format!("; {:.0}% of this machine's limit", x * 100.0))
            .unwrap_or_default();
        out += &format!(
            "#  seed {}: {}\n#    seed {}\n#    ours {}{limit}\n#    -> {}\n",
            l.seed, l.what, l.seed_figure, l.ours, l.verdict
        );
    }
    out
}
