//! [`AuditRecord`]: one audited decision or admin change, and its fields
//! in a log entry.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use crate::{Decision, DecisionSource, FallbackReason, WindowKey};

/// The longest subject kept in a record, in bytes (a longer one is cut at a
/// character boundary): records are bounded whatever a client sends.
pub const MAX_SUBJECT_LEN: usize = 256;

/// What happened, in one [`AuditRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuditOutcome {
    /// The request was admitted (a sampled admission, or a degraded one).
    Allowed,
    /// The request was refused.
    Denied,
    /// A [shadow](crate::Quota::shadowed) quota would have refused it; it
    /// was admitted.
    ShadowDenied,
    /// An operator changed the tenant.
    Admin(AdminAction),
}

/// An operator's change to a tenant, in an [`AuditRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AdminAction {
    /// The tenant's spec was put (created or replaced).
    Put,
    /// The tenant's windows were reset.
    Reset,
    /// The tenant was deleted (closed).
    Delete,
    /// The tenants file was reloaded.
    Reload,
}

impl AuditOutcome {
    /// Every outcome's name, as [`as_str`](Self::as_str) writes it.
    pub const NAMES: [&'static str; 7] = [
        "allowed",
        "denied",
        "shadow_denied",
        "admin_put",
        "admin_reset",
        "admin_delete",
        "admin_reload",
    ];

    /// A short, stable name (log fields, query filters, JSON).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::ShadowDenied => "shadow_denied",
            Self::Admin(AdminAction::Put) => "admin_put",
            Self::Admin(AdminAction::Reset) => "admin_reset",
            Self::Admin(AdminAction::Delete) => "admin_delete",
            Self::Admin(AdminAction::Reload) => "admin_reload",
        }
    }
}

impl std::str::FromStr for AuditOutcome {
    type Err = UnknownName;

    fn from_str(name: &str) -> Result<Self, UnknownName> {
        Ok(match name {
            "allowed" => Self::Allowed,
            "denied" => Self::Denied,
            "shadow_denied" => Self::ShadowDenied,
            "admin_put" => Self::Admin(AdminAction::Put),
            "admin_reset" => Self::Admin(AdminAction::Reset),
            "admin_delete" => Self::Admin(AdminAction::Delete),
            "admin_reload" => Self::Admin(AdminAction::Reload),
            _ => return Err(UnknownName),
        })
    }
}

impl fmt::Display for AuditOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`AuditOutcome`]'s or [`DecisionSource`]'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a known name")]
pub struct UnknownName;

/// One audited decision or admin change.
///
/// `at_micros` is the deciding clock's reading (the store's: Redis's
/// `TIME` for a decision Redis made); `id` is the entry's position in the
/// log once written (`<ms>-<seq>` on Redis, a stream entry id), empty
/// before.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditRecord {
    /// The entry's id in the log (empty until written).
    pub id: String,
    /// When it was decided, in microseconds since the Unix epoch.
    pub at_micros: u64,
    /// The tenant.
    pub tenant: String,
    /// The subject (at most [`MAX_SUBJECT_LEN`] bytes); empty for a
    /// tenant-wide admin change.
    pub subject: String,
    /// The policy's name (empty for an admin change).
    pub policy: String,
    /// The deciding quota's name (for a shadow denial, the shadow quota's).
    pub quota: String,
    /// What happened.
    pub outcome: AuditOutcome,
    /// The deciding quota's remaining units.
    pub remaining: u32,
    /// Who decided (an admin change: [`DecisionSource::Store`]).
    pub source: DecisionSource,
    /// The node that recorded it (its audit log's id).
    pub node: String,
}

impl AuditRecord {
    /// The record of an admin change to `tenant`.
    pub(crate) fn of_change(tenant: &str, action: AdminAction, at_micros: u64, node: &str) -> Self {
        Self {
            id: String::new(),
            at_micros,
            tenant: tenant.to_owned(),
            subject: String::new(),
            policy: String::new(),
            quota: String::new(),
            outcome: AuditOutcome::Admin(action),
            remaining: 0,
            source: DecisionSource::Store,
            node: node.to_owned(),
        }
    }

    /// The record as its log entry's one field, `r`: the time (µs),
    /// tenant, subject, policy, quota, outcome, remaining, source and node,
    /// each as `<length in bytes>:<text>` (any text goes, nothing to
    /// escape), so a batch is one argument per record on the wire and one
    /// field per entry in Redis.
    ///
    /// ```
    /// # use tower_window::audit::AuditRecord;
    /// let text = "16:17000000000000004:acme5:alice3:api5:burst6:denied1:05:store2:n1";
    /// let record = AuditRecord::from_fields("acme", "1-0", [("r", text)]).expect("an entry");
    /// assert_eq!((record.subject.as_str(), record.quota.as_str()), ("alice", "burst"));
    /// assert_eq!(record.encode(), text);
    /// ```
    pub fn encode(&self) -> String {
        let mut out = String::new();
        self.fields().write(&mut out);
        out
    }

