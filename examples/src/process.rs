//! What every example binary does around its server: logging to stderr,
//! exit codes with a plain `error:` message, and shutdown on a signal.

use std::io::IsTerminal;
use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

/// The exit code of a configuration a binary refuses (clap's, for a flag it
/// cannot parse).
pub const EXIT_CONFIG: u8 = 2;
/// The exit code of a failure after the configuration was accepted.
pub const EXIT_RUNTIME: u8 = 1;

/// Logs to stderr at `RUST_LOG`'s filter (`info` by default), in colour
/// only on a terminal.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Prints `message` as `error: ...`, one line per line of it (never the
/// `Debug` form `main` returning an error would print), and gives `code`.
pub fn fail(message: &dyn std::fmt::Display, code: u8) -> ExitCode {
    let text = message.to_string();
    let mut lines = text.lines();
    eprintln!("error: {}", lines.next().unwrap_or_default());
    for line in lines {
        eprintln!("{line}");
    }
    ExitCode::from(code)
}

/// Resolves on Ctrl-C (and SIGTERM on Unix).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
