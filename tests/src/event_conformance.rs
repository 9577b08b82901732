//! The event-window conformance suite: one set of scenarios that every
//! event backend ([`events::Backend`]) must pass with the same answers (memory, Redis, Redis
//! Cluster).
//!
//! Scenarios drive an [`EventWindow`] with a [`ManualClock`] (the store
//! must take its time from it) and check ids, order, fields, pages and
//! every resume verdict against what the contract in
//! `tower_window::events` says. Windows are short on the manual clock but
//! every TTL the stores set is at least a minute of real time, so a store
//! that expires keys in real time (Redis) loses nothing while a scenario
//! runs. Plug a store in with:
//!
//! ```text
//! tower_window_tests::event_conformance_tests!(MyFactory::new());
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_window::events::{
    self, Event, EventId, EventRequest, EventWindow, Position, Resume, ResyncReason, Retention,
    MAX_BATCH, MAX_ID_PART, MAX_PAGE,
};
use tower_window::store::{self, Guard};
use tower_window::{limit, ManualClock, MemoryStore, Store, StoreErrorKind};

use crate::conformance::START;
use crate::shared::Shared;

/// Makes the store under test, one per scenario.
pub trait EventStoreFactory {
    /// The store under test.
    type Store: events::Backend + limit::Backend;

    /// A store whose "now" is `clock`.
    fn make(&self, clock: ManualClock) -> impl Future<Output = Self::Store> + Send;
}

/// Makes [`MemoryStore`]s with the given clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryEventFactory;

impl EventStoreFactory for MemoryEventFactory {
    type Store = MemoryStore;

    fn make(&self, clock: ManualClock) -> impl Future<Output = MemoryStore> + Send {
        std::future::ready(MemoryStore::builder().clock(clock).build())
    }
}

/// Expands to one `#[tokio::test]` per event-window scenario.
#[macro_export]
macro_rules! event_conformance_tests {
    ($factory:expr) => {
        $crate::event_conformance_tests!(@each $factory;
            appended_events_come_back_in_order_with_their_fields,
            reads_page_with_an_exclusive_start,
            a_reader_that_never_received_an_event_resumes,
            events_past_the_window_make_a_resume_too_old,
            events_beyond_max_len_make_a_resume_too_old,
            another_epoch_is_never_recovered,
            a_position_ahead_of_the_head_is_answered_alone,
            a_position_absent_from_the_history_is_never_recovered,
            hostile_positions_change_nothing,
            windows_are_independent,
            invalid_requests_are_typed_errors,
            trimming_keeps_the_length_bounded_in_a_long_run,
            a_batch_appends_in_order_like_single_appends,
            a_batch_is_trimmed_like_single_appends,
            invalid_batches_are_typed_errors_and_append_nothing,
        );
    };
    (@each $factory:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $scenario() {
                let factory = $factory;
                $crate::event_conformance::$scenario(&factory).await;
            }
        )*
    };
}

fn unique(scenario: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "evconf:{scenario}:{}:{nanos}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

struct Run {
    events: EventWindow,
    /// The same store, for calls that bypass the window's checks.
    store: Arc<dyn events::Backend>,
    clock: ManualClock,
    key: String,
}

impl Run {
    async fn start<F: EventStoreFactory>(
        factory: &F,
        scenario: &str,
        window: Duration,
        max_len: u64,
    ) -> Self {
        let clock = ManualClock::new(START);
        let backend = Arc::new(factory.make(clock.clone()).await);
        let store = Store::bare(
            store::Backend::windows(Shared::of(&backend)).with_events(Shared::of(&backend)),
        );
        let retention = Retention::new(window, max_len).expect("a retention");
        Self {
            store: Arc::clone(&backend) as Arc<dyn events::Backend>,
            events: EventWindow::new(store, retention),
            clock,
            key: unique(scenario),
        }
    }

    async fn append(&self, data: &str) -> EventId {
        self.append_to(&self.key, data).await
    }

    async fn append_to(&self, key: &str, data: &str) -> EventId {
        self.events
            .append(key, &[("data", data.as_bytes())])
            .await
            .expect("append")
            .id
    }

    async fn head(&self) -> Position {
        self.events.position(&self.key).await.expect("position")
    }

    async fn since(&self, from: &Position, limit: u32) -> Resume {
        self.events
            .since(&self.key, from, limit)
            .await
            .expect("since")
    }

    async fn resume(&self, from: &Position) -> Resume {
        self.events
            .resume(&self.key, from, 3)
            .await
            .expect("resume")
    }
}

fn at(position: &Position, id: EventId) -> Position {
    Position::new(position.epoch.clone(), Some(id))
}

fn data(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| String::from_utf8_lossy(e.field("data").expect("a data field")).into_owned())
        .collect()
}