    /// The record's values, to write.
    pub(crate) fn fields(&self) -> Fields<'_> {
        Fields {
            at_micros: self.at_micros,
            tenant: Cow::Borrowed(&self.tenant),
            subject: Cow::Borrowed(&self.subject),
            policy: &self.policy,
            quota: &self.quota,
            outcome: self.outcome,
            remaining: self.remaining,
            source: self.source,
            node: &self.node,
        }
    }

    /// The record of a log entry's `fields` in `tenant`'s log (its `r`
    /// field, see [`encode`](Self::encode)), `None` if it has none or a
    /// malformed one (a foreign writer's entry).
    pub fn from_fields<'a>(
        tenant: &str,
        id: &str,
        fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Self> {
        let (_, text) = fields.into_iter().find(|(name, _)| *name == "r")?;
        let mut rest = text;
        let mut next = || {
            let (len, tail) = rest.split_once(':')?;
            let len: usize = len.parse().ok()?;
            let value = tail.get(..len)?;
            rest = &tail[len..];
            Some(value)
        };
        let mut record = Self::of_change(tenant, AdminAction::Put, next()?.parse().ok()?, "");
        record.id = id.to_owned();
        record.tenant = next()?.to_owned();
        record.subject = next()?.to_owned();
        record.policy = next()?.to_owned();
        record.quota = next()?.to_owned();
        record.outcome = next()?.parse().ok()?;
        record.remaining = next()?.parse().ok()?;
        record.source = parse_source(next()?)?;
        record.node = next()?.to_owned();
        rest.is_empty().then_some(record)
    }
}

/// A record's values, borrowed from a decision or an [`AuditRecord`]: the
/// one place its text is written.
pub(crate) struct Fields<'a> {
    at_micros: u64,
    tenant: Cow<'a, str>,
    subject: Cow<'a, str>,
    policy: &'a str,
    quota: &'a str,
    outcome: AuditOutcome,
    remaining: u32,
    source: DecisionSource,
    node: &'a str,
}

impl<'a> Fields<'a> {
    /// The record of `decision` for `key` under policy `policy`, with
    /// `outcome` (a shadow denial names its shadow quota).
    pub(crate) fn of_decision(
        key: &'a WindowKey,
        policy: &'a str,
        decision: &'a Decision,
        outcome: AuditOutcome,
        node: &'a str,
    ) -> Self {
        let quota = match outcome {
            AuditOutcome::ShadowDenied => decision.shadow_denials().next().map(|q| q.quota()),
            _ => None,
        }
        .unwrap_or_else(|| decision.quota());
        Self {
            at_micros: decision.timestamp_micros(),
            tenant: String::from_utf8_lossy(key.tenant()),
            subject: String::from_utf8_lossy(key.subject()),
            policy,
            quota: quota.name(),
            outcome,
            remaining: decision.remaining(),
            source: decision.source(),
            node,
        }
    }

    /// Appends the entry's text (see [`AuditRecord::encode`]) to `out`,
    /// without `fmt` and without allocating beyond `out` (a denial flood
    /// writes a record per request); returns where the tenant is in it.
    pub(crate) fn write(&self, out: &mut String) -> Range<usize> {
        let texts = [bounded(&self.subject), self.policy, self.quota];
        let (mut at, mut remaining) = (itoa::Buffer::new(), itoa::Buffer::new());
        value(out, &[at.format(self.at_micros)]);
        let tenant = value(out, &[&self.tenant]);
        for text in texts {
            value(out, &[text]);
        }
        value(out, &[self.outcome.as_str()]);
        value(out, &[remaining.format(self.remaining)]);
        let source: &[&str] = match &self.source {
            DecisionSource::Fallback(reason) => &["fallback(", reason.as_str(), ")"],
            other => &[other.as_str()],
        };
        value(out, source);
        value(out, &[self.node]);
        tenant
    }
}

/// Writes one value, the concatenation of `parts`, as `<length>:<text>`;
/// returns where its text is in `out`.
fn value(out: &mut String, parts: &[&str]) -> Range<usize> {
    let len = parts.iter().map(|p| p.len()).sum::<usize>();
    if len < 1_000 {
        // Nearly every value: its digits pushed one by one cost a fifth of
        // formatting the number and copying the digits (a denial flood
        // writes nine lengths per request).
        for unit in [100, 10] {
            if len >= unit {
                out.push(char::from(b'0' + (len / unit % 10) as u8));
            }
        }
        out.push(char::from(b'0' + (len % 10) as u8));
    } else {
        out.push_str(itoa::Buffer::new().format(len));
    }
    out.push(':');
    let start = out.len();
    for part in parts {
        out.push_str(part);
    }
    start..out.len()
}

