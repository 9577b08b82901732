//! A quota's identities: its name, its id (name and definition) and its
//! state id (what a store keys its windows by).

use std::fmt::Write as _;
use std::sync::Arc;

use super::parse::FormatDuration;
use super::{Quota, QuotaError, Scope};
use crate::Algorithm;

impl Quota {
    /// A stable identifier of this quota's definition and name
    /// (`"<name>|<definition>"`), used to keep the state of different quotas
    /// apart in a store.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// The same identifier as a cheaply cloned shared string.
    pub fn shared_id(&self) -> Arc<str> {
        Arc::clone(&self.0.id)
    }

    /// The identity of this quota's state in a store:
    /// `"<name>|<window>|<shape>"` (plus `|tenant` when tenant-scoped),
    /// where the shape is the algorithm with its granularity. The limit and
    /// the GCRA burst are not part of it, so a rolling change from `100/1m`
    /// to `200/1m` keeps every window (and `remaining` counts on from what
    /// was used); changing the name, window, algorithm, granularity or
    /// scope starts fresh windows.
    ///
    /// ```
    /// use tower_window::Quota;
    ///
    /// let old: Quota = "100/1m".parse()?;
    /// let new: Quota = "200/1m".parse()?;
    /// assert_eq!(old.state_id(), new.state_id());
    /// assert_ne!(old.state_id(), "100/1m fixed-window".parse::<Quota>()?.state_id());
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn state_id(&self) -> &str {
        &self.0.state_id
    }

    /// [`state_id`](Self::state_id)'s hash, computed once.
    pub(crate) fn state_id_hash(&self) -> u64 {
        self.0.state_id_hash
    }

    /// The state id as a cheaply cloned shared string.
    pub(crate) fn shared_state_id(&self) -> &Arc<str> {
        &self.0.state_id
    }

    /// Computes both ids under `name` from the quota's values.
    pub(super) fn set_ids(&mut self, name: &str) {
        let scope = match self.0.scope {
            Scope::Subject => "",
            Scope::Tenant => "|tenant",
        };
        let shape = match self.0.algorithm {
            // The burst is GCRA's other limit: it may change like the limit.
            Algorithm::Gcra => "gcra".to_owned(),
            other => other.to_string(),
        };
        // The generation is part of both ids (a reset tenant's windows are
        // new keys everywhere); the shadow flag only of the id (switching a
        // quota from shadow to enforced keeps its windows).
        let generation = match self.0.generation {
            0 => String::new(),
            g => format!("|g{g}"),
        };
        let shadow = if self.0.shadow { "|shadow" } else { "" };
        // The instance goes last in the id, so nothing after it needs
        // telling apart from it, and in the name's place in the state id,
        // so the window is the instance's whatever the name (`i:` cannot
        // start a name, which holds no `:`). Escaped, it holds no `|`
        // (ids) or `,` (policy ids) of its own.
        let instance = self.0.instance.as_deref().map(|instance| {
            let mut text = String::with_capacity(instance.len() + 2);
            text.push_str("i:");
            for byte in instance.bytes() {
                if matches!(byte, b'%' | b'|' | b',' | b':') || !(b' '..0x7f).contains(&byte) {
                    let _ = write!(text, "%{byte:02X}");
                } else {
                    text.push(char::from(byte));
                }
            }
            text
        });
        let id = Arc::from(match &instance {
            Some(instance) => format!("{name}|{self}{scope}{generation}{shadow}|{instance}"),
            None => format!("{name}|{self}{scope}{generation}{shadow}"),
        });
        let state_id = Arc::from(format!(
            "{}|{}|{shape}{scope}{generation}",
            instance.as_deref().unwrap_or(name),
            FormatDuration(self.window())
        ));
        let data = Arc::make_mut(&mut self.0);
        data.name_len = name.len();
        data.state_id_hash = crate::key::state_key::id_hash(&state_id);
        data.id = id;
        data.state_id = state_id;
    }
}

pub(super) fn validate_name(name: &str) -> Result<(), QuotaError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(QuotaError::InvalidName(name.chars().take(80).collect()))
    }
}