fn recovered(resume: Resume) -> Vec<Event> {
    match resume {
        Resume::Recovered(events) => events,
        Resume::Resync(reason) => panic!("expected recovered, got resync {reason}"),
    }
}

/// Ids grow; fields come back as appended (binary and empty values too).
pub async fn appended_events_come_back_in_order_with_their_fields<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "order", Duration::from_secs(60), 1000).await;
    let start = run.head().await;
    assert_eq!(start.last_id, None, "a new window has no last event");
    let a = run.append("a").await;
    run.clock.advance(Duration::from_millis(5));
    let b = run.append("b").await;
    let c = run.append("c").await; // same millisecond: next sequence
    assert!(a < b && b < c, "{a} {b} {c}");
    assert_eq!(a.millis(), START / 1000, "ids come from the store's clock");
    assert_eq!(
        (b.millis(), c.millis(), c.seq()),
        (a.millis() + 5, a.millis() + 5, b.seq() + 1)
    );
    let rich = run
        .events
        .append(
            &run.key,
            &[("bin", &[0u8, 255, 10][..]), ("empty", b""), ("k", b"v")],
        )
        .await
        .expect("append");
    assert_eq!(rich.epoch, start.epoch, "appends keep the epoch");
    let all = recovered(run.since(&start, 100).await);
    assert_eq!(
        all.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![a, b, c, rich.id]
    );
    assert_eq!(data(&all[..3]), ["a", "b", "c"]);
    let fields: Vec<(&str, &[u8])> = all[3]
        .fields
        .iter()
        .map(|(n, v)| (n.as_str(), &v[..]))
        .collect();
    assert_eq!(
        fields,
        vec![
            ("bin", &[0u8, 255, 10][..]),
            ("empty", &b""[..]),
            ("k", &b"v"[..])
        ]
    );
    let head = run.head().await;
    assert_eq!((head.epoch, head.last_id), (start.epoch, Some(rich.id)));
}

/// `since` starts after the position (exclusive) and pages; `resume`
/// gathers every page.
pub async fn reads_page_with_an_exclusive_start<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "pages", Duration::from_secs(60), 1000).await;
    let start = run.head().await;
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(run.append(&i.to_string()).await);
    }
    let mut at_ = start.clone();
    let mut sizes = Vec::new();
    let mut seen = Vec::new();
    loop {
        let page = recovered(run.since(&at_, 3).await);
        sizes.push(page.len());
        if page.is_empty() {
            break;
        }
        at_ = at(&start, page.last().expect("a page").id);
        seen.extend(page.iter().map(|e| e.id));
    }
    assert_eq!(sizes, [3, 3, 1, 0]);
    assert_eq!(seen, ids);
    assert_eq!(
        data(&recovered(run.resume(&start).await)),
        ["0", "1", "2", "3", "4", "5", "6"]
    );
    assert_eq!(
        data(&recovered(run.since(&at(&start, ids[4]), 10).await)),
        ["5", "6"]
    );
    assert!(recovered(run.since(&at(&start, ids[6]), 10).await).is_empty());
}

