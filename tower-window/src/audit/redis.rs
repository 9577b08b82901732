//! [`audit::Backend`] for [`RedisStore`]: one stream per tenant.
//!
//! A tenant's log is `<prefix>{@<tenant>}:#audit` (the tenant's hash tag:
//! its records share a slot; tenants spread over the cluster), written by
//! `append.lua` (`XADD … MAXLEN ~`, `XTRIM … MINID ~` on Redis's clock,
//! `PEXPIRE`; an entry's one field `r` is [`AuditRecord::encode`]'s
//! text), which applies a node's batch once by keeping the number of
//! its last batch in `<prefix>{@<tenant>}:#audit:node:<node>`. Read with
//! `XREVRANGE`, a chunk at a time.

use std::sync::LazyLock;

use redis::Value;

use super::query::EntryId;
use crate::audit::{self, AuditBatch, AuditPage, AuditQuery, AuditRecord};
use crate::store::redis::call::Call;
use crate::store::redis::keys::{encode_component, tag_slot, write_prefix, write_tag};
use crate::store::redis::script::LuaScript;
use crate::store::redis::RedisStore;
use crate::store::{Guard, Op, StoreError};
use crate::WindowKey;

static APPEND: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("", include_str!("append.lua")));

/// Entries read per `XREVRANGE`.
const CHUNK: usize = 500;

/// The key prefix as keys carry it (escaped).
fn prefixed(prefix: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len());
    write_prefix(&mut out, prefix);
    out
}

/// `<prefix>{@<tenant>}:#audit`.
pub(crate) fn stream_key(prefix: &str, tenant: &str) -> Vec<u8> {
    let mut out = prefixed(prefix);
    out.push(b'{');
    write_tag(&mut out, &WindowKey::new(tenant.to_owned(), ""), true);
    out.extend_from_slice(b"}:#audit");
    out
}

impl RedisStore {
    /// The stream holding `tenant`'s audit log (for an exporter).
    pub fn audit_stream(&self, tenant: &str) -> Vec<u8> {
        stream_key(&self.prefix, tenant)
    }

    /// A `SCAN … MATCH` pattern of every tenant's audit stream.
    pub fn audit_stream_pattern(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for &byte in &prefixed(&self.prefix) {
            if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
                out.push(b'\\');
            }
            out.push(byte);
        }
        out.extend_from_slice(b"{@*}:#audit");
        out
    }

    async fn append_audit(&self, batch: &AuditBatch) -> Result<(), StoreError> {
        let stream = stream_key(&self.prefix, &batch.tenant);
        let mut mark = stream.clone();
        mark.extend_from_slice(b":node:");
        encode_component(&mut mark, batch.node.as_bytes());
        let mut call = APPEND.with_capacity(batch.len() + 3, batch.text.len() + 60);
        call.key(stream)
            .key(mark)
            .arg(batch.seq)
            .arg(batch.retention.max_len)
            .arg(u64::try_from(batch.retention.max_age.as_millis()).unwrap_or(u64::MAX));
        for record in batch.records() {
            call.arg(record);
        }
        let _added: u64 = self.call(Call::Script(&call)).await?;
        Ok(())
    }

    async fn query_audit(&self, query: &AuditQuery) -> Result<AuditPage, StoreError> {
        let stream = stream_key(&self.prefix, &query.tenant);
        let mut end = match query.before.as_deref() {
            None => Some("+".to_owned()),
            Some(cursor) => EntryId::parse(cursor)
                .ok_or_else(|| StoreError::invalid("a malformed cursor"))?
                .previous()
                .map(|id| id.to_string()),
        };
        let start = query
            .since_micros
            .map_or("-".to_owned(), |t| format!("{}-0", t / 1_000));
        let (mut page, mut scanned) = (AuditPage::default(), 0);
        while let Some(from) = end.take() {
            let mut cmd = redis::cmd("XREVRANGE");
            cmd.arg(&stream)
                .arg(&from)
                .arg(&start)
                .arg("COUNT")
                .arg(CHUNK);
            let reply: Value = self.call(Call::Cmd(&cmd)).await?;
            let entries = entries(&query.tenant, reply)?;
            let full = entries.len() == CHUNK;
            for (id, record) in entries {
                if page.records.len() == query.limit || scanned == AuditQuery::MAX_SCAN {
                    return Ok(page);
                }
                scanned += 1;
                page.next = Some(id.to_string());
                if record.as_ref().is_some_and(|r| query.matches(r)) {
                    page.records.extend(record);
                }
                end = full.then(|| id.previous().map(|p| p.to_string())).flatten();
            }
        }
        page.next = None;
        Ok(page)
    }
}

/// The entries of an `XREVRANGE` reply; a foreign entry reads as `None`.
fn entries(tenant: &str, reply: Value) -> Result<Vec<(EntryId, Option<AuditRecord>)>, StoreError> {
    let malformed = || StoreError::protocol("a malformed XREVRANGE reply");
    let Value::Array(items) = reply else {
        return Err(malformed());
    };
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().map(str::to_owned),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    items
        .iter()
        .map(|item| {
            let Value::Array(parts) = item else {
                return Err(malformed());
            };
            let [id, Value::Array(fields)] = &parts[..] else {
                return Err(malformed());
            };
            let id_text = text(id).ok_or_else(malformed)?;
            let id = EntryId::parse(&id_text).ok_or_else(malformed)?;
            let fields: Vec<String> = fields.iter().map(|f| text(f).unwrap_or_default()).collect();
            let pairs = fields
                .chunks_exact(2)
                .map(|p| (p[0].as_str(), p[1].as_str()));
            Ok((id, AuditRecord::from_fields(tenant, &id_text, pairs)))
        })
        .collect()
}

impl audit::Backend for RedisStore {
    fn append<'a>(&'a self, guard: &mut Guard<'a>, batch: &'a AuditBatch) -> Op<'a, ()> {
        guard.run(move || self.append_audit(batch))
    }

    fn query<'a>(&'a self, guard: &mut Guard<'a>, query: &'a AuditQuery) -> Op<'a, AuditPage> {
        guard.run(move || self.query_audit(query))
    }

    fn failure_domain(&self, tenant: &str) -> Option<u16> {
        self.slot_domain(tag_slot(&WindowKey::new(tenant.to_owned(), ""), true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_log_is_tagged_by_the_tenant() {
        assert_eq!(
            stream_key("tw:", "ac{me}"),
            b"tw:{@ac%7Bme%7D}:#audit".to_vec()
        );
    }
}
