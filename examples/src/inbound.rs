//! The inbound worker: consumes a Redis stream of client messages with a
//! consumer group and applies each message's effect exactly once.
//!
//! * `XREADGROUP` reads new messages; `XACK` acknowledges each one once its
//!   effect is applied.
//! * On start the worker first finishes its own pending entries
//!   (`XREADGROUP ... 0`): a consumer name is stable across restarts
//!   (`--consumer`), so a restarted worker picks up where it died.
//! * `XAUTOCLAIM` takes over entries another consumer left pending longer
//!   than `--idle-timeout` (it crashed or hangs).
//! * The effect — one counter per room — is applied together with a dedup
//!   mark for the message id (`SET <dedup key> 1 NX PX <window>` and the
//!   `INCR` in one Lua script, on Redis's clock, both keys in the room's
//!   slot, both with a TTL). A redelivered or re-sent message therefore
//!   counts once. The mark and the effect must commit together: a separate
//!   dedup call followed by the effect loses the effect when the worker is
//!   killed between the two (the retry then sees the id as already seen).
//! * Transient failures (connection errors, timeouts) are retried with
//!   exponential backoff and jitter ([`backon`]); a message whose effect
//!   failed on its `--max-deliveries`-th delivery is copied to the
//!   dead-letter stream with the reason and acknowledged (atomically, in
//!   `MULTI`), and counted in `tower_window_inbound_dead_letters_total`.
//!
//! Messages are stream entries with the fields `id` (the client's message
//! id: 1 to 128 characters of `[A-Za-z0-9_.:-]`), `room` (a room name) and
//! `data`. An entry without a valid `id` or `room` can never succeed: it
//! fails every delivery and ends in the dead-letter stream.

use std::time::Duration;

use axum_window_ext::ws::rooms::RoomName;
use backon::{ExponentialBuilder, Retryable};
use clap::Parser;
use tower_window::store::redis::redis::{self, aio::MultiplexedConnection, Script, Value};

/// The worker's flags (each also read from a `TW_*` environment variable).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "inbound-worker",
    version,
    about = "Applies inbound room messages from a Redis stream, exactly once"
)]
pub struct WorkerArgs {
    /// Redis URL.
    #[arg(long, env = "TW_REDIS_URL")]
    pub redis_url: String,

    /// The inbound stream.
    #[arg(long, env = "TW_INBOUND_STREAM", default_value = "tw:inbound")]
    pub stream: String,

    /// The consumer group.
    #[arg(long, env = "TW_INBOUND_GROUP", default_value = "workers")]
    pub group: String,

    /// This worker's consumer name; keep it across restarts so a restarted
    /// worker finishes its own pending messages first.
    #[arg(long, env = "TW_CONSUMER")]
    pub consumer: String,

    /// Take over messages another consumer left pending this long (ms).
    #[arg(long, env = "TW_IDLE_TIMEOUT_MS", default_value = "30000")]
    pub idle_timeout_ms: u64,

    /// Deliveries after which a failing message goes to the dead letters.
    #[arg(long, env = "TW_MAX_DELIVERIES", default_value = "3",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_deliveries: u64,

    /// The dead-letter stream (default: the inbound stream + `:dead`).
    #[arg(long, env = "TW_DEAD_LETTER")]
    pub dead_letter: Option<String>,

    /// Messages read per batch.
    #[arg(long, env = "TW_BATCH", default_value = "16")]
    pub batch: usize,

    /// How long one XREADGROUP waits for new messages (ms).
    #[arg(long, env = "TW_BLOCK_MS", default_value = "200")]
    pub block_ms: u64,

    /// How long a message id is remembered for dedup (ms).
    #[arg(long, env = "TW_DEDUP_WINDOW_MS", default_value = "600000")]
    pub dedup_window_ms: u64,

    /// Prefix of the effect's keys (the room counters and dedup marks).
    #[arg(long, env = "TW_EFFECT_PREFIX", default_value = "tw:room-count:")]
    pub effect_prefix: String,

    /// Wait this long before each effect (ms), to make batches slow in
    /// tests and demos.
    #[arg(long, env = "TW_EFFECT_DELAY_MS", default_value = "0")]
    pub effect_delay_ms: u64,

    /// Serve Prometheus metrics on this address (`/metrics`).
    #[arg(long, env = "TW_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Stop once the stream has nothing new and nothing is pending in the
    /// group (for tests and batch runs).
    #[arg(long)]
    pub exit_when_idle: bool,
}

/// The counter key of `room` under `prefix` (the room is a hash tag).
pub fn counter_key(prefix: &str, room: &str) -> String {
    format!("{prefix}{{{room}}}:count")
}

fn dedup_key(prefix: &str, room: &str, id: &str) -> String {
    format!("{prefix}{{{room}}}:seen:{id}")
}

fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// The effect: mark the id, and count it only if the mark is new.
const EFFECT: &str = r"
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
";