/// A reader given only the welcome position (no event yet) gets every
/// event appended since.
pub async fn a_reader_that_never_received_an_event_resumes<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "fresh", Duration::from_secs(60), 1000).await;
    let joined = run.head().await;
    assert!(recovered(run.since(&joined, 10).await).is_empty());
    run.append("x").await;
    run.append("y").await;
    assert_eq!(data(&recovered(run.resume(&joined).await)), ["x", "y"]);
    // A join after events: positioned at the last one.
    let later = run.head().await;
    run.append("z").await;
    assert_eq!(data(&recovered(run.resume(&later).await)), ["z"]);
}

/// A position whose next event is past the window is too old; later
/// positions still recover, without the events past the window.
pub async fn events_past_the_window_make_a_resume_too_old<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "time", Duration::from_secs(10), 1000).await;
    let start = run.head().await;
    let a = run.append("a").await; // t = 0
    run.clock.advance(Duration::from_secs(5));
    let b = run.append("b").await; // t = 5
    run.clock.advance(Duration::from_secs(6));
    let c = run.append("c").await; // t = 11: a is past the window
    assert_eq!(
        run.since(&start, 10).await,
        Resume::Resync(ResyncReason::TooOld)
    );
    assert_eq!(
        data(&recovered(run.since(&at(&start, a), 10).await)),
        ["b", "c"]
    );
    // Time alone (no append) moves the window too.
    run.clock.advance(Duration::from_secs(9)); // t = 20: b is past it
    assert_eq!(
        run.since(&at(&start, a), 10).await,
        Resume::Resync(ResyncReason::TooOld)
    );
    assert_eq!(data(&recovered(run.since(&at(&start, b), 10).await)), ["c"]);
    assert!(recovered(run.since(&at(&start, c), 10).await).is_empty());
    run.clock.advance(Duration::from_secs(30)); // everything is past it
    assert_eq!(
        run.since(&at(&start, b), 10).await,
        Resume::Resync(ResyncReason::TooOld)
    );
    assert!(
        recovered(run.since(&at(&start, c), 10).await).is_empty(),
        "nothing after c was lost"
    );
}

/// Only the newest `max_len` events are given; a position before them is
/// too old.
pub async fn events_beyond_max_len_make_a_resume_too_old<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "len", Duration::from_secs(3600), 5).await;
    let start = run.head().await;
    let mut ids = Vec::new();
    for i in 0..300 {
        ids.push(run.append(&i.to_string()).await);
    }
    assert_eq!(
        run.since(&start, 10).await,
        Resume::Resync(ResyncReason::TooOld)
    );
    assert_eq!(
        run.since(&at(&start, ids[293]), 10).await,
        Resume::Resync(ResyncReason::TooOld)
    );
    assert_eq!(
        data(&recovered(run.since(&at(&start, ids[294]), 10).await)),
        ["295", "296", "297", "298", "299"]
    );
    let len = run.events.len(&run.key).await.expect("len");
    assert!((5..=105).contains(&len), "kept {len} events for max_len 5");
}

/// A position of another epoch resyncs with `epoch_changed`, whatever its id.
pub async fn another_epoch_is_never_recovered<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "epoch", Duration::from_secs(60), 1000).await;
    let head = run.head().await;
    let a = run.append("a").await;
    let stranger = Position::parse("0ff0ff", "").expect("a position");
    assert_eq!(
        run.since(&stranger, 10).await,
        Resume::Resync(ResyncReason::EpochChanged)
    );
    let stranger = Position::parse("0ff0ff", &a.to_string()).expect("a position");
    assert_eq!(
        run.resume(&stranger).await,
        Resume::Resync(ResyncReason::EpochChanged)
    );
    assert_eq!(
        run.head().await.epoch,
        head.epoch,
        "a stranger changes nothing"
    );
}

