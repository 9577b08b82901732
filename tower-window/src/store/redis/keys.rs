//! The Redis key layout: see [`redis_key`]. The tenant form's tag starts
//! with `@`, which keeps it non-empty for an empty tenant and apart from
//! the subject form's.

use sha2::{Digest, Sha256};

use crate::{Policy, Quota, Scope, WindowKey};

/// Escaped components longer than this are replaced by `#<sha256 hex>`.
pub(crate) const MAX_COMPONENT_LEN: usize = 128;

/// Suffix of the sliding log's companion key.
pub(crate) const META_SUFFIX: &[u8] = b":m";

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Whether `byte` is written as `%XX`.
pub(crate) fn needs_escape(byte: u8) -> bool {
    matches!(byte, b'%' | b'{' | b'}' | b':' | b'#') || byte <= b' ' || byte >= 0x7f
}

/// Where encoded key bytes go: a key, or a running CRC.
pub(crate) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// CRC-16/XMODEM, Redis Cluster's hash of a key's hash tag.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Crc16(u16);

impl Crc16 {
    pub(crate) fn value(self) -> u16 {
        self.0
    }
}

impl Sink for Crc16 {
    fn put(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 ^= u16::from(byte) << 8;
            for _ in 0..8 {
                self.0 = if self.0 & 0x8000 != 0 {
                    (self.0 << 1) ^ 0x1021
                } else {
                    self.0 << 1
                };
            }
        }
    }
}

/// The number of Redis Cluster hash slots.
pub(crate) const CLUSTER_SLOTS: u16 = 16_384;

pub(crate) fn escape_into(out: &mut impl Sink, bytes: &[u8], escape: impl Fn(u8) -> bool) {
    for &byte in bytes {
        if escape(byte) {
            out.put(&[
                b'%',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 15)],
            ]);
        } else {
            out.put(&[byte]);
        }
    }
}

/// Encodes one user-supplied part of a key, as [`redis_key`] describes (an
/// escaped value never contains `#`, so the two forms never meet).
pub(crate) fn encode_component(out: &mut impl Sink, bytes: &[u8]) {
    let escaped_len: usize = bytes
        .iter()
        .map(|&b| if needs_escape(b) { 3 } else { 1 })
        .sum();
    if escaped_len <= MAX_COMPONENT_LEN {
        escape_into(out, bytes, needs_escape);
    } else {
        out.put(b"#");
        for byte in Sha256::digest(bytes) {
            out.put(&[HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]);
        }
    }
}

/// The Redis key holding `key`'s window for `quota` of `policy` under
/// `prefix`: `<prefix>{<tenant>:<subject>}:<quota>` when `policy` has no
/// tenant-scoped quota, else `<prefix>{@<tenant>}:<subject>:<quota>` for a
/// subject-scoped `quota` and `<prefix>{@<tenant>}:<quota>` for a
/// tenant-scoped one, where `<quota>` is the quota's
/// [state id](Quota::state_id) (`quota` should be one of `policy`'s; the
/// policy only picks the form).
///
/// * Injective: distinct `(tenant, subject, quota, scope, form)` under one
///   prefix never share a key. Each part is percent-escaped (`%`, `{`, `}`,
///   `:`, `#`, space, control bytes and non-ASCII bytes become `%XX`), or,
///   when its escaped form would be longer than 128 bytes, replaced by
///   `#<SHA-256 in hex>`.
/// * The braces are the key's only braces, so every key of one policy and
///   window key lands in one Redis Cluster hash slot and no input can
///   choose the slot.
/// * Bounded: at most `prefix.len() * 3 + 392` bytes, whatever the input.
///
/// The price of the tenant form: all of a tenant's windows live on one
/// slot (one primary), and adding a tenant-scoped quota to a tenant's
/// policy (or removing the last one) moves its subject windows to new
/// keys, which start empty.
///
/// The prefix is escaped too, except that it may contain `:` and `#`.
/// The sliding log also writes a companion key: this key followed by `:m`.
///
/// ```
/// use tower_window::{Policy, Quota, Scope, WindowKey};
/// use tower_window::store::redis_key;
///
/// let quota: Quota = "100/1m".parse()?;
/// let key = WindowKey::new("acme", "user:{42}");
/// let policy = Policy::from(quota.clone());
/// assert_eq!(
///     redis_key("rl:", &key, &policy, &quota),
///     b"rl:{acme:user%3A%7B42%7D}:default|1m|sliding-log".to_vec()
/// );
/// let org = "5000/1m".parse::<Quota>()?.named("org")?.scoped(Scope::Tenant);
/// let both = Policy::new("api", [quota.clone(), org.clone()])?;
/// assert_eq!(
///     redis_key("rl:", &key, &both, &quota),
///     b"rl:{@acme}:user%3A%7B42%7D:default|1m|sliding-log".to_vec()
/// );
/// assert_eq!(redis_key("rl:", &key, &both, &org), b"rl:{@acme}:org|1m|sliding-log|tenant".to_vec());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn redis_key(prefix: &str, key: &WindowKey, policy: &Policy, quota: &Quota) -> Vec<u8> {
    let tenant_form = policy.has_tenant_scope();
    let mut out = Vec::with_capacity(prefix.len() + 64);
    write_tagged(&mut out, prefix, key, tenant_form);
    out.push(b':');
    if tenant_form && quota.scope() == Scope::Subject {
        encode_component(&mut out, key.subject());
        out.push(b':');
    }
    encode_component(&mut out, quota.state_id().as_bytes());
    out
}