/// How long a room counter lives after its last increment (ms).
const COUNTER_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// Why one delivery of a message failed.
#[derive(Debug)]
enum Failure {
    /// The message itself is bad: every delivery will fail.
    Invalid(&'static str),
    /// Redis failed (after retries).
    Redis(redis::RedisError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(reason) => f.write_str(reason),
            Self::Redis(error) => write!(f, "redis: {error}"),
        }
    }
}

/// One stream entry.
struct Entry {
    id: String,
    fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }
}

fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

fn string(value: &Value) -> Option<String> {
    bytes(value).and_then(|b| String::from_utf8(b).ok())
}

/// Entries of an `XRANGE`-shaped list: `[[id, [f, v, ...]], ...]`.
fn entries(value: &Value) -> Vec<Entry> {
    let Value::Array(items) = value else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else {
                return None;
            };
            let [id, Value::Array(fields)] = pair.as_slice() else {
                return None;
            };
            let fields = fields
                .chunks_exact(2)
                .filter_map(|kv| Some((string(&kv[0])?, bytes(&kv[1])?)))
                .collect();
            Some(Entry {
                id: string(id)?,
                fields,
            })
        })
        .collect()
}

/// The worker.
pub struct Worker {
    args: WorkerArgs,
    conn: MultiplexedConnection,
    effect: Script,
    dead_letter: String,
}

