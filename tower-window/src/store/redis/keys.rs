//! The Redis key layout: `<prefix>{<tenant>:<subject>}:<quota id>`.
//!
//! Every user-supplied part goes through [`encode_component`], which is
//! injective and never emits `{`, `}`, `:` or a leading `#` except for the
//! hashed form. So the parts can always be told apart again, the only hash
//! tag in a key is ours (all quotas of one subject share one cluster slot),
//! and no input can reach another tenant's namespace.

use sha2::{Digest, Sha256};

use crate::{Quota, WindowKey};

/// Escaped components longer than this are replaced by `#<sha256 hex>`.
pub(crate) const MAX_COMPONENT_LEN: usize = 128;

/// Suffix of the sliding log's companion key (running sum and sequence).
pub(crate) const META_SUFFIX: &[u8] = b":m";

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Whether `byte` is written as `%XX`.
fn needs_escape(byte: u8) -> bool {
    matches!(byte, b'%' | b'{' | b'}' | b':' | b'#') || byte <= b' ' || byte >= 0x7f
}

/// Where encoded key bytes go: a key being built, or a running CRC.
pub(crate) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// CRC-16/XMODEM (polynomial 0x1021, initial 0, no reflection), the hash
/// Redis Cluster takes of a key's hash tag.
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

fn escape_into(out: &mut impl Sink, bytes: &[u8], escape: impl Fn(u8) -> bool) {
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

/// Encodes one user-supplied part of a key.
///
/// Short values are percent-escaped (`%`, `{`, `}`, `:`, `#`, space, control
/// bytes and every byte ≥ 0x7f become `%XX`); values whose escaped form would
/// exceed [`MAX_COMPONENT_LEN`] bytes become `#` followed by the 64 hex digits
/// of their SHA-256. An escaped value never contains `#`, so the two forms
/// never meet.
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

/// The Redis key holding `key`'s window for `quota` under `prefix`:
/// `<prefix>{<tenant>:<subject>}:<quota id>`.
///
/// * Injective: distinct `(tenant, subject, quota)` triples under one prefix
///   never share a key. Each part is percent-escaped (`%`, `{`, `}`, `:`,
///   `#`, space, control bytes and non-ASCII bytes become `%XX`), or, when
///   its escaped form would be longer than 128 bytes, replaced by
///   `#<SHA-256 in hex>`.
/// * The braces around `<tenant>:<subject>` are the key's only braces, so
///   every quota of one subject lands in the same Redis Cluster hash slot
///   and no input can choose the slot.
/// * Bounded: at most `prefix.len() * 3 + 392` bytes, whatever the input.
///
/// The prefix is escaped too, except that it may contain `:` and `#`.
/// The sliding log also writes a companion key: this key followed by `:m`.
///
/// ```
/// use tower_window::{Quota, WindowKey};
/// use tower_window::store::redis_key;
///
/// let quota: Quota = "100/1m".parse()?;
/// let key = redis_key("rl:", &WindowKey::new("acme", "user:{42}"), &quota);
/// assert_eq!(key, b"rl:{acme:user%3A%7B42%7D}:default|1m|sliding-log".to_vec());
/// # Ok::<(), tower_window::QuotaError>(())
/// ```
pub fn redis_key(prefix: &str, key: &WindowKey, quota: &Quota) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 64);
    escape_into(&mut out, prefix.as_bytes(), |b| {
        b != b':' && b != b'#' && needs_escape(b)
    });
    out.push(b'{');
    encode_component(&mut out, key.tenant());
    out.push(b':');
    encode_component(&mut out, key.subject());
    out.extend_from_slice(b"}:");
    encode_component(&mut out, quota.state_id().as_bytes());
    out
}

/// The Redis Cluster hash slot of every key [`redis_key`] makes for `key`
/// (any prefix, any quota): CRC-16/XMODEM of the hash tag
/// `<tenant>:<subject>` (encoded), modulo 16384. Allocates nothing.
pub(crate) fn cluster_slot(key: &WindowKey) -> u16 {
    let mut crc = Crc16::default();
    encode_component(&mut crc, key.tenant());
    crc.put(b":");
    encode_component(&mut crc, key.subject());
    crc.value() % CLUSTER_SLOTS
}