/// A position after the window's last event (a reader that claims events
/// the window never had, or had and lost in a restore) is answered
/// `ahead` for that reader alone: the window keeps its epoch, and an
/// honest reader still recovers exactly its gap, however often such
/// positions are sent (issue 22, defect 3).
pub async fn a_position_ahead_of_the_head_is_answered_alone<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "ahead", Duration::from_secs(60), 1000).await;
    let head = run.head().await;
    let a = run.append("a").await;
    let reader = at(&head, a);
    let id = |ms: u64, seq: u64| EventId::new(ms, seq).expect("an id");
    for round in 0..3 {
        let last = run.head().await.after();
        let hostile = [
            id(last.millis(), last.seq() + 1),
            id(last.millis() + 1000, 0),
            id(last.millis(), MAX_ID_PART),
            id(MAX_ID_PART, 0),
            id(MAX_ID_PART, MAX_ID_PART),
        ];
        for ahead in hostile {
            assert_eq!(
                run.since(&at(&head, ahead), 10).await,
                Resume::Resync(ResyncReason::Ahead),
                "round {round}: {ahead} is ahead of {last}"
            );
            assert_eq!(
                run.resume(&at(&head, ahead)).await,
                Resume::Resync(ResyncReason::Ahead),
                "round {round}: {ahead}"
            );
        }
        assert_eq!(
            run.head().await,
            Position::new(head.epoch.clone(), Some(last)),
            "round {round}: the window is as it was"
        );
        run.append(&round.to_string()).await;
    }
    assert_eq!(
        data(&recovered(run.resume(&reader).await)),
        ["0", "1", "2"],
        "the honest reader recovers exactly its gap"
    );
    assert_eq!(run.head().await.epoch, head.epoch);
}

/// A position the window's history does not hold where the reader says
/// (an id between two events: the reader's event was lost in a restore or
/// rollback that kept the epoch, or never existed) is never `recovered`,
/// also once events follow it: the first kept event after it followed
/// another event, so events after the position may be lost (issue 22,
/// defect 4; invariant 10). Real positions around it still recover.
pub async fn a_position_absent_from_the_history_is_never_recovered<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "absent", Duration::from_secs(60), 1000).await;
    let head = run.head().await;
    let a = run.append("a").await;
    run.clock.advance(Duration::from_millis(10));
    let b = run.append("b").await;
    assert!(b.millis() >= a.millis() + 10, "{a} {b}");
    let absent = [
        EventId::new(a.millis() + 5, 0).expect("an id"),
        EventId::new(a.millis(), a.seq() + 1).expect("an id"),
        EventId::new(b.millis() - 1, 7).expect("an id"),
    ];
    for position in absent {
        assert_eq!(
            run.since(&at(&head, position), 10).await,
            Resume::Resync(ResyncReason::TooOld),
            "b followed {a}, not {position}: never recovered"
        );
        assert_eq!(
            run.resume(&at(&head, position)).await,
            Resume::Resync(ResyncReason::TooOld),
            "{position}"
        );
    }
    assert_eq!(data(&recovered(run.since(&at(&head, a), 10).await)), ["b"]);
    assert_eq!(data(&recovered(run.since(&head, 10).await)), ["a", "b"]);
    let zero = at(&head, EventId::ZERO);
    assert_eq!(
        data(&recovered(run.since(&zero, 10).await)),
        ["a", "b"],
        "0-0 is the position before the first event"
    );
    assert!(recovered(run.since(&at(&head, b), 10).await).is_empty());
    let now = run.head().await;
    assert_eq!((now.epoch, now.last_id), (head.epoch, Some(b)));
}

