//! Progress bars on stderr (hidden when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressStyle};

pub fn bar(total: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total as u64);
    pb.set_style(
        ProgressStyle::with_template("{msg:>24} [{bar:30}] {pos}/{len} runs, ETA {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Progress bars for the lab's experiments: one bar per phase they announce.
#[derive(Default)]
pub struct Bars(std::cell::RefCell<Option<ProgressBar>>);

impl foliokit_lab::Progress for Bars {
    fn begin(&self, total: usize, label: &str) {
        *self.0.borrow_mut() = Some(bar(total, label));
    }

    fn tick(&self) {
        if let Some(b) = &*self.0.borrow() {
            b.inc(1);
        }
    }

    fn end(&self) {
        if let Some(b) = self.0.borrow_mut().take() {
            b.finish_and_clear();
        }
    }
}