/// Appends `<prefix>{<tag>}`: the escaped prefix and [`write_tag`]'s tag
/// in braces, as [`redis_key`] starts.
pub(crate) fn write_tagged(out: &mut Vec<u8>, prefix: &str, key: &WindowKey, tenant_form: bool) {
    write_prefix(out, prefix);
    out.push(b'{');
    write_tag(out, key, tenant_form);
    out.push(b'}');
}

/// Writes the hash tag of `key`'s keys, without its braces.
pub(crate) fn write_tag(out: &mut impl Sink, key: &WindowKey, tenant_form: bool) {
    if tenant_form {
        out.put(b"@");
        encode_component(out, key.tenant());
    } else {
        encode_component(out, key.tenant());
        out.put(b":");
        encode_component(out, key.subject());
    }
}

/// The Redis Cluster hash slot of [`write_tag`]'s tag, without allocating.
pub(crate) fn tag_slot(key: &WindowKey, tenant_form: bool) -> u16 {
    let mut crc = Crc16::default();
    write_tag(&mut crc, key, tenant_form);
    crc.value() % CLUSTER_SLOTS
}

/// The hash tag Redis Cluster hashes for `key`, as Redis defines it: the
/// bytes between the first `{` and the first `}` after it, if non-empty.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The Redis Cluster hash slot of any key.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let mut crc = Crc16::default();
    crc.put(hash_tag(key));
    crc.value() % CLUSTER_SLOTS
}

/// `<prefix><suffix>`, the prefix escaped as [`redis_key`] escapes it.
pub(crate) fn prefixed_key(prefix: &str, suffix: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + suffix.len());
    write_prefix(&mut out, prefix);
    out.extend_from_slice(suffix);
    out
}

/// Appends the escaped key prefix (which may contain `:` and `#`).
pub(crate) fn write_prefix(out: &mut Vec<u8>, prefix: &str) {
    escape_into(out, prefix.as_bytes(), |b| {
        b != b':' && b != b'#' && needs_escape(b)
    });
}

