//! Progress bars on stderr for long reads, hidden when stderr is not a terminal or the
//! input is small.

use std::io::IsTerminal;

pub fn bar(total: u64, message: &'static str) -> indicatif::ProgressBar {
    bar_over(total, 64 << 20, message)
}

/// A byte bar shown only for inputs of at least `min` bytes (slower passes show it for
/// smaller files).
pub fn bar_over(total: u64, min: u64, message: &'static str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() || total < min {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} ({eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(message);
    bar
}

/// A bar counting steps (runs of a comparison), hidden when stderr is not a terminal.
pub fn steps(total: u64, message: &'static str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(message);
    bar
}