impl Worker {
    /// Connects and makes sure the group exists.
    pub async fn connect(args: WorkerArgs) -> Result<Self, redis::RedisError> {
        let client = crate::redis_client::no_delay_client(&args.redis_url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let created: Result<(), _> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&args.stream)
            .arg(&args.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        if let Err(error) = created {
            if error.code() != Some("BUSYGROUP") {
                return Err(error);
            }
        }
        let dead_letter = args
            .dead_letter
            .clone()
            .unwrap_or_else(|| format!("{}:dead", args.stream));
        Ok(Self {
            args,
            conn,
            effect: Script::new(EFFECT),
            dead_letter,
        })
    }

    /// Runs until the stream is drained (`--exit-when-idle`) or forever.
    pub async fn run(&mut self) -> Result<(), redis::RedisError> {
        // Our own pending entries first: we died with them. (Reading our
        // history from a cursor: entries that fail again stay pending.)
        let mut cursor = "0".to_owned();
        loop {
            let mine = self.read_group(&cursor, None).await?;
            let Some((last, _)) = mine.last() else { break };
            cursor = last.id.clone();
            tracing::info!(count = mine.len(), "finishing own pending messages");
            self.process(mine).await?;
        }
        let mut claim_from = "0-0".to_owned();
        loop {
            // Messages of consumers that went quiet.
            let (next, claimed) = self.autoclaim(&claim_from).await?;
            claim_from = next;
            let had_claims = !claimed.is_empty();
            if had_claims {
                tracing::info!(count = claimed.len(), "claimed idle messages");
                self.process(claimed).await?;
            }
            let fresh = self.read_group(">", Some(self.args.block_ms)).await?;
            let had_fresh = !fresh.is_empty();
            self.process(fresh).await?;
            if self.args.exit_when_idle && !had_claims && !had_fresh && self.idle().await? {
                return Ok(());
            }
        }
    }

    async fn idle(&mut self) -> Result<bool, redis::RedisError> {
        let pending: Value = redis::cmd("XPENDING")
            .arg(&self.args.stream)
            .arg(&self.args.group)
            .query_async(&mut self.conn)
            .await?;
        let Value::Array(summary) = pending else {
            return Ok(true);
        };
        Ok(matches!(summary.first(), Some(Value::Int(0))))
    }

    async fn read_group(
        &mut self,
        from: &str,
        block_ms: Option<u64>,
    ) -> Result<Vec<(Entry, u64)>, redis::RedisError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.args.group)
            .arg(&self.args.consumer)
            .arg("COUNT")
            .arg(self.args.batch.max(1));
        if let Some(block) = block_ms {
            cmd.arg("BLOCK").arg(block.max(1));
        }
        cmd.arg("STREAMS").arg(&self.args.stream).arg(from);
        let reply: Value = cmd.query_async(&mut self.conn).await?;
        let Value::Array(streams) = reply else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for stream in &streams {
            if let Value::Array(pair) = stream {
                if let Some(list) = pair.get(1) {
                    out.extend(entries(list));
                }
            }
        }
        let mut counted = Vec::with_capacity(out.len());
        for entry in out {
            let deliveries = if from == ">" {
                1
            } else {
                self.deliveries(&entry.id).await?
            };
            counted.push((entry, deliveries));
        }
        Ok(counted)
    }

    async fn autoclaim(
        &mut self,
        from: &str,
    ) -> Result<(String, Vec<(Entry, u64)>), redis::RedisError> {
        let reply: Value = redis::cmd("XAUTOCLAIM")
            .arg(&self.args.stream)
            .arg(&self.args.group)
            .arg(&self.args.consumer)
            .arg(self.args.idle_timeout_ms)
            .arg(from)
            .arg("COUNT")
            .arg(self.args.batch.max(1))
            .query_async(&mut self.conn)
            .await?;
        let Value::Array(parts) = reply else {
            return Ok(("0-0".into(), Vec::new()));
        };
        let next = parts
            .first()
            .and_then(string)
            .unwrap_or_else(|| "0-0".into());
        let claimed = parts.get(1).map(entries).unwrap_or_default();
        let mut counted = Vec::with_capacity(claimed.len());
        for entry in claimed {
            let deliveries = self.deliveries(&entry.id).await?;
            counted.push((entry, deliveries));
        }
        Ok((next, counted))
    }

    /// How many times the group delivered entry `id`.
    async fn deliveries(&mut self, id: &str) -> Result<u64, redis::RedisError> {
        let reply: Value = redis::cmd("XPENDING")
            .arg(&self.args.stream)
            .arg(&self.args.group)
            .arg(id)
            .arg(id)
            .arg(1)
            .query_async(&mut self.conn)
            .await?;
        let count = match reply {
            Value::Array(rows) => match rows.first() {
                Some(Value::Array(row)) => match row.get(3) {
                    Some(Value::Int(n)) => u64::try_from(*n).unwrap_or(1),
                    _ => 1,
                },
                _ => 1,
            },
            _ => 1,
        };
        Ok(count)
    }

    async fn process(&mut self, batch: Vec<(Entry, u64)>) -> Result<(), redis::RedisError> {
        for (entry, deliveries) in batch {
            if self.args.effect_delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(self.args.effect_delay_ms)).await;
            }
            match self.apply(&entry).await {
                Ok(applied) => {
                    metrics::counter!("tower_window_inbound_messages_total",
                        "outcome" => if applied { "applied" } else { "duplicate" })
                    .increment(1);
                    let _: i64 = redis::cmd("XACK")
                        .arg(&self.args.stream)
                        .arg(&self.args.group)
                        .arg(&entry.id)
                        .query_async(&mut self.conn)
                        .await?;
                }
                Err(failure) if deliveries >= self.args.max_deliveries => {
                    self.dead_letter(&entry, deliveries, &failure.to_string())
                        .await?;
                }
                Err(failure) => {
                    // Left pending: redelivered after the idle timeout.
                    tracing::warn!(id = %entry.id, deliveries, %failure, "message failed");
                    metrics::counter!("tower_window_inbound_messages_total", "outcome" => "failed")
                        .increment(1);
                }
            }
        }
        Ok(())
    }

    /// The effect, once per message id; transient Redis failures retried
    /// with exponential backoff and jitter. `Ok(false)`: a duplicate.
    async fn apply(&self, entry: &Entry) -> Result<bool, Failure> {
        let room = entry.field("room").ok_or(Failure::Invalid("no room"))?;
        if !RoomName::is_valid(room) {
            return Err(Failure::Invalid("invalid room"));
        }
        let id = entry.field("id").ok_or(Failure::Invalid("no message id"))?;
        if !valid_id(id) {
            return Err(Failure::Invalid("invalid message id"));
        }
        let prefix = &self.args.effect_prefix;
        let (seen, counter) = (dedup_key(prefix, room, id), counter_key(prefix, room));
        let window = self.args.dedup_window_ms.max(1);
        let attempt = || {
            let mut conn = self.conn.clone();
            let mut call = self.effect.prepare_invoke();
            call.key(&seen)
                .key(&counter)
                .arg(window)
                .arg(COUNTER_TTL_MS);
            async move { call.invoke_async::<i64>(&mut conn).await }
        };
        let applied = attempt
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(20))
                    .with_max_delay(Duration::from_secs(1))
                    .with_max_times(4)
                    .with_jitter(),
            )
            .when(|error: &redis::RedisError| {
                error.is_io_error() || error.is_timeout() || error.is_connection_dropped()
            })
            .await
            .map_err(Failure::Redis)?;
        Ok(applied == 1)
    }

    /// Copies the entry to the dead letters with the reason and acks it,
    /// in one transaction.
    async fn dead_letter(
        &mut self,
        entry: &Entry,
        deliveries: u64,
        reason: &str,
    ) -> Result<(), redis::RedisError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let mut add = redis::cmd("XADD");
        add.arg(&self.dead_letter)
            .arg("MAXLEN")
            .arg("~")
            .arg(100_000)
            .arg("*")
            .arg("original_id")
            .arg(&entry.id)
            .arg("reason")
            .arg(reason)
            .arg("deliveries")
            .arg(deliveries)
            .arg("consumer")
            .arg(&self.args.consumer);
        for (name, value) in &entry.fields {
            add.arg(format!("field:{name}")).arg(value.as_slice());
        }
        pipe.add_command(add).ignore();
        pipe.cmd("XACK")
            .arg(&self.args.stream)
            .arg(&self.args.group)
            .arg(&entry.id)
            .ignore();
        let () = pipe.query_async(&mut self.conn).await?;
        metrics::counter!("tower_window_inbound_dead_letters_total").increment(1);
        tracing::warn!(id = %entry.id, deliveries, reason, "message sent to the dead letters");
        Ok(())
    }
}