/// Every hostile position gets its own typed answer and changes nothing:
/// ids at the largest parts, `0-0` once events before it are trimmed, the
/// epoch of another window, ids of another epoch. After all of them the
/// window's epoch and head are unchanged and a reader recovers its gap.
pub async fn hostile_positions_change_nothing<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "hostile", Duration::from_secs(60), 3).await;
    let other = format!("{}:other", run.key);
    let theirs = run.events.position(&other).await.expect("position");
    run.append_to(&other, "theirs").await;
    let head = run.head().await;
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(run.append(&i.to_string()).await);
    }
    let reader = at(&head, ids[3]);
    let max = EventId::new(MAX_ID_PART, MAX_ID_PART).expect("an id");
    let cases = [
        (at(&head, max), Resume::Resync(ResyncReason::Ahead)),
        // 0-0 and "no event yet": the first events are trimmed (max_len 3).
        (
            at(&head, EventId::ZERO),
            Resume::Resync(ResyncReason::TooOld),
        ),
        (head.clone(), Resume::Resync(ResyncReason::TooOld)),
        // Another window's epoch, with ids of either window.
        (
            at(&theirs, ids[3]),
            Resume::Resync(ResyncReason::EpochChanged),
        ),
        (at(&theirs, max), Resume::Resync(ResyncReason::EpochChanged)),
        (
            Position::new(theirs.epoch.clone(), None),
            Resume::Resync(ResyncReason::EpochChanged),
        ),
        (
            Position::parse("0", "0-0").expect("a position"),
            Resume::Resync(ResyncReason::EpochChanged),
        ),
        (
            Position::parse(&"f".repeat(64), &format!("{MAX_ID_PART}-0")).expect("a position"),
            Resume::Resync(ResyncReason::EpochChanged),
        ),
    ];
    for round in 0..2 {
        for (position, expected) in &cases {
            assert_eq!(
                &run.since(position, 10).await,
                expected,
                "round {round}: {position:?}"
            );
            assert_eq!(
                &run.resume(position).await,
                expected,
                "round {round}: {position:?}"
            );
        }
    }
    assert_eq!(
        run.head().await,
        Position::new(head.epoch.clone(), Some(ids[5]))
    );
    assert_eq!(data(&recovered(run.resume(&reader).await)), ["4", "5"]);
    let theirs_now = run.events.position(&other).await.expect("position");
    assert_eq!(
        theirs_now.epoch, theirs.epoch,
        "the other window is untouched"
    );
    assert_eq!(
        data(&recovered(
            run.events
                .resume(&other, &theirs, 10)
                .await
                .expect("resume")
        )),
        ["theirs"]
    );
}

/// Two keys: two windows, two epochs.
pub async fn windows_are_independent<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "independent", Duration::from_secs(60), 1000).await;
    let other = format!("{}:other", run.key);
    let mine = run.head().await;
    let theirs = run.events.position(&other).await.expect("position");
    assert_ne!(mine.epoch, theirs.epoch);
    run.append("mine").await;
    run.append_to(&other, "theirs").await;
    assert_eq!(data(&recovered(run.resume(&mine).await)), ["mine"]);
    let theirs_events = recovered(
        run.events
            .resume(&other, &theirs, 10)
            .await
            .expect("resume"),
    );
    assert_eq!(data(&theirs_events), ["theirs"]);
    assert_eq!(
        run.since(&theirs, 10).await,
        Resume::Resync(ResyncReason::EpochChanged)
    );
}

fn kind<T>(result: Result<T, tower_window::StoreError>) -> Result<(), StoreErrorKind> {
    result.map(|_| ()).map_err(|e| e.kind())
}

