//! Where a command writes: results on stdout; warnings and progress on stderr, progress only when stderr
//! is a terminal and no `-o` was given, so that machine-readable output never mixes with it.

use std::io::Write;

use crate::Result;

/// The output streams of one command.
pub struct Streams<'a> {
    /// Results: text, or the `-o` document.
    pub out: &'a mut (dyn Write + Send),
    /// Warnings, and progress when [`Streams::shows_progress`].
    pub err: &'a mut (dyn Write + Send),
    progress: bool,
}

impl<'a> Streams<'a> {
    /// `out` and `err`; progress lines go to `err` when `err_is_terminal`.
    pub fn new(
        out: &'a mut (dyn Write + Send),
        err: &'a mut (dyn Write + Send),
        err_is_terminal: bool,
    ) -> Self {
        Self {
            out,
            err,
            progress: err_is_terminal,
        }
    }

    /// Drops progress lines from now on (for `-o json|yaml`).
    pub fn without_progress(mut self) -> Self {
        self.progress = false;
        self
    }

    /// Whether progress lines are shown.
    pub fn shows_progress(&self) -> bool {
        self.progress
    }

    /// A progress line on stderr, if progress is shown.
    pub fn progress(&mut self, line: &str) -> Result<()> {
        if self.progress {
            writeln!(self.err, "{line}")?;
            self.err.flush()?;
        }
        Ok(())
    }

    /// `warning: <text>` on stderr.
    pub fn warn(&mut self, text: &str) -> Result<()> {
        writeln!(self.err, "warning: {text}")?;
        Ok(())
    }

    /// A result line on stdout, flushed (a foreground command prints before it waits).
    pub fn result(&mut self, line: &str) -> Result<()> {
        writeln!(self.out, "{line}")?;
        self.out.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_only_on_a_terminal_and_never_with_output() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut streams = Streams::new(&mut out, &mut err, true);
        streams.progress("waiting").expect("write");
        streams.result("done").expect("write");
        let mut quiet = Streams::new(&mut out, &mut err, true).without_progress();
        assert!(!quiet.shows_progress());
        quiet.progress("hidden").expect("write");
        quiet.warn("careful").expect("write");
        let mut piped = Streams::new(&mut out, &mut err, false);
        piped.progress("hidden too").expect("write");
        assert_eq!(String::from_utf8(out).expect("utf-8"), "done\n");
        assert_eq!(
            String::from_utf8(err).expect("utf-8"),
            "waiting\nwarning: careful\n"
        );
    }
}