/// The hash slot of every key [`redis_key`] makes for `key` and `policy`.
pub(crate) fn policy_slot(key: &WindowKey, policy: &Policy) -> u16 {
    tag_slot(key, policy.has_tenant_scope())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    fn quota() -> Quota {
        "100/1m".parse().unwrap()
    }

    fn single(quota: &Quota) -> Policy {
        Policy::from(quota.clone())
    }

    fn org() -> Quota {
        "5000/1m fixed-window"
            .parse::<Quota>()
            .unwrap()
            .named("org")
            .unwrap()
            .scoped(Scope::Tenant)
    }

    /// A policy of `quota` and a tenant-scoped quota (tenant form).
    fn with_org(quota: &Quota) -> Policy {
        let org = if quota.name() == "org" {
            org().named("zz-org").unwrap()
        } else {
            org()
        };
        Policy::new("p", [quota.clone(), org]).unwrap()
    }

    /// Decodes a subject-form key back into its parts; only possible
    /// because the encoding is injective.
    fn split(prefix_len: usize, key: &[u8]) -> (&[u8], &[u8], &[u8]) {
        let rest = &key[prefix_len..];
        assert_eq!(rest[0], b'{');
        let colon = rest.iter().position(|&b| b == b':').unwrap();
        let close = rest.iter().position(|&b| b == b'}').unwrap();
        assert!(colon < close);
        assert_eq!(rest[close + 1], b':');
        (&rest[1..colon], &rest[colon + 1..close], &rest[close + 2..])
    }

    #[test]
    fn readable_for_plain_values() {
        let q = quota();
        let key = redis_key("tw:", &WindowKey::new("t", "alice"), &single(&q), &q);
        assert_eq!(key, b"tw:{t:alice}:default|1m|sliding-log");
        let q: Quota = "5000/1h sliding-counter(1m)".parse().unwrap();
        let key = redis_key("tw:", &WindowKey::new("t", "alice"), &single(&q), &q);
        assert_eq!(key, b"tw:{t:alice}:default|1h|sliding-counter(1m)");
    }

    #[test]
    fn tenant_form_shares_the_tenant_slot() {
        let q = quota();
        let p = with_org(&q);
        let alice = WindowKey::new("t", "alice");
        let bob = WindowKey::new("t", "bob");
        assert_eq!(
            redis_key("tw:", &alice, &p, &q),
            b"tw:{@t}:alice:default|1m|sliding-log"
        );
        assert_eq!(
            redis_key("tw:", &alice, &p, &org()),
            b"tw:{@t}:org|1m|fixed-window|tenant"
        );
        // One window per tenant: the subject plays no part.
        assert_eq!(
            redis_key("tw:", &alice, &p, &org()),
            redis_key("tw:", &bob, &p, &org())
        );
        assert_eq!(policy_slot(&alice, &p), policy_slot(&bob, &p));
        assert_eq!(
            policy_slot(&alice, &p),
            key_slot(&redis_key("tw:", &alice, &p, &q))
        );
        // The subject form of the same quota is another key.
        assert_ne!(
            redis_key("tw:", &alice, &p, &q),
            redis_key("tw:", &alice, &single(&q), &q)
        );
    }

    #[test]
    fn hostile_values_are_escaped() {
        let q = quota();
        let key = redis_key(
            "a{b}:",
            &WindowKey::new(&b"x}:{y"[..], &b"\r\n\0\xff#%"[..]),
            &single(&q),
            &q,
        );
        assert_eq!(
            key,
            b"a%7Bb%7D:{x%7D%3A%7By:%0D%0A%00%FF%23%25}:default|1m|sliding-log".to_vec()
        );
        assert_eq!(hash_tag(&key), b"x%7D%3A%7By:%0D%0A%00%FF%23%25");
    }

    #[test]
    fn crc16_matches_redis_cluster_keyslot() {
        // The CRC-16/XMODEM check value, and `CLUSTER KEYSLOT` answers from
        // the Redis documentation (tests/tests/redis_faults.rs compares
        // against a live cluster).
        let mut crc = Crc16::default();
        crc.put(b"123456789");
        assert_eq!(crc.value(), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        let key = WindowKey::new("acme", "user:{42}");
        let q = quota();
        assert_eq!(
            policy_slot(&key, &single(&q)),
            key_slot(&redis_key("rl:", &key, &single(&q), &q))
        );
    }

    #[test]
    fn long_values_are_hashed_and_bounded() {
        let big = vec![b'{'; 1 << 20];
        let q = quota();
        let wk = WindowKey::new(big.clone(), big);
        let key = redis_key("tw:", &wk, &single(&q), &q);
        assert!(key.len() <= 3 + 392, "{}", key.len());
        let (t, s, _) = split(3, &key);
        assert_eq!(t.len(), 65);
        assert_eq!(t[0], b'#');
        assert_eq!(t, s);
        let key = redis_key("tw:", &wk, &with_org(&q), &q);
        assert!(key.len() <= 3 + 392, "{}", key.len());
        // The longest value that is still escaped, and the shortest that is hashed.
        let mut out: Vec<u8> = Vec::new();
        encode_component(&mut out, &[b'a'; MAX_COMPONENT_LEN]);
        assert_eq!(out.len(), MAX_COMPONENT_LEN);
        out.clear();
        encode_component(&mut out, &[b'a'; MAX_COMPONENT_LEN + 1]);
        assert_eq!(out.len(), 65);
        assert_eq!(out[0], b'#');
    }

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..8),
            proptest::collection::vec(
                prop_oneof![
                    Just(b'{'),
                    Just(b'}'),
                    Just(b':'),
                    Just(b'%'),
                    Just(b'#'),
                    any::<u8>()
                ],
                0..200
            ),
        ]
    }

    /// Quotas of both scopes (the tenant ones under names that the subject
    /// ones also use).
    fn quotas() -> impl Strategy<Value = Quota> {
        (
            prop_oneof![
                Just("100/1m"),
                Just("100/1m fixed-window"),
                Just("10/s gcra(burst=20)"),
                Just("60/1m sliding-counter(1s)"),
            ],
            prop_oneof![Just("default"), Just("org")],
            any::<bool>(),
        )
            .prop_map(|(q, name, tenant)| {
                let q = q.parse::<Quota>().unwrap().named(name).unwrap();
                if tenant {
                    q.scoped(Scope::Tenant)
                } else {
                    q
                }
            })
    }

    /// The policy a quota is checked under: its own (subject form unless
    /// it is tenant-scoped), or one with a tenant-scoped quota beside it
    /// (tenant form).
    fn policy_for(quota: &Quota, tenant_capped: bool) -> Policy {
        if tenant_capped {
            with_org(quota)
        } else {
            single(quota)
        }
    }

    /// Which window a (tenant, subject, quota, form) names: tenant-scoped
    /// quotas ignore the subject.
    type Case = (Vec<u8>, Vec<u8>, Quota, bool);

    fn identity(case: &Case) -> (Vec<u8>, Option<Vec<u8>>, String, bool) {
        let (t, s, q, form) = case;
        let form = *form || q.scope() == Scope::Tenant;
        let subject = (q.scope() == Scope::Subject).then(|| s.clone());
        (t.clone(), subject, q.state_id().to_owned(), form)
    }

    fn key_of(case: &Case) -> Vec<u8> {
        let (t, s, q, form) = case;
        redis_key(
            "p:",
            &WindowKey::new(t.clone(), s.clone()),
            &policy_for(q, *form),
            q,
        )
    }

    proptest! {
        #[test]
        fn injective_on_random_cases(
            a in (bytes(), bytes(), quotas(), any::<bool>()),
            b in (bytes(), bytes(), quotas(), any::<bool>()),
        ) {
            let (ka, kb) = (key_of(&a), key_of(&b));
            prop_assert_eq!(ka == kb, identity(&a) == identity(&b));
            // No key is another's sliding-log companion.
            let mut companion = ka.clone();
            companion.extend_from_slice(META_SUFFIX);
            prop_assert_ne!(companion, kb);
        }

        #[test]
        fn shifted_separators_never_collide(t in bytes(), s in bytes(), form in any::<bool>()) {
            // Moving bytes between tenant and subject changes the key.
            let mut joined = t.clone();
            joined.extend_from_slice(&s);
            let q = quota();
            for cut in 0..=joined.len().min(16) {
                let (t2, s2) = joined.split_at(cut);
                let same = t2 == &t[..] && s2 == &s[..];
                let ka = key_of(&(t.clone(), s.clone(), q.clone(), form));
                let kb = key_of(&(t2.to_vec(), s2.to_vec(), q.clone(), form));
                prop_assert_eq!(ka == kb, same);
            }
        }

        #[test]
        fn hash_tag_is_exactly_ours(t in bytes(), s in bytes(), q in quotas(), form in any::<bool>()) {
            let prefix = "p{x}:";
            let wk = WindowKey::new(t.clone(), s.clone());
            let policy = policy_for(&q, form);
            let key = redis_key(prefix, &wk, &policy, &q);
            let mut tag: Vec<u8> = Vec::new();
            if policy.has_tenant_scope() {
                tag.push(b'@');
                encode_component(&mut tag, &t);
            } else {
                encode_component(&mut tag, &t);
                tag.push(b':');
                encode_component(&mut tag, &s);
            }
            prop_assert_eq!(hash_tag(&key), &tag[..]);
            prop_assert_eq!(policy_slot(&wk, &policy), key_slot(&key));
            // Every quota of the policy lands in that slot.
            for other in policy.quotas() {
                prop_assert_eq!(key_slot(&redis_key(prefix, &wk, &policy, other)), key_slot(&key));
            }
            prop_assert_eq!(key.iter().filter(|&&b| b == b'{').count(), 1);
            prop_assert_eq!(key.iter().filter(|&&b| b == b'}').count(), 1);
            // Nothing that ends a line or a string in any protocol.
            prop_assert!(!key.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0 || b >= 0x80));
            prop_assert!(key.len() <= prefix.len() * 3 + 392);
            if !policy.has_tenant_scope() {
                let (et, es, _) = split("p%7Bx%7D:".len(), &key);
                prop_assert_eq!(et.len() <= MAX_COMPONENT_LEN && es.len() <= MAX_COMPONENT_LEN, true);
            }
        }
    }
}