/// The hash tag Redis Cluster hashes for `key`, as Redis defines it: the
/// bytes between the first `{` and the first `}` after it, if non-empty.
#[cfg(test)]
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    fn quota() -> Quota {
        "100/1m".parse().unwrap()
    }

    /// Decodes a key back into its parts; only possible because the encoding is injective.
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
        let key = redis_key("tw:", &WindowKey::new("t", "alice"), &quota());
        assert_eq!(key, b"tw:{t:alice}:default|1m|sliding-log");
        let q: Quota = "5000/1h sliding-counter(1m)".parse().unwrap();
        let key = redis_key("tw:", &WindowKey::new("t", "alice"), &q);
        assert_eq!(key, b"tw:{t:alice}:default|1h|sliding-counter(1m)");
    }

    #[test]
    fn hostile_values_are_escaped() {
        let key = redis_key(
            "a{b}:",
            &WindowKey::new(&b"x}:{y"[..], &b"\r\n\0\xff#%"[..]),
            &quota(),
        );
        assert_eq!(
            key,
            b"a%7Bb%7D:{x%7D%3A%7By:%0D%0A%00%FF%23%25}:default|1m|sliding-log".to_vec()
        );
        assert_eq!(hash_tag(&key), b"x%7D%3A%7By:%0D%0A%00%FF%23%25");
    }

    /// The slot Redis computes for a whole key (hash tag rule included).
    fn key_slot(key: &[u8]) -> u16 {
        let mut crc = Crc16::default();
        crc.put(hash_tag(key));
        crc.value() % CLUSTER_SLOTS
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
        assert_eq!(
            cluster_slot(&key),
            key_slot(&redis_key("rl:", &key, &quota()))
        );
    }

    #[test]
    fn long_values_are_hashed_and_bounded() {
        let big = vec![b'{'; 1 << 20];
        let key = redis_key("tw:", &WindowKey::new(big.clone(), big), &quota());
        assert!(key.len() <= 3 + 392, "{}", key.len());
        let (t, s, _) = split(3, &key);
        assert_eq!(t.len(), 65);
        assert_eq!(t[0], b'#');
        assert_eq!(t, s);
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

    fn quotas() -> impl Strategy<Value = Quota> {
        prop_oneof![
            Just("100/1m"),
            Just("100/1m fixed-window"),
            Just("10/s gcra(burst=20)"),
            Just("60/1m sliding-counter(1s)"),
        ]
        .prop_map(|q| q.parse().unwrap())
    }

    proptest! {
        #[test]
        fn injective_on_random_triples(
            a in (bytes(), bytes(), quotas()),
            b in (bytes(), bytes(), quotas()),
        ) {
            let ka = redis_key("p:", &WindowKey::new(a.0.clone(), a.1.clone()), &a.2);
            let kb = redis_key("p:", &WindowKey::new(b.0.clone(), b.1.clone()), &b.2);
            prop_assert_eq!(ka == kb, a == b);
        }

        #[test]
        fn shifted_separators_never_collide(t in bytes(), s in bytes()) {
            // Moving bytes between tenant and subject changes the key.
            let mut joined = t.clone();
            joined.extend_from_slice(&s);
            for cut in 0..=joined.len().min(16) {
                let (t2, s2) = joined.split_at(cut);
                let same = t2 == &t[..] && s2 == &s[..];
                let ka = redis_key("p:", &WindowKey::new(t.clone(), s.clone()), &quota());
                let kb = redis_key("p:", &WindowKey::new(t2.to_vec(), s2.to_vec()), &quota());
                prop_assert_eq!(ka == kb, same);
            }
        }

        #[test]
        fn hash_tag_is_exactly_ours(t in bytes(), s in bytes(), q in quotas()) {
            let prefix = "p{x}:";
            let key = redis_key(prefix, &WindowKey::new(t.clone(), s.clone()), &q);
            let mut tag: Vec<u8> = Vec::new();
            encode_component(&mut tag, &t);
            tag.push(b':');
            encode_component(&mut tag, &s);
            prop_assert_eq!(hash_tag(&key), &tag[..]);
            prop_assert_eq!(cluster_slot(&WindowKey::new(t.clone(), s.clone())), key_slot(&key));
            prop_assert_eq!(key.iter().filter(|&&b| b == b'{').count(), 1);
            prop_assert_eq!(key.iter().filter(|&&b| b == b'}').count(), 1);
            // Nothing that ends a line or a string in any protocol.
            prop_assert!(!key.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0 || b >= 0x80));
            prop_assert!(key.len() <= prefix.len() * 3 + 392);
            let (et, es, _) = split("p%7Bx%7D:".len(), &key);
            prop_assert_eq!(et.len() <= MAX_COMPONENT_LEN && es.len() <= MAX_COMPONENT_LEN, true);
        }
    }
}