/// The record as one JSON object (an exporter's line, an admin route's
/// item): `id`, `at_micros`, `tenant`, `subject`, `policy`, `quota`,
/// `outcome`, `remaining`, `source`, `node`.
#[cfg(feature = "serde")]
impl serde::Serialize for AuditRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = serializer.serialize_struct("AuditRecord", 10)?;
        out.serialize_field("id", &self.id)?;
        out.serialize_field("at_micros", &self.at_micros)?;
        out.serialize_field("tenant", &self.tenant)?;
        out.serialize_field("subject", &self.subject)?;
        out.serialize_field("policy", &self.policy)?;
        out.serialize_field("quota", &self.quota)?;
        out.serialize_field("outcome", self.outcome.as_str())?;
        out.serialize_field("remaining", &self.remaining)?;
        out.serialize_field("source", &self.source.to_string())?;
        out.serialize_field("node", &self.node)?;
        out.end()
    }
}

/// `subject` cut to at most [`MAX_SUBJECT_LEN`] bytes.
fn bounded(subject: &str) -> &str {
    let mut end = subject.len().min(MAX_SUBJECT_LEN);
    while !subject.is_char_boundary(end) {
        end -= 1;
    }
    &subject[..end]
}

/// A [`DecisionSource`] from its `Display` form (`store`, `local_cache`,
/// `lease`, `fallback(<reason>)`).
pub(crate) fn parse_source(text: &str) -> Option<DecisionSource> {
    Some(match text {
        "store" => DecisionSource::Store,
        "local_cache" => DecisionSource::LocalCache,
        "lease" => DecisionSource::Lease,
        _ => {
            let reason = text.strip_prefix("fallback(")?.strip_suffix(')')?;
            let reason = FallbackReason::ALL
                .into_iter()
                .find(|r| r.as_str() == reason)?;
            DecisionSource::Fallback(reason)
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::Quota;

    #[test]
    fn fields_read_back_as_written() {
        let quota: Quota = "1/1m".parse().unwrap();
        let decision = Decision::deny(quota.clone(), 0, std::time::Duration::from_secs(60), None)
            .with_source(DecisionSource::Fallback(FallbackReason::Timeout))
            .with_timestamp_micros(1_700_000_000_000_123);
        let key = WindowKey::new("acme", "é".repeat(200));
        let fields = Fields::of_decision(&key, "api", &decision, AuditOutcome::Denied, "n1");
        let mut text = "before".to_owned();
        let tenant = fields.write(&mut text);
        assert_eq!(&text[tenant], "acme");
        let text = text.split_off("before".len());
        let back = AuditRecord::from_fields("other", "1-0", [("x", "y"), ("r", &*text)]).unwrap();
        assert_eq!(back.subject.len(), 256, "cut at a character boundary");
        let record = AuditRecord {
            id: "1-0".into(),
            at_micros: 1_700_000_000_000_123,
            tenant: "acme".into(),
            subject: "é".repeat(128),
            policy: "api".into(),
            quota: quota.name().to_owned(),
            outcome: AuditOutcome::Denied,
            remaining: 0,
            source: DecisionSource::Fallback(FallbackReason::Timeout),
            node: "n1".into(),
        };
        assert_eq!(back, record);
        assert_eq!(record.encode(), text, "one text, either way");
        for bad in [
            "",
            "x",
            "3:ab",
            "99:",
            &text[..text.len() - 1],
            &format!("{text}1:x"),
        ] {
            assert!(
                AuditRecord::from_fields("acme", "1-0", [("r", bad)]).is_none(),
                "{bad}"
            );
        }
        // Text with the encoding's own characters reads back as it was.
        let mut odd = record.clone();
        odd.subject = "3:a:b\n\t\u{1f}é".to_owned();
        let odd_back = AuditRecord::from_fields("acme", "", [("r", &*odd.encode())]).unwrap();
        assert_eq!(odd_back.subject, odd.subject);
        #[cfg(feature = "serde")]
        {
            let json = serde_json::to_value(&back).unwrap();
            assert_eq!(json["source"], "fallback(timeout)");
            assert_eq!(json["at_micros"], 1_700_000_000_000_123_u64);
            assert_eq!(json["subject"].as_str().unwrap(), record.subject);
        }
    }

    #[test]
    fn outcome_names_round_trip() {
        for name in AuditOutcome::NAMES {
            assert_eq!(name.parse::<AuditOutcome>().unwrap().as_str(), name);
        }
        assert!("nope".parse::<AuditOutcome>().is_err());
        for source in ["store", "lease", "local_cache", "fallback(circuit_open)"] {
            assert_eq!(parse_source(source).unwrap().to_string(), source);
        }
        assert!(parse_source("fallback(x)").is_none());
    }
}
