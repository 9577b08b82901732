//! Each check runs in a `tower_window.check` span with its outcome and
//! source, and nothing the limiter emits (spans, events, at any level)
//! carries the key's subject or tenant.
#![allow(clippy::unwrap_used)]

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_window::fallback::FailOpen;
use tower_window::store::{Backend, Guard, Op};
use tower_window::{
    limit, BreakerConfig, CheckRequest, Decision, Limiter, MemoryStore, Quota, RetryConfig, Store,
    StoreError, StoreErrorKind, WindowKey,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Everything emitted, as text: one line per span (name, then every field
/// as created or recorded later), and one per event (level and fields).
#[derive(Clone, Default)]
struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl Capture {
    fn push(&self, line: String) {
        self.lines.lock().unwrap().push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields(String::new());
        span.record(&mut fields);
        let mut lines = self.lines.lock().unwrap();
        lines.push(format!("span {}{}", span.metadata().name(), fields.0));
        // Ids start at 1: the line's index + 1.
        Id::from_u64(lines.len() as u64)
    }

    fn record(&self, id: &Id, values: &Record<'_>) {
        let mut fields = Fields(String::new());
        values.record(&mut fields);
        let index = usize::try_from(id.into_u64() - 1).unwrap();
        self.lines.lock().unwrap()[index].push_str(&fields.0);
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.push(format!("event {}{}", event.metadata().level(), fields.0));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Fails every call, behind a network, with a message that names no key.
struct Down;

impl limit::Backend for Down {
    fn check<'a>(&'a self, guard: &mut Guard<'a>, _: CheckRequest<'a>) -> Op<'static, Decision> {
        guard.run(|| async { Err(StoreError::new(StoreErrorKind::Unavailable, "refused")) })
    }
}

#[tokio::test]
async fn spans_carry_outcome_and_source_but_never_the_key() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let key = WindowKey::new("secret-tenant", "secret-subject");

    let limiter = Limiter::builder(MemoryStore::new(), "1/1m".parse::<Quota>().unwrap()).build();
    assert!(limiter.check(&key, 1).await.unwrap().allowed());
    assert!(!limiter.check(&key, 1).await.unwrap().allowed());
    assert!(!limiter.check(&key, 1).await.unwrap().allowed());

    let down = Store::builder(Backend::windows(Down))
        .retry(RetryConfig::none())
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(1)
                .cooldown(Duration::from_secs(3600)),
        )
        .build();
    let degraded = Limiter::builder(down, "1/1m".parse::<Quota>().unwrap())
        .fallback(FailOpen::new())
        .build();
    assert!(degraded.check(&key, 1).await.unwrap().is_degraded());
    assert!(degraded.check(&key, 1).await.unwrap().is_degraded());

    let lines = capture.lines();
    let text = lines.join("\n");
    assert!(!text.contains("secret"), "{text}");
    let spans = lines
        .iter()
        .filter(|l| l.starts_with("span tower_window.check"))
        .count();
    assert_eq!(spans, 5, "{text}");
    for expected in [
        "outcome=\"allowed\" source=\"store\"",
        "outcome=\"denied\" source=\"store\"",
        "outcome=\"denied\" source=\"local_cache\"",
        "outcome=\"allowed\" source=\"fallback\"",
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("span tower_window.check") && l.contains(expected)),
            "{expected} not recorded in\n{text}"
        );
    }
    // One failed store call, logged at warn with its kind; the open breaker
    // calls nothing the second time.
    let warnings: Vec<_> = lines
        .iter()
        .filter(|l| l.starts_with(&format!("event {}", Level::WARN)))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(warnings[0].contains("kind=\"unavailable\""), "{text}");
}
