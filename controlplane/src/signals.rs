//! SIGTERM and SIGINT for the master's programs, caught from the moment they are installed:
//! install before opening any port, so a signal sent as soon as a port answers shuts the
//! program down cleanly (exit 0) instead of killing it with the default action.

/// SIGTERM and SIGINT, caught from the moment [`Signals::install`] returns.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    pub async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