/// Bad requests are typed errors and change nothing.
pub async fn invalid_requests_are_typed_errors<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "invalid", Duration::from_secs(60), 1000).await;
    let head = run.head().await;
    assert_eq!(
        kind(run.events.append(&run.key, &[]).await),
        Err(StoreErrorKind::InvalidRequest)
    );
    assert_eq!(
        kind(run.events.append(&run.key, &[("", b"x")]).await),
        Err(StoreErrorKind::InvalidRequest)
    );
    let many: Vec<(&str, &[u8])> = (0..33).map(|_| ("f", &b"x"[..])).collect();
    assert_eq!(
        kind(run.events.append(&run.key, &many).await),
        Err(StoreErrorKind::InvalidRequest)
    );
    assert_eq!(
        kind(run.events.since(&run.key, &head, 0).await),
        Err(StoreErrorKind::InvalidRequest)
    );
    assert_eq!(
        kind(run.events.since(&run.key, &head, 10_001).await),
        Err(StoreErrorKind::InvalidRequest)
    );
    // The store itself refuses the same, for callers that bypass the
    // window: every backend alike, and no script sees a page or an event
    // it cannot handle in bounded work.
    let request = EventRequest::new(run.key.as_bytes(), run.events.retention(), 7);
    for limit in [0, MAX_PAGE + 1, u32::MAX] {
        assert_eq!(
            kind(
                run.store
                    .read(&mut Guard::bare(), request, &head, limit)
                    .await
            ),
            Err(StoreErrorKind::InvalidRequest),
            "limit {limit}"
        );
    }
    let lots: Vec<(&str, &[u8])> = (0..5000).map(|_| ("f", &b"x"[..])).collect();
    let long_name = "n".repeat(65);
    for fields in [&lots[..], &[][..], &[(long_name.as_str(), &b"x"[..])][..]] {
        assert_eq!(
            kind(run.store.append(&mut Guard::bare(), request, fields).await),
            Err(StoreErrorKind::InvalidRequest),
            "{} fields",
            fields.len()
        );
    }
    assert_eq!(run.head().await, head, "nothing was appended");
    // Keys with any bytes are fine (and distinct).
    let odd = format!("{}:{{}}\u{0}\u{e9}", run.key);
    run.append_to(&odd, "odd").await;
    assert_eq!(run.events.len(&odd).await.expect("len"), 1);
    assert_eq!(run.events.len(&run.key).await.expect("len"), 0);
}

/// A long run with a short window: the stored length stays bounded by the
/// events inside the window (plus the lazy trimming's slack), and the
/// newest events are all there.
pub async fn trimming_keeps_the_length_bounded_in_a_long_run<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "long", Duration::from_secs(1), 100_000).await;
    let start = run.head().await;
    let mut max_len = 0;
    let mut last = Vec::new();
    for i in 0..3000 {
        last.push(run.append(&i.to_string()).await);
        run.clock.advance(Duration::from_millis(10));
        if i % 100 == 99 {
            max_len = max_len.max(run.events.len(&run.key).await.expect("len"));
        }
    }
    // 100 events per second of window; trimming with `~` drops whole
    // stream nodes (100 entries each by default), so at most ~2 windows.
    assert!(max_len >= 100, "the window held {max_len} events");
    assert!(
        max_len <= 250,
        "XLEN reached {max_len} with 100 events per window"
    );
    assert_eq!(
        run.since(&start, 10).await,
        Resume::Resync(ResyncReason::TooOld)
    );
    // The last 100 appends are inside the window (now = last + 10 ms).
    let newest = recovered(run.resume(&at(&start, last[2899])).await);
    assert_eq!(newest.len(), 100);
    assert_eq!(newest.last().map(|e| e.id), last.last().copied());
}

/// A batch (`append_many`) appends its events in order, as single appends
/// at the same instant would: ids grow within it and across it, each
/// event follows the one before it (a resume from inside the batch is
/// recovered, page by page), and fields come back as given.
pub async fn a_batch_appends_in_order_like_single_appends<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "batch", Duration::from_secs(60), 1000).await;
    let joined = run.head().await;
    let first = run.append("a").await;
    let batch: [&[(&str, &[u8])]; 4] = [
        &[("data", b"b")],
        &[("data", b"c"), ("bin", &[0, 0xff, b'\n'])],
        &[("data", b"")],
        &[("data", b"e")],
    ];
    let appended = run
        .events
        .append_many(&run.key, &batch)
        .await
        .expect("append_many");
    assert_eq!(appended.len(), 4);
    assert!(appended.iter().all(|a| a.epoch == joined.epoch));
    let mut ids = vec![first];
    ids.extend(appended.iter().map(|a| a.id));
    let last = run.append("f").await;
    ids.push(last);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids grow: {ids:?}");
    let all = recovered(run.resume(&joined).await);
    assert_eq!(data(&all), ["a", "b", "c", "", "e", "f"]);
    assert_eq!(all.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    assert_eq!(
        all[2].field("bin").map(|v| &v[..]),
        Some(&[0, 0xff, b'\n'][..])
    );
    // From every event inside the batch: exactly the rest, in order.
    for (i, id) in ids.iter().enumerate() {
        let rest = recovered(run.resume(&at(&joined, *id)).await);
        assert_eq!(rest.iter().map(|e| e.id).collect::<Vec<_>>(), ids[i + 1..]);
    }
    // Another batch later, of the most events allowed, and on the clock's
    // next millisecond too.
    run.clock.advance(Duration::from_millis(1));
    let values: Vec<String> = (0..MAX_BATCH).map(|i| format!("m{i}")).collect();
    let fields: Vec<[(&str, &[u8]); 1]> = values.iter().map(|v| [("data", v.as_bytes())]).collect();
    let batch: Vec<&[(&str, &[u8])]> = fields.iter().map(|f| &f[..]).collect();
    let appended = run
        .events
        .append_many(&run.key, &batch)
        .await
        .expect("a full batch");
    assert_eq!(appended.len(), MAX_BATCH);
    let rest = recovered(run.resume(&at(&joined, last)).await);
    assert_eq!(data(&rest), values);
    assert_eq!(
        rest.iter().map(|e| e.id).collect::<Vec<_>>(),
        appended.iter().map(|a| a.id).collect::<Vec<_>>()
    );
    assert_eq!(
        run.events.len(&run.key).await.expect("len"),
        6 + MAX_BATCH as u64
    );
}

/// A batch longer than `max_len` keeps the newest events: a reader from
/// before it resyncs `too_old`, a reader from inside what is kept is
/// recovered.
pub async fn a_batch_is_trimmed_like_single_appends<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "batchtrim", Duration::from_secs(60), 3).await;
    let joined = run.head().await;
    let values: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
    let fields: Vec<[(&str, &[u8]); 1]> = values.iter().map(|v| [("data", v.as_bytes())]).collect();
    let batch: Vec<&[(&str, &[u8])]> = fields.iter().map(|f| &f[..]).collect();
    let appended = run
        .events
        .append_many(&run.key, &batch)
        .await
        .expect("append_many");
    assert_eq!(
        run.resume(&joined).await,
        Resume::Resync(ResyncReason::TooOld)
    );
    let kept = recovered(run.resume(&at(&joined, appended[36].id)).await);
    assert_eq!(data(&kept), ["t37", "t38", "t39"]);
}

/// One event's fields.
type Fields<'a> = &'a [(&'a str, &'a [u8])];

/// A batch out of bounds (no event, more than `MAX_BATCH`, an event with
/// bad fields anywhere in it) is a typed error, from the window and from
/// the store itself alike, and appends nothing at all.
pub async fn invalid_batches_are_typed_errors_and_append_nothing<F: EventStoreFactory>(f: &F) {
    let run = Run::start(f, "batchinvalid", Duration::from_secs(60), 1000).await;
    run.append("a").await;
    let head = run.head().await;
    let one: &[(&str, &[u8])] = &[("data", b"x")];
    let too_many = vec![one; MAX_BATCH + 1];
    let lots = vec![one; 5000];
    let fields: Vec<(&str, &[u8])> = (0..33).map(|_| ("f", &b"x"[..])).collect();
    let long_name = "n".repeat(65);
    let long: &[(&str, &[u8])] = &[(long_name.as_str(), b"x")];
    let bad: [Vec<Fields<'_>>; 6] = [
        Vec::new(),
        too_many,
        lots,
        vec![one, &[], one],
        vec![one, one, &fields],
        vec![long, one],
    ];
    let request = EventRequest::new(run.key.as_bytes(), run.events.retention(), 7);
    for batch in &bad {
        assert_eq!(
            kind(run.events.append_many(&run.key, batch).await),
            Err(StoreErrorKind::InvalidRequest),
            "{} events",
            batch.len()
        );
        assert_eq!(
            kind(
                run.store
                    .append_many(&mut Guard::bare(), request, batch)
                    .await
            ),
            Err(StoreErrorKind::InvalidRequest),
            "{} events, to the store",
            batch.len()
        );
    }
    assert_eq!(run.head().await, head, "nothing was appended");
    assert_eq!(run.events.len(&run.key).await.expect("len"), 1);
}
